package io.rmqha.interop.grpc;

import static io.rmqha.interop.grpc.GrpcSendReceive.configuration;
import static io.rmqha.interop.grpc.GrpcSendReceive.emit;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

/**
 * A Producer and a SimpleConsumer (or a PushConsumer) of RocketMQ 5's gRPC Java client
 * through {@code rmqha proxy}, both running while the test SIGKILLs the master.  Arguments:
 * topic group count pauseMs [simple|push].  The producer sends {@code count} messages one after the other ({@code pauseMs}
 * apart, the client's own retries on), printing {@code sent} with the message id for each
 * acknowledged one and {@code error} for one the client gave up on; the consumer receives
 * and acks from before the first send until every acknowledged one was delivered to it
 * (or 150 s passed), printing {@code received} per delivery (a redelivery prints again) and
 * {@code receiveError} / {@code ackError} when a call fails (then it goes on); a
 * PushConsumer's listener prints {@code received} and answers SUCCESS (the client acks and
 * retries its acks itself).  Last line:
 * {@code done}.  The same client objects live through the kill: nothing is restarted.
 */
public final class GrpcFailover {
    private static final long CONSUME_DEADLINE_MS = 150_000;

    private GrpcFailover() {
    }

    public static void main(String[] args) throws Exception {
        String topic = args[0];
        String group = args[1];
        int count = Integer.parseInt(args[2]);
        long pauseMs = Long.parseLong(args[3]);
        boolean push = args.length > 4 && "push".equals(args[4]);
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration config = configuration();
        Set<String> acked = ConcurrentHashMap.newKeySet();
        Set<String> received = ConcurrentHashMap.newKeySet();
        AtomicBoolean producing = new AtomicBoolean(true);
        Map<String, FilterExpression> subscription = Map.of(topic, new FilterExpression("*", FilterExpressionType.TAG));
        if (push) {
            try (PushConsumer consumer = provider.newPushConsumerBuilder().setClientConfiguration(config)
                .setConsumerGroup(group).setSubscriptionExpressions(subscription).setConsumptionThreadCount(2)
                .setMessageListener(view -> {
                    delivered(view, received);
                    return ConsumeResult.SUCCESS;   // the client acks it (a failed ack is retried by the client)
                }).build()) {
                produce(provider, config, topic, count, pauseMs, acked);
                long deadline = System.currentTimeMillis() + CONSUME_DEADLINE_MS;
                while (!received.containsAll(acked) && System.currentTimeMillis() < deadline) {
                    Thread.sleep(100);
                }
            }
        } else {
            try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
                .setConsumerGroup(group).setSubscriptionExpressions(subscription)
                .setAwaitDuration(Duration.ofSeconds(1)).build()) {
                Thread reader = new Thread(() -> consume(consumer, acked, received, producing), "consume");
                reader.start();
                produce(provider, config, topic, count, pauseMs, acked);
                producing.set(false);
                reader.join();
            }
        }
        boolean all = received.containsAll(acked);
        emit("done", all, "acked", acked.size(), "received", received.size());
        System.exit(all ? 0 : 1);
    }

    static void produce(ClientServiceProvider provider, ClientConfiguration config, String topic, int count,
                        long pauseMs, Set<String> acked) throws Exception {
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic).build()) {
            for (int i = 0; i < count; i++) {
                byte[] body = ("body-failover-" + i).getBytes(StandardCharsets.UTF_8);
                try {
                    SendReceipt receipt = producer.send(provider.newMessageBuilder().setTopic(topic)
                        .setKeys("failover-" + i).setBody(body).build());
                    acked.add(receipt.getMessageId().toString());
                    emit("sent", receipt.getMessageId().toString(), "index", i, "at", System.currentTimeMillis());
                } catch (Exception e) {
                    emit("error", String.valueOf(e), "index", i, "at", System.currentTimeMillis());
                }
                Thread.sleep(pauseMs);
            }
        }
    }

    static void delivered(MessageView view, Set<String> received) {
        String id = view.getMessageId().toString();
        emit("received", id, "body", StandardCharsets.UTF_8.decode(view.getBody()).toString(),
            "at", System.currentTimeMillis());
        received.add(id);
    }

    static void consume(SimpleConsumer consumer, Set<String> acked, Set<String> received, AtomicBoolean producing) {
        long deadline = System.currentTimeMillis() + CONSUME_DEADLINE_MS;
        while (System.currentTimeMillis() < deadline && !(!producing.get() && received.containsAll(acked))) {
            List<MessageView> views;
            try {
                views = consumer.receive(16, Duration.ofSeconds(5));
            } catch (Exception e) {
                emit("receiveError", String.valueOf(e), "at", System.currentTimeMillis());
                pause();
                continue;
            }
            for (MessageView view : views) {
                String id = view.getMessageId().toString();
                delivered(view, received);
                try {
                    consumer.ack(view);
                } catch (Exception e) {
                    // Either the broker did not take it (then it comes again after its invisible
                    // time) or only its answer was lost: it was delivered, at least once.
                    emit("ackError", String.valueOf(e), "id", id);
                }
            }
        }
    }

    static void pause() {
        try {
            Thread.sleep(200);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
