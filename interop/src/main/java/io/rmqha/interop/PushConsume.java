package io.rmqha.interop;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.impl.consumer.RebalanceImpl;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;

/**
 * {@code DefaultMQPushConsumer}s of one group (one or several instances in this JVM, each its
 * own client instance as separate processes would be), consuming until the test creates
 * {@code --stop-file}.
 *
 * <p>Prints {@code started}, then every change of each instance's queues as
 * {@code assignment} (from the rebalance's own process-queue tables, pull or pop), every
 * message handed to the listener as {@code msg} (with the instance and whether it was
 * accepted), and {@code stopped} after every instance shut down (offsets persisted).
 *
 * <p>Options: {@code --group --topic [--tags *] [--consumers 1]
 * [--model clustering|broadcasting] [--listener concurrently|orderly]
 * [--later-until N] (answer RECONSUME_LATER while reconsumeTimes &lt; N; -1 always)
 * [--retry-delay-level L] [--max-reconsume-times N] [--pop] (clientRebalance=false: the
 * broker assigns queues and says pull or pop) [--poll-namesrv-ms MS] [--rebalance-ms MS]
 * [--log-dir DIR] --stop-file PATH}.
 */
public final class PushConsume {
    private PushConsume() {
    }

    public static void main(String[] argv) throws Exception {
        DriverArgs args = DriverArgs.parse(argv);
        Clients.systemProperties(args);
        int instances = args.intOr("consumers", 1);
        List<DefaultMQPushConsumer> consumers = new ArrayList<>();
        for (int i = 0; i < instances; i++) {
            consumers.add(build(args, i));
        }
        for (DefaultMQPushConsumer consumer : consumers) {
            consumer.start();
        }
        Out.emit("event", "started", "consumers", instances);
        Thread watcher = new Thread(() -> watchAssignments(consumers, args.need("topic")), "assignments");
        watcher.setDaemon(true);
        watcher.start();
        awaitStopFile(args.need("stop-file"));
        watcher.interrupt();  // no assignment line after "stopped"
        watcher.join();
        for (DefaultMQPushConsumer consumer : consumers) {
            consumer.shutdown();
        }
        Out.emit("event", "stopped");
        System.exit(0);
    }

    private static DefaultMQPushConsumer build(DriverArgs args, int index) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(args.need("group"), Connect.rpcHook());
        Clients.configure(consumer, args);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setMessageModel("broadcasting".equals(args.or("model", "clustering"))
            ? MessageModel.BROADCASTING : MessageModel.CLUSTERING);
        consumer.subscribe(args.need("topic"), args.or("tags", "*"));
        int maxReconsume = args.intOr("max-reconsume-times", -1);
        if (maxReconsume >= 0) {
            consumer.setMaxReconsumeTimes(maxReconsume);
        }
        if (args.flag("pop")) {
            consumer.setClientRebalance(false);
        }
        consumer.setConsumeThreadMin(2);
        consumer.setConsumeThreadMax(2);
        int laterUntil = args.intOr("later-until", 0);
        int delayLevel = args.intOr("retry-delay-level", 0);
        if ("orderly".equals(args.or("listener", "concurrently"))) {
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, context) -> {
                for (MessageExt msg : msgs) {
                    report(index, msg, true);
                }
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
                boolean later = false;
                for (MessageExt msg : msgs) {
                    later |= laterUntil < 0 || msg.getReconsumeTimes() < laterUntil;
                }
                for (MessageExt msg : msgs) {
                    report(index, msg, !later);
                }
                if (later) {
                    // 0 lets the broker choose (level 3 + reconsumeTimes); a test sets 1 s.
                    context.setDelayLevelWhenNextConsume(delayLevel);
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        return consumer;
    }

    private static void report(int index, MessageExt msg, boolean accepted) {
        Map<String, Object> out = Clients.message(msg);
        out.put("consumer", index);
        out.put("accepted", accepted);
        Clients.emit(out);
    }

    private static void watchAssignments(List<DefaultMQPushConsumer> consumers, String topic) {
        List<TreeSet<String>> seen = new ArrayList<>();
        for (int i = 0; i < consumers.size(); i++) {
            seen.add(null);
        }
        while (true) {
            for (int i = 0; i < consumers.size(); i++) {
                RebalanceImpl rebalance = consumers.get(i).getDefaultMQPushConsumerImpl().getRebalanceImpl();
                TreeSet<String> now = new TreeSet<>();
                rebalance.getProcessQueueTable().forEach((mq, pq) -> add(now, mq, topic, !pq.isDropped(), "pull"));
                rebalance.getPopProcessQueueTable().forEach((mq, pq) -> add(now, mq, topic, !pq.isDropped(), "pop"));
                if (!now.equals(seen.get(i))) {
                    seen.set(i, now);
                    Out.emit("event", "assignment", "consumer", i, "queues", new ArrayList<>(now));
                }
            }
            try {
                Thread.sleep(100);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    private static void add(TreeSet<String> into, MessageQueue mq, String topic, boolean live, String mode) {
        if (live && mq.getTopic().equals(topic)) {
            into.add(mode + ":" + Clients.queueName(mq));
        }
    }

    /** Blocks until the test creates the stop file (its way of saying: stop now). */
    static void awaitStopFile(String path) throws InterruptedException {
        Path file = Path.of(path);
        while (!Files.exists(file)) {
            Thread.sleep(100);
        }
    }
}
