package io.rmqha.peers;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The Java load driver of the peer table: one long-lived JVM per (system, client), so the JIT
 * is warm for every workload after the first and the client's connections stay open, as in
 * an application.
 *
 * <p>Started as {@code Load rocketmq NAMESRV} (RocketMQ's remoting client, the same against
 * RocketMQ 5 and rmqha) or {@code Load kafka BOOTSTRAP} (Kafka's Java client).  It reads one
 * command a line on stdin and answers one line on stdout:
 *
 * <pre>
 * one TOPIC N BYTES            N sends, each acked before the next
 * batch TOPIC BATCHES SIZE BYTES  batches of SIZE, one in flight
 * window TOPIC N WINDOW BYTES  N single sends, at most WINDOW unacknowledged
 * read TOPIC N                 read at least N messages from the start
 * until_ok TOPIC BYTES MS      send until one is acked (the failover probe), at most MS
 * create BOOTSTRAP TOPIC PARTITIONS RF MISR   a Kafka topic (Admin client)
 * partition BOOTSTRAP TOPIC   partition 0's leader and ISR size: {@code ok 0 0 LEADER ISR}
 * quit
 * </pre>
 *
 * The answer is {@code ok ELAPSED_NS CPU_NS COUNT [LATENCY_NS ...]} (CPU: this JVM's, so the
 * client's own cost) or {@code error TEXT}.  Anything the clients log goes to stderr.
 */
public final class Load {
    private Load() {
    }

    /** What a client offers; one implementation per client library. */
    interface Client extends AutoCloseable {
        void sendOne(String topic, byte[] body) throws Exception;

        void sendBatch(String topic, byte[] body, int size) throws Exception;

        /** Sends {@code n} with at most {@code window} unacknowledged; throws on the first failure. */
        void window(String topic, byte[] body, int n, int window) throws Exception;

        long read(String topic, long n) throws Exception;

        /** One send for the failover probe, waiting at most {@code timeoutMs}. */
        void probe(String topic, byte[] body, long timeoutMs) throws Exception;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: Load rocketmq NAMESRV | Load kafka BOOTSTRAP");
            System.exit(2);
        }
        // The clients print to stdout in places; answers need stdout to themselves.
        PrintStream answers = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
            StandardCharsets.UTF_8);
        System.setOut(System.err);
        Client client;
        switch (args[0]) {
            case "rocketmq":
                client = new RocketmqClient(args[1]);
                break;
            case "kafka":
                client = new KafkaClient(args[1]);
                break;
            default:
                System.err.println("unknown client " + args[0]);
                System.exit(2);
                return;
        }
        answers.println("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (Client c = client) {
            String line;
            while ((line = in.readLine()) != null) {
                String[] w = line.trim().split("\\s+");
                if (w[0].equals("quit")) {
                    break;
                }
                try {
                    answers.println(run(c, w));
                } catch (Exception e) {
                    answers.println("error " + e.toString().replace('\n', ' '));
                }
            }
        }
        answers.flush();
        // Client threads (RocketMQ's timers) must not keep the JVM up after quit.
        System.exit(0);
    }

    static long cpu() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
            .getProcessCpuTime();
    }

    static byte[] body(String bytes) {
        byte[] b = new byte[Integer.parseInt(bytes)];
        for (int i = 0; i < b.length; i++) {
            b[i] = (byte) ('a' + i % 26);
        }
        return b;
    }

    static String run(Client c, String[] w) throws Exception {
        long cpu0 = cpu();
        long t0 = System.nanoTime();
        List<Long> lat = new ArrayList<>();
        long count;
        switch (w[0]) {
            case "one": {
                int n = Integer.parseInt(w[2]);
                byte[] b = body(w[3]);
                for (int i = 0; i < n; i++) {
                    long s = System.nanoTime();
                    c.sendOne(w[1], b);
                    lat.add(System.nanoTime() - s);
                }
                count = n;
                break;
            }
            case "batch": {
                int batches = Integer.parseInt(w[2]);
                int size = Integer.parseInt(w[3]);
                byte[] b = body(w[4]);
                for (int i = 0; i < batches; i++) {
                    long s = System.nanoTime();
                    c.sendBatch(w[1], b, size);
                    lat.add(System.nanoTime() - s);
                }
                count = (long) batches * size;
                break;
            }
            case "window": {
                int n = Integer.parseInt(w[2]);
                c.window(w[1], body(w[4]), n, Integer.parseInt(w[3]));
                count = n;
                break;
            }
            case "read":
                count = c.read(w[1], Long.parseLong(w[2]));
                break;
            case "partition":
                return "ok 0 0 " + KafkaClient.partition(w[1], w[2]);
            case "create":
                KafkaClient.create(w[1], w[2], Integer.parseInt(w[3]), Short.parseShort(w[4]), w[5]);
                count = 0;
                break;
            case "until_ok": {
                byte[] b = body(w[2]);
                long deadline = System.nanoTime() + Long.parseLong(w[3]) * 1_000_000L;
                AtomicReference<Exception> last = new AtomicReference<>();
                count = 0;
                while (System.nanoTime() < deadline) {
                    count++;
                    try {
                        long left = Math.max(1, (deadline - System.nanoTime()) / 1_000_000L);
                        c.probe(w[1], b, left);
                        last.set(null);
                        break;
                    } catch (Exception e) {
                        last.set(e);
                        Thread.sleep(5);
                    }
                }
                if (last.get() != null || System.nanoTime() >= deadline) {
                    throw new IllegalStateException("no send acked within " + w[3] + " ms: " + last.get());
                }
                break;
            }
            default:
                throw new IllegalArgumentException("unknown command " + w[0]);
        }
        long elapsed = System.nanoTime() - t0;
        StringBuilder out = new StringBuilder("ok ").append(elapsed).append(' ').append(cpu() - cpu0)
            .append(' ').append(count);
        for (long l : lat) {
            out.append(' ').append(l);
        }
        return out.toString();
    }
}
