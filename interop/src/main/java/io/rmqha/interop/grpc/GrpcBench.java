package io.rmqha.interop.grpc;

import static io.rmqha.interop.grpc.GrpcSendReceive.configuration;
import static io.rmqha.interop.grpc.GrpcSendReceive.emit;

import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;

/**
 * {@code make bench-proxy}'s Java 5.x rows (benches/bench_proxy.py runs this): RocketMQ 5's
 * gRPC Java client through {@code rmqha proxy}.  Arguments: mode topic-or-group count-or-seconds
 * [window-or-batch]; environment as {@link GrpcSendReceive#configuration()}.
 *
 * <ul>
 *   <li>{@code one TOPIC N}: N sends, each acknowledged before the next (latency per send);
 *   <li>{@code window TOPIC N W}: N {@code sendAsync}, at most W unanswered;
 *   <li>{@code read TOPIC N B GROUP}: a SimpleConsumer receives B at a time and acks every
 *       message ({@code ackAsync}, all of a batch at once) until N were acked;
 *   <li>{@code prime TOPIC 0 1 GROUP}: one receive of a new group, so its pop cursors start
 *       at the beginning of what is written after;
 *   <li>{@code idle-simple TOPIC S GROUP} / {@code idle-push TOPIC S GROUP}: a consumer with
 *       nothing to receive for S seconds (the calls are counted at the proxy).
 * </ul>
 *
 * Each run first warms up (sends, or a first receive: route, connection, JIT of the path),
 * prints {@code {"phase":"start"}} where the timed part begins (the bench samples the
 * proxy's CPU there and at the result) and then one JSON line: messages, seconds, messages per second, p50/p99 in ms where a
 * latency applies, and the client's CPU per message in microseconds.
 */
public final class GrpcBench {
    private static final int BODY_BYTES = 1024;

    private GrpcBench() {
    }

    static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
            .getProcessCpuTime();
    }

    static Message message(ClientServiceProvider provider, String topic, byte[] body) {
        return provider.newMessageBuilder().setTopic(topic).setBody(body).build();
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        String topic = args[1];
        int n = Integer.parseInt(args[2]);
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration config = configuration();
        byte[] body = new byte[BODY_BYTES];
        Arrays.fill(body, (byte) 'x');
        switch (mode) {
            case "one":
            case "window":
                try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config)
                    .setTopics(topic).build()) {
                    for (int i = 0; i < 200; i++) {
                        producer.send(message(provider, topic, body));   // warm-up
                    }
                    if ("one".equals(mode)) {
                        one(provider, producer, topic, body, n);
                    } else {
                        window(provider, producer, topic, body, n, Integer.parseInt(args[3]));
                    }
                }
                break;
            case "read":
                read(provider, config, topic, n, Integer.parseInt(args[3]), args[4]);
                break;
            case "prime":
                prime(provider, config, topic, args[4]);
                break;
            case "idle-simple":
            case "idle-push":
                idle(provider, config, topic, n, args[3], "idle-push".equals(mode));
                break;
            default:
                throw new IllegalArgumentException("mode " + mode + " is not one, window, read, prime, idle-simple, "
                + "idle-push");
        }
        System.exit(0);   // the client's threads are not all daemons
    }

    static void report(String mode, int messages, long startNanos, long cpuStart, long[] latencies) {
        double seconds = (System.nanoTime() - startNanos) / 1e9;
        double cpuUs = (cpuNanos() - cpuStart) / 1e3;
        Arrays.sort(latencies);
        double p50 = latencies.length == 0 ? -1 : latencies[latencies.length / 2] / 1e6;
        double p99 = latencies.length == 0 ? -1
            : latencies[Math.min(latencies.length - 1, (int) (latencies.length * 0.99))] / 1e6;
        emit("mode", mode, "messages", messages, "seconds", seconds, "messagesPerS", messages / seconds,
            "p50Ms", p50, "p99Ms", p99, "clientCpuUsPerMsg", cpuUs / Math.max(1, messages));
    }

    static void one(ClientServiceProvider provider, Producer producer, String topic, byte[] body, int n)
        throws Exception {
        long[] lat = new long[n];
        emit("phase", "start");
        long cpu = cpuNanos();
        long start = System.nanoTime();
        for (int i = 0; i < n; i++) {
            long t0 = System.nanoTime();
            producer.send(message(provider, topic, body));
            lat[i] = System.nanoTime() - t0;
        }
        report("one", n, start, cpu, lat);
    }

    static void window(ClientServiceProvider provider, Producer producer, String topic, byte[] body, int n,
                       int window) throws Exception {
        Semaphore free = new Semaphore(window);
        long[] lat = new long[n];
        AtomicInteger failed = new AtomicInteger();
        emit("phase", "start");
        long cpu = cpuNanos();
        long start = System.nanoTime();
        for (int i = 0; i < n; i++) {
            free.acquire();
            long t0 = System.nanoTime();
            int slot = i;
            producer.sendAsync(message(provider, topic, body)).whenComplete((receipt, error) -> {
                lat[slot] = System.nanoTime() - t0;
                if (error != null && failed.getAndIncrement() == 0) {
                    emit("error", String.valueOf(error));
                }
                free.release();
            });
        }
        free.acquire(window);   // every answer is in once the whole window is free
        if (failed.get() > 0) {
            throw new IllegalStateException(failed.get() + " of " + n + " sends failed");
        }
        report("window", n, start, cpu, lat);
    }

    static void read(ClientServiceProvider provider, ClientConfiguration config, String topic, int n, int batch,
                     String group) throws Exception {
        Map<String, FilterExpression> sub = Map.of(topic, new FilterExpression("*", FilterExpressionType.TAG));
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
            .setConsumerGroup(group).setSubscriptionExpressions(sub).setAwaitDuration(Duration.ofSeconds(2)).build()) {
            int got = 0;
            AtomicInteger ackFailures = new AtomicInteger();
            emit("phase", "start");
            long cpu = cpuNanos();
            long start = System.nanoTime();
            long deadline = System.currentTimeMillis() + 300_000;
            while (got < n && System.currentTimeMillis() < deadline) {
                List<MessageView> views = consumer.receive(batch, Duration.ofSeconds(30));
                CompletableFuture<?>[] acks = new CompletableFuture<?>[views.size()];
                for (int i = 0; i < acks.length; i++) {
                    // A failed ack is counted, not fatal: the message comes again after its
                    // invisible time (on a loaded machine the all-ack wait can time out).
                    acks[i] = consumer.ackAsync(views.get(i)).exceptionally(error -> {
                        ackFailures.incrementAndGet();
                        return null;
                    });
                }
                CompletableFuture.allOf(acks).join();
                got += views.size();
            }
            if (got < n) {
                throw new IllegalStateException("received and acked " + got + " of " + n);
            }
            emit("ackFailures", ackFailures.get());
            report("read", got, start, cpu, new long[0]);
        }
    }

    static void prime(ClientServiceProvider provider, ClientConfiguration config, String topic, String group)
        throws Exception {
        Map<String, FilterExpression> sub = Map.of(topic, new FilterExpression("*", FilterExpressionType.TAG));
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
            .setConsumerGroup(group).setSubscriptionExpressions(sub).setAwaitDuration(Duration.ofSeconds(1)).build()) {
            int got = consumer.receive(1, Duration.ofSeconds(30)).size();
            emit("mode", "prime", "messages", got);
        }
    }

    static void idle(ClientServiceProvider provider, ClientConfiguration config, String topic, int seconds,
                     String group, boolean push) throws Exception {
        Map<String, FilterExpression> sub = Map.of(topic, new FilterExpression("*", FilterExpressionType.TAG));
        long end = System.currentTimeMillis() + seconds * 1000L;
        if (push) {
            try (PushConsumer consumer = provider.newPushConsumerBuilder().setClientConfiguration(config)
                .setConsumerGroup(group).setSubscriptionExpressions(sub)
                .setMessageListener(view -> ConsumeResult.SUCCESS).build()) {
                emit("ready", true);
                Thread.sleep(Math.max(0, end - System.currentTimeMillis()));
            }
        } else {
            try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
                .setConsumerGroup(group).setSubscriptionExpressions(sub).setAwaitDuration(Duration.ofSeconds(20))
                .build()) {
                emit("ready", true);
                while (System.currentTimeMillis() < end) {
                    consumer.receive(32, Duration.ofSeconds(30));
                }
            }
        }
        emit("mode", push ? "idle-push" : "idle-simple", "seconds", seconds);
    }
}
