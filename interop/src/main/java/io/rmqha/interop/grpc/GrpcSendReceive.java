package io.rmqha.interop.grpc;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientConfigurationBuilder;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

/**
 * RocketMQ 5's gRPC Java client through {@code rmqha proxy}: a Producer sends {@code count}
 * messages of one kind ({@code normal}, {@code fifo}: one message group, {@code delay}: a
 * delivery timestamp 2 s ahead; {@code push}: normal ones), then a SimpleConsumer receives and
 * acks until it has them all ({@code push}: a PushConsumer's listener consumes them).  Arguments: kind topic group count.  Environment: {@code INTEROP_PROXY} (host:port),
 * {@code INTEROP_SSL} ("true": TLS), {@code INTEROP_ACCESS_KEY} / {@code INTEROP_SECRET_KEY}
 * (credentials, when set), {@code INTEROP_TIMEOUT_MS} (the client's request timeout, 30 s
 * unless set: its deadline runs from before the connection is made, and a cold JVM's
 * first TLS connection on two busy cores took 33 s once, the client then failing at start).  One JSON line per send ({@code sent}), per receipt
 * ({@code received}, with its message group, delivery timestamp and when it came)
 * and a last {@code done} line.
 */
public final class GrpcSendReceive {
    private GrpcSendReceive() {
    }

    static ClientConfiguration configuration() {
        ClientConfigurationBuilder builder = ClientConfiguration.newBuilder()
            .setEndpoints(System.getenv("INTEROP_PROXY"))
            .enableSsl(Boolean.parseBoolean(System.getenv().getOrDefault("INTEROP_SSL", "false")))
            .setRequestTimeout(Duration.ofMillis(Long.parseLong(System.getenv().getOrDefault("INTEROP_TIMEOUT_MS",
                "30000"))));
        String ak = System.getenv("INTEROP_ACCESS_KEY");
        if (ak != null && !ak.isEmpty()) {
            builder.setCredentialProvider(new StaticSessionCredentialsProvider(ak, System.getenv("INTEROP_SECRET_KEY")));
        }
        return builder.build();
    }

    /** One JSON object of key, value pairs (strings, numbers, booleans): written by hand, the
     * driver runs on the shaded client's jar alone (its apache.rocketmq.v2 classes and the
     * remoting client's rocketmq-proto must not meet on one class path). */
    static void emit(Object... kv) {
        StringBuilder out = new StringBuilder("{");
        for (int i = 0; i < kv.length; i += 2) {
            out.append(i == 0 ? "" : ",").append(quote(String.valueOf(kv[i]))).append(':');
            Object v = kv[i + 1];
            out.append(v instanceof Number || v instanceof Boolean ? String.valueOf(v) : quote(String.valueOf(v)));
        }
        System.out.println(out.append('}'));
        System.out.flush();
    }

    static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }

    public static void main(String[] args) throws Exception {
        String kind = args[0];
        String topic = args[1];
        String group = args[2];
        int count = Integer.parseInt(args[3]);
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration config = configuration();
        Set<String> sent = new HashSet<>();
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic).build()) {
            for (int i = 0; i < count; i++) {
                MessageBuilder mb = provider.newMessageBuilder().setTopic(topic).setKeys("k" + i)
                    .setBody(("body " + i).getBytes(StandardCharsets.UTF_8));
                long due = 0;
                if ("fifo".equals(kind)) {
                    mb.setMessageGroup("group-1");
                } else if ("delay".equals(kind)) {
                    due = System.currentTimeMillis() + 2000;
                    mb.setDeliveryTimestamp(due);
                }
                Message message = mb.build();
                SendReceipt receipt = producer.send(message);
                sent.add(receipt.getMessageId().toString());
                emit("sent", receipt.getMessageId().toString(), "index", i, "due", due);
            }
        }
        Map<String, FilterExpression> subscription = Map.of(topic, new FilterExpression("*", FilterExpressionType.TAG));
        Set<String> received = "push".equals(kind) ? pushReceive(provider, config, group, subscription, sent)
            : simpleReceive(provider, config, group, subscription, sent);
        emit("done", received.containsAll(sent), "sent", sent.size(), "received", received.size());
        System.exit(received.containsAll(sent) ? 0 : 1);
    }

    /** A PushConsumer whose listener reports each message and answers SUCCESS (the ack). */
    static Set<String> pushReceive(ClientServiceProvider provider, ClientConfiguration config, String group,
                                   Map<String, FilterExpression> subscription, Set<String> sent) throws Exception {
        Set<String> received = ConcurrentHashMap.newKeySet();
        long deadline = System.currentTimeMillis() + 60_000;
        try (PushConsumer consumer = provider.newPushConsumerBuilder().setClientConfiguration(config)
            .setConsumerGroup(group).setSubscriptionExpressions(subscription).setConsumptionThreadCount(2)
            .setMessageListener(view -> {
                emit("received", view.getMessageId().toString(), "body",
                    StandardCharsets.UTF_8.decode(view.getBody()).toString(), "messageGroup",
                    view.getMessageGroup().orElse(""), "deliveryTimestamp", view.getDeliveryTimestamp().orElse(0L),
                    "at", System.currentTimeMillis());
                received.add(view.getMessageId().toString());
                return ConsumeResult.SUCCESS;
            }).build()) {
            while (!received.containsAll(sent) && System.currentTimeMillis() < deadline) {
                Thread.sleep(100);
            }
        }
        return received;
    }

    static Set<String> simpleReceive(ClientServiceProvider provider, ClientConfiguration config, String group,
                                     Map<String, FilterExpression> subscription, Set<String> sent) throws Exception {
        Set<String> received = new HashSet<>();
        long deadline = System.currentTimeMillis() + 60_000;
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
            .setConsumerGroup(group).setSubscriptionExpressions(subscription).setAwaitDuration(Duration.ofSeconds(2))
            .build()) {
            while (!received.containsAll(sent) && System.currentTimeMillis() < deadline) {
                List<MessageView> views = consumer.receive(16, Duration.ofSeconds(15));
                for (MessageView view : views) {
                    long due = view.getDeliveryTimestamp().orElse(0L);
                    emit("received", view.getMessageId().toString(), "body",
                        StandardCharsets.UTF_8.decode(view.getBody()).toString(),
                        "messageGroup", view.getMessageGroup().orElse(""),
                        "deliveryTimestamp", due, "at", System.currentTimeMillis());
                    consumer.ack(view);
                    received.add(view.getMessageId().toString());
                }
            }
        }
        return received;
    }
}
