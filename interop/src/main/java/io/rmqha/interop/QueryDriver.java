package io.rmqha.interop;

import java.util.ArrayList;
import java.util.List;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.impl.MQAdminImpl;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * Query by key and by id with the remoting client's own admin calls (what the producer's
 * {@code queryMessage} / {@code viewMessage} and {@code mqadmin queryMsgByKey/ById} use):
 * sends COUNT numbered messages (as {@link ProducerDriver}), then for each looks it up
 * three ways, retrying until the deadline (the brokers index up to the confirmed offset):
 * QUERY_MESSAGE by key, VIEW_MESSAGE_BY_ID by the offset id, QUERY_MESSAGE by the unique key.
 *
 * <pre>
 *   QueryDriver TOPIC RUN COUNT
 * </pre>
 */
public final class QueryDriver {
    private QueryDriver() {
    }

    public static void main(String[] args) throws Exception {
        String topic = args[0];
        String run = args[1];
        int count = Integer.parseInt(args[2]);
        DefaultMQProducer producer = Connect.producer(run);
        producer.start();
        long begin = System.currentTimeMillis() - 60_000;
        List<SendResult> sent = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            SendResult r = producer.send(ProducerDriver.numbered(topic, run, i));
            ProducerDriver.emitResult(i, r);
            sent.add(r);
        }
        MQAdminImpl admin = producer.getDefaultMQProducerImpl().getMqClientFactory().getMQAdminImpl();
        long deadline = System.currentTimeMillis() + 20_000;
        for (int i = 0; i < count; i++) {
            SendResult r = sent.get(i);
            String key = "key-" + run + "-" + i;
            MessageExt byKey = null;
            MessageExt byOffsetId = null;
            MessageExt byUniqKey = null;
            String lastError = null;
            while (System.currentTimeMillis() < deadline && (byKey == null || byOffsetId == null || byUniqKey == null)) {
                try {
                    if (byKey == null) {
                        QueryResult q = admin.queryMessage(topic, key, 32, begin, System.currentTimeMillis() + 60_000);
                        byKey = q.getMessageList().stream().filter(m -> key.equals(m.getKeys())).findFirst().orElse(null);
                    }
                    if (byOffsetId == null) {
                        byOffsetId = admin.viewMessage(topic, r.getOffsetMsgId());
                    }
                    if (byUniqKey == null) {
                        byUniqKey = admin.queryMessageByUniqKey(topic, r.getMsgId());
                    }
                } catch (Exception e) {
                    lastError = String.valueOf(e);
                    Thread.sleep(200);
                }
            }
            Out.emit("i", i, "key", key, "msgId", r.getMsgId(), "offsetMsgId", r.getOffsetMsgId(),
                "byKey", describe(byKey), "byOffsetId", describe(byOffsetId), "byUniqKey", describe(byUniqKey),
                "lastError", lastError);
        }
        producer.shutdown();
        Out.emit("done", true);
        System.exit(0);
    }

    static Object describe(MessageExt m) {
        if (m == null) {
            return null;
        }
        return java.util.Map.of("msgId", m.getMsgId(), "keys", String.valueOf(m.getKeys()),
            "body", new String(m.getBody(), java.nio.charset.StandardCharsets.UTF_8),
            "queueId", m.getQueueId(), "queueOffset", m.getQueueOffset(), "topic", m.getTopic(),
            "seq", String.valueOf(m.getUserProperty("seq")));
    }
}
