package io.rmqha.interop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * RocketMQ's remoting {@link DefaultMQProducer} against rmqha: one sub-command per way of
 * sending.  Every message is numbered {@code i}; its body is {@code body-RUN-i}, its key
 * {@code key-RUN-i}, its tag {@code t(i%3)} and its user property {@code seq=i}.  What the
 * client was told is printed, one JSON object a message (index, status, ids, queue,
 * offset), so the Python test can read the topic back from the rmqha side and compare.
 *
 * <pre>
 *   ProducerDriver sync    TOPIC RUN COUNT
 *   ProducerDriver async   TOPIC RUN COUNT
 *   ProducerDriver oneway  TOPIC RUN COUNT
 *   ProducerDriver batch   TOPIC RUN COUNT SIZE
 *   ProducerDriver orderly TOPIC RUN KEYS PER_KEY
 *   ProducerDriver delay   TOPIC RUN COUNT LEVEL
 *   ProducerDriver timer   TOPIC RUN COUNT DELAY_MS
 *   ProducerDriver trace   TOPIC RUN COUNT
 *   ProducerDriver failover TOPIC RUN COUNT
 * </pre>
 * RUN also names the producer group.  Several commands separated by {@code --} run one
 * after the other in one JVM (a JVM's start costs seconds on a busy machine); every line
 * then carries its command as {@code "cmd"}.  Transactions: {@link TransactionDriver};
 * queries: {@link QueryDriver}.
 */
public final class ProducerDriver {
    private ProducerDriver() {
    }

    public static void main(String[] args) throws Exception {
        List<String> current = new ArrayList<>();
        for (String arg : args) {
            if (arg.equals("--")) {
                runOne(current.toArray(new String[0]));
                current.clear();
            } else {
                current.add(arg);
            }
        }
        runOne(current.toArray(new String[0]));
        Out.step(null);
        Out.emit("done", true);
        // The client's non-daemon threads may outlive shutdown(): the driver is done.
        System.exit(0);
    }

    static void runOne(String[] args) throws Exception {
        if (args.length < 4) {
            throw new IllegalArgumentException("usage: ProducerDriver COMMAND TOPIC RUN N [ARG] [-- ...]");
        }
        String command = args[0];
        Out.step(command);
        String topic = args[1];
        String run = args[2];
        int n = Integer.parseInt(args[3]);
        switch (command) {
            case "sync" -> sync(topic, run, n);
            case "async" -> async(topic, run, n);
            case "oneway" -> oneway(topic, run, n);
            case "batch" -> batch(topic, run, n, Integer.parseInt(args[4]));
            case "orderly" -> orderly(topic, run, n, Integer.parseInt(args[4]));
            case "delay" -> delay(topic, run, n, Integer.parseInt(args[4]));
            case "timer" -> timer(topic, run, n, Long.parseLong(args[4]));
            case "trace" -> trace(topic, run, n);
            case "failover" -> failover(topic, run, n);
            default -> throw new IllegalArgumentException("unknown command " + command);
        }
    }

    static Message numbered(String topic, String run, int i) {
        Message msg = new Message(topic, "t" + (i % 3), "key-" + run + "-" + i,
            ("body-" + run + "-" + i).getBytes(StandardCharsets.UTF_8));
        msg.putUserProperty("seq", Integer.toString(i));
        return msg;
    }

    static void emitResult(int i, SendResult r, Object... extra) {
        Object[] base = {"i", i, "status", r.getSendStatus().name(), "msgId", r.getMsgId(),
            "offsetMsgId", r.getOffsetMsgId(), "queueId", r.getMessageQueue().getQueueId(),
            "queueOffset", r.getQueueOffset(), "broker", r.getMessageQueue().getBrokerName()};
        Object[] all = new Object[base.length + extra.length];
        System.arraycopy(base, 0, all, 0, base.length);
        System.arraycopy(extra, 0, all, base.length, extra.length);
        Out.emit(all);
    }

    /** A started producer of group RUN that fetched TOPIC's route while starting (so the
     * first sends, async ones too, do not all race to look it up). */
    static DefaultMQProducer started(String topic, String run) throws Exception {
        DefaultMQProducer producer = Connect.producer(run);
        producer.setTopics(List.of(topic));
        producer.start();
        return producer;
    }

    static void sync(String topic, String run, int count) throws Exception {
        DefaultMQProducer producer = started(topic, run);
        try {
            for (int i = 0; i < count; i++) {
                emitResult(i, producer.send(numbered(topic, run, i)));
            }
        } finally {
            producer.shutdown();
        }
    }

    static void async(String topic, String run, int count) throws Exception {
        DefaultMQProducer producer = started(topic, run);
        CountDownLatch left = new CountDownLatch(count);
        try {
            for (int i = 0; i < count; i++) {
                final int index = i;
                producer.send(numbered(topic, run, i), new SendCallback() {
                    @Override
                    public void onSuccess(SendResult r) {
                        emitResult(index, r);
                        left.countDown();
                    }

                    @Override
                    public void onException(Throwable e) {
                        Out.emit("i", index, "error", String.valueOf(e));
                        left.countDown();
                    }
                });
            }
            if (!left.await(60, TimeUnit.SECONDS)) {
                Out.emit("error", "callbacks missing", "left", left.getCount());
            }
        } finally {
            producer.shutdown();
        }
    }

    static void oneway(String topic, String run, int count) throws Exception {
        DefaultMQProducer producer = started(topic, run);
        try {
            for (int i = 0; i < count; i++) {
                producer.sendOneway(numbered(topic, run, i));
                Out.emit("i", i, "sent", true);
            }
        } finally {
            producer.shutdown();
        }
    }

    /** One line per message of each batch: the batch's ids split, offsets from its first. */
    static void batch(String topic, String run, int count, int size) throws Exception {
        DefaultMQProducer producer = started(topic, run);
        try {
            for (int start = 0; start < count; start += size) {
                List<Message> batch = new ArrayList<>();
                for (int i = start; i < Math.min(count, start + size); i++) {
                    batch.add(numbered(topic, run, i));
                }
                SendResult r = producer.send(batch);
                String[] ids = r.getMsgId().split(",");
                for (int k = 0; k < batch.size(); k++) {
                    Out.emit("i", start + k, "status", r.getSendStatus().name(),
                        "msgId", k < ids.length ? ids[k] : null, "batchIds", ids.length,
                        "queueId", r.getMessageQueue().getQueueId(), "queueOffset", r.getQueueOffset() + k,
                        "broker", r.getMessageQueue().getBrokerName());
                }
            }
        } finally {
            producer.shutdown();
        }
    }

    /** KEYS order keys, PER_KEY messages each, interleaved; the selector picks the queue by key. */
    static void orderly(String topic, String run, int keys, int perKey) throws Exception {
        DefaultMQProducer producer = started(topic, run);
        MessageQueueSelector byKey = (List<MessageQueue> mqs, Message msg, Object arg) ->
            mqs.get(Math.floorMod(arg.hashCode(), mqs.size()));
        try {
            int i = 0;
            for (int seq = 0; seq < perKey; seq++) {
                for (int k = 0; k < keys; k++) {
                    String orderKey = "order-" + k;
                    Message msg = numbered(topic, run, i);
                    msg.putUserProperty("orderKey", orderKey);
                    msg.putUserProperty("orderSeq", Integer.toString(seq));
                    emitResult(i, producer.send(msg, byKey, orderKey), "orderKey", orderKey, "orderSeq", seq);
                    i++;
                }
            }
        } finally {
            producer.shutdown();
        }
    }

    static void delay(String topic, String run, int count, int level) throws Exception {
        DefaultMQProducer producer = started(topic, run);
        try {
            for (int i = 0; i < count; i++) {
                Message msg = numbered(topic, run, i);
                msg.setDelayTimeLevel(level);
                long sentAt = System.currentTimeMillis();
                emitResult(i, producer.send(msg), "sentAt", sentAt, "level", level);
            }
        } finally {
            producer.shutdown();
        }
    }

    static void timer(String topic, String run, int count, long delayMs) throws Exception {
        DefaultMQProducer producer = started(topic, run);
        try {
            for (int i = 0; i < count; i++) {
                Message msg = numbered(topic, run, i);
                long deliverAt = System.currentTimeMillis() + delayMs;
                msg.setDeliverTimeMs(deliverAt);
                emitResult(i, producer.send(msg), "deliverAt", deliverAt);
            }
        } finally {
            producer.shutdown();
        }
    }

    /** enableMsgTrace: the client writes a trace record per send to RMQ_SYS_TRACE_TOPIC. */
    static void trace(String topic, String run, int count) throws Exception {
        DefaultMQProducer producer = Connect.configureProducer(
            new DefaultMQProducer(run, Connect.rpcHook(), List.of(topic), true, null));
        producer.start();
        try {
            for (int i = 0; i < count; i++) {
                emitResult(i, producer.send(numbered(topic, run, i)));
            }
        } finally {
            // shutdown() flushes the trace dispatcher's queue before it returns.
            producer.shutdown();
        }
    }

    /**
     * Sync sends one after the other while the test kills the master: the client's own
     * retries (and route refresh) ride through; a send that still fails is printed with its
     * error and the next message goes on, so the test sees how long the client was stuck.
     */
    static void failover(String topic, String run, int count) throws Exception {
        DefaultMQProducer producer = Connect.producer(run);
        producer.setTopics(List.of(topic));
        producer.setRetryTimesWhenSendFailed(4);
        // The client learns the new master from the name server on this period (30 s by
        // default, as against RocketMQ itself): kept short so the test is.
        producer.setPollNameServerInterval(1000);
        producer.start();
        try {
            for (int i = 0; i < count; i++) {
                Message msg = numbered(topic, run, i);
                try {
                    emitResult(i, producer.send(msg), "at", System.currentTimeMillis());
                } catch (Exception e) {
                    Out.emit("i", i, "error", String.valueOf(e), "at", System.currentTimeMillis());
                    Thread.sleep(100);
                }
            }
        } finally {
            producer.shutdown();
        }
    }
}
