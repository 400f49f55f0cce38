package io.rmqha.interop;

import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * What every consumer driver shares beyond {@link Connect} (name server, ACL hook, TLS,
 * timeouts): the name-server poll and rebalance intervals a test asks for, where the client
 * keeps its local offsets, and a message as one JSON line ({@link Out}).
 */
final class Clients {
    private Clients() {
    }

    /**
     * System properties the client reads once, when its classes load, so before any client
     * object exists: broadcasting consumers' local offsets under the test's directory (not
     * ~/.rocketmq_offsets), and the rebalance interval a test asks for (20 s by default).
     */
    static void systemProperties(DriverArgs args) {
        String dir = args.or("log-dir", null);
        if (dir != null) {
            System.setProperty("rocketmq.client.localOffsetStoreDir", dir + "/offsets");
        }
        long rebalance = args.longOr("rebalance-ms", -1);
        if (rebalance > 0) {
            System.setProperty("rocketmq.client.rebalance.waitInterval", String.valueOf(rebalance));
        }
    }

    static <T extends ClientConfig> T configure(T config, DriverArgs args) {
        Connect.configure(config);
        long poll = args.longOr("poll-namesrv-ms", -1);
        if (poll > 0) {
            config.setPollNameServerInterval((int) poll);
        }
        return config;
    }

    static String queueName(MessageQueue mq) {
        return mq.getBrokerName() + "/" + mq.getTopic() + "/" + mq.getQueueId();
    }

    /** Print a map as one JSON line (keys in insertion order). */
    static void emit(Map<String, Object> event) {
        Object[] pairs = new Object[event.size() * 2];
        int i = 0;
        for (Map.Entry<String, Object> entry : event.entrySet()) {
            pairs[i++] = entry.getKey();
            pairs[i++] = entry.getValue();
        }
        Out.emit(pairs);
    }

    static Map<String, Object> message(MessageExt msg) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("event", "msg");
        out.put("topic", msg.getTopic());
        out.put("queueId", msg.getQueueId());
        out.put("queueOffset", msg.getQueueOffset());
        out.put("msgId", msg.getMsgId());
        out.put("offsetMsgId", msg instanceof MessageClientExt ? ((MessageClientExt) msg).getOffsetMsgId() : null);
        out.put("brokerName", msg.getBrokerName());
        out.put("body", new String(msg.getBody(), StandardCharsets.UTF_8));
        out.put("tags", msg.getTags());
        out.put("keys", msg.getKeys());
        out.put("reconsumeTimes", msg.getReconsumeTimes());
        out.put("retryTopic", msg.getProperty("RETRY_TOPIC"));
        return out;
    }
}
