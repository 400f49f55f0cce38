package io.rmqha.interop;

import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.netty.TlsSystemConfig;

/**
 * What every consumer driver shares: the name server ({@code INTEROP_NAMESRV}), the ACL hook
 * when the test passes an account ({@code INTEROP_ACCESS_KEY} / {@code INTEROP_SECRET_KEY},
 * so keys stay off the command line), and a message as one JSON object.
 *
 * TLS is the client's own business: RocketMQ's {@code TlsSystemConfig} reads the
 * {@code tls.*} system properties the test puts on the JVM's command line.
 */
final class Clients {
    static final String NAMESRV_ENV = "INTEROP_NAMESRV";
    static final String ACCESS_KEY_ENV = "INTEROP_ACCESS_KEY";
    static final String SECRET_KEY_ENV = "INTEROP_SECRET_KEY";

    private Clients() {
    }

    /** Client log files go under the test's directory when it names one, not ~/logs. */
    static void logsUnder(DriverArgs args) {
        String dir = args.or("log-dir", null);
        if (dir != null) {
            System.setProperty("rocketmq.log.root", dir);
            System.setProperty("rocketmq.client.localOffsetStoreDir", dir + "/offsets");
        }
    }

    static RPCHook rpcHook() {
        String ak = System.getenv(ACCESS_KEY_ENV);
        String sk = System.getenv(SECRET_KEY_ENV);
        if (ak == null || ak.isEmpty()) {
            return null;
        }
        return new AclClientRPCHook(new SessionCredentials(ak, sk));
    }

    static void configure(ClientConfig config, DriverArgs args, String instance) {
        String namesrv = System.getenv(NAMESRV_ENV);
        if (namesrv == null || namesrv.isEmpty()) {
            throw new IllegalStateException(NAMESRV_ENV + " is not set: run the driver from tests/interop");
        }
        config.setNamesrvAddr(namesrv);
        config.setUseTLS(TlsSystemConfig.tlsEnable);
        config.setInstanceName(instance + "-" + ProcessHandle.current().pid());
        long poll = args.longOr("poll-namesrv-ms", -1);
        if (poll > 0) {
            config.setPollNameServerInterval((int) poll);
        }
    }

    static String queueName(MessageQueue mq) {
        return mq.getBrokerName() + "/" + mq.getTopic() + "/" + mq.getQueueId();
    }

    static Map<String, Object> message(MessageExt msg) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("event", "msg");
        out.put("topic", msg.getTopic());
        out.put("queueId", msg.getQueueId());
        out.put("queueOffset", msg.getQueueOffset());
        out.put("msgId", msg.getMsgId());
        out.put("offsetMsgId", msg instanceof org.apache.rocketmq.common.message.MessageClientExt
            ? ((org.apache.rocketmq.common.message.MessageClientExt) msg).getOffsetMsgId() : null);
        out.put("brokerName", msg.getBrokerName());
        out.put("body", new String(msg.getBody(), java.nio.charset.StandardCharsets.UTF_8));
        out.put("tags", msg.getTags());
        out.put("keys", msg.getKeys());
        out.put("reconsumeTimes", msg.getReconsumeTimes());
        out.put("retryTopic", msg.getProperty("RETRY_TOPIC"));
        return out;
    }
}
