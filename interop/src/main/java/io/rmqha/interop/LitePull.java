package io.rmqha.interop;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * One {@code DefaultLitePullConsumer}, auto-commit off, polling until it has {@code --count}
 * messages, then (per {@code --commit}) committing and shutting down.
 *
 * <p>Prints {@code queues} (what it consumes), each message as {@code msg}, {@code extra}
 * (what one more poll of {@code --extra-poll-ms} returned: nothing, when every message came
 * once), {@code committed} (the offset store's view per queue) and {@code done}.
 *
 * <p>Options: {@code --group --topic --count N [--mode subscribe|assign]
 * [--queues 0,2] (assign: these queue ids) [--seek 0:5,2:0] (queue id: offset)
 * [--commit none|sync|persist] (sync: commitSync(), persisted at shutdown; persist:
 * commit(queues, true) at once) [--timeout-ms 60000] [--extra-poll-ms 1000]
 * [--batch 8] [--log-dir DIR]}.
 */
public final class LitePull {
    private LitePull() {
    }

    public static void main(String[] argv) throws Exception {
        DriverArgs args = DriverArgs.parse(argv);
        Clients.systemProperties(args);
        String topic = args.need("topic");
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(args.need("group"), Connect.rpcHook());
        Clients.configure(consumer, args);
        consumer.setAutoCommit(false);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPullBatchSize(args.intOr("batch", 8));
        consumer.setPollTimeoutMillis(500);
        boolean assign = "assign".equals(args.or("mode", "subscribe"));
        if (!assign) {
            consumer.subscribe(topic, "*");
        }
        consumer.start();
        long deadline = System.currentTimeMillis() + args.longOr("timeout-ms", 60000);
        Collection<MessageQueue> queues = assign ? assign(consumer, topic, args.need("queues"))
            : waitAssignment(consumer, deadline);
        Out.emit("event", "queues", "queues", names(queues));
        seek(consumer, queues, args.or("seek", ""));
        int want = args.intOr("count", 0);
        int got = 0;
        while (got < want && System.currentTimeMillis() < deadline) {
            got += emit(consumer.poll(500), "msg");
        }
        long extraMs = args.longOr("extra-poll-ms", 1000);
        int extra = extraMs > 0 ? emit(consumer.poll(extraMs), "extra") : 0;
        commit(consumer, queues, args.or("commit", "none"));
        Map<String, Long> committed = new TreeMap<>();
        for (MessageQueue mq : queues) {
            committed.put(Clients.queueName(mq), consumer.committed(mq));
        }
        Out.emit("event", "committed", "offsets", committed);
        consumer.shutdown();
        Out.emit("event", "done", "received", got, "extra", extra);
        System.exit(0);
    }

    private static Collection<MessageQueue> assign(DefaultLitePullConsumer consumer, String topic, String ids)
        throws Exception {
        List<MessageQueue> chosen = new ArrayList<>();
        List<String> wanted = List.of(ids.split(","));
        for (MessageQueue mq : consumer.fetchMessageQueues(topic)) {
            if (wanted.contains(String.valueOf(mq.getQueueId()))) {
                chosen.add(mq);
            }
        }
        consumer.assign(chosen);
        return chosen;
    }

    private static Collection<MessageQueue> waitAssignment(DefaultLitePullConsumer consumer, long deadline)
        throws Exception {
        while (System.currentTimeMillis() < deadline) {
            Set<MessageQueue> now = consumer.assignment();
            if (!now.isEmpty()) {
                return now;
            }
            Thread.sleep(50);
        }
        throw new IllegalStateException("no queue assigned before the deadline");
    }

    private static void seek(DefaultLitePullConsumer consumer, Collection<MessageQueue> queues, String spec)
        throws Exception {
        if (spec.isEmpty()) {
            return;
        }
        // Paused around the seek: a pull started before it can otherwise finish after the new
        // pull task took the seek offset and hand over messages from before it (a race in the
        // 5.5.0 client's PullTaskImpl, not the broker's answer).  While paused the seek offset
        // stays set, so such a pull's messages are dropped by the client; 500 ms lets it land.
        consumer.pause(queues);
        for (String item : spec.split(",")) {
            String[] parts = item.split(":");
            for (MessageQueue mq : queues) {
                if (String.valueOf(mq.getQueueId()).equals(parts[0])) {
                    consumer.seek(mq, Long.parseLong(parts[1]));
                    Out.emit("event", "seek", "queue", Clients.queueName(mq), "offset", Long.parseLong(parts[1]));
                }
            }
        }
        Thread.sleep(500);
        consumer.resume(queues);
    }

    private static void commit(DefaultLitePullConsumer consumer, Collection<MessageQueue> queues, String how) {
        switch (how) {
            case "sync":
                consumer.commitSync();
                break;
            case "persist":
                consumer.commit(Set.copyOf(queues), true);
                break;
            case "none":
                break;
            default:
                throw new IllegalArgumentException("--commit must be none, sync or persist, not " + how);
        }
    }

    private static int emit(List<MessageExt> msgs, String event) {
        for (MessageExt msg : msgs) {
            Map<String, Object> out = Clients.message(msg);
            out.put("event", event);
            Clients.emit(out);
        }
        return msgs.size();
    }

    private static List<String> names(Collection<MessageQueue> queues) {
        List<String> out = new ArrayList<>();
        for (MessageQueue mq : queues) {
            out.add(Clients.queueName(mq));
        }
        out.sort(null);
        return out;
    }
}
