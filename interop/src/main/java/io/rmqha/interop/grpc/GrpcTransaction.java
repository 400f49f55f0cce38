package io.rmqha.interop.grpc;

import static io.rmqha.interop.grpc.GrpcSendReceive.configuration;
import static io.rmqha.interop.grpc.GrpcSendReceive.emit;

import java.nio.charset.StandardCharsets;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionChecker;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

/**
 * Transactions of RocketMQ 5's gRPC Java client through {@code rmqha proxy}.  Arguments:
 * mode topic run count [seconds].  Message i has key {@code key-RUN-i} and body
 * {@code body-RUN-i}; even ones are to be committed, odd ones rolled back.
 *
 * <ul>
 *   <li>{@code end}: begin, send and end each transaction at once (commit / rollback);
 *   <li>{@code hang}: begin and send each, end none, print {@code ready} and wait to be
 *       SIGKILLed (the transactions stay open at the broker);
 *   <li>{@code check}: a producer of the topic whose TransactionChecker answers the
 *       proxy's RecoverOrphanedTransactionCommands (even COMMIT, odd ROLLBACK) until it
 *       answered every one of {@code count} keys or {@code seconds} passed.
 * </ul>
 *
 * A producer always carries a checker (the client refuses transactions without one); in
 * {@code end} and {@code hang} it answers UNKNOWN and reports that it was asked.
 */
public final class GrpcTransaction {
    private GrpcTransaction() {
    }

    static TransactionResolution wanted(String key) {
        int i = Integer.parseInt(key.substring(key.lastIndexOf('-') + 1));
        return i % 2 == 0 ? TransactionResolution.COMMIT : TransactionResolution.ROLLBACK;
    }

    static String keyOf(MessageView view) {
        return view.getKeys().isEmpty() ? "" : view.getKeys().iterator().next();
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        String topic = args[1];
        String run = args[2];
        int count = Integer.parseInt(args[3]);
        long seconds = args.length > 4 ? Long.parseLong(args[4]) : 60;
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        Set<String> answered = ConcurrentHashMap.newKeySet();
        boolean checker = "check".equals(mode);
        TransactionChecker check = view -> {
            String key = keyOf(view);
            TransactionResolution answer = checker ? wanted(key) : TransactionResolution.UNKNOWN;
            emit("checkedBy", mode, "key", key, "messageId", view.getMessageId().toString(), "answer", answer.name());
            if (checker) {
                answered.add(key);
            }
            return answer;
        };
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(configuration())
            .setTopics(topic).setTransactionChecker(check).build()) {
            if (checker) {
                long deadline = System.currentTimeMillis() + seconds * 1000;
                while (answered.size() < count && System.currentTimeMillis() < deadline) {
                    Thread.sleep(100);
                }
                emit("done", answered.size() >= count, "answered", answered.size());
                return;
            }
            for (int i = 0; i < count; i++) {
                String key = "key-" + run + "-" + i;
                Message message = provider.newMessageBuilder().setTopic(topic).setKeys(key)
                    .setBody(("body-" + run + "-" + i).getBytes(StandardCharsets.UTF_8)).build();
                Transaction transaction = producer.beginTransaction();
                SendReceipt receipt = producer.send(message, transaction);
                String ending = "open";
                if ("end".equals(mode)) {
                    if (wanted(key) == TransactionResolution.COMMIT) {
                        transaction.commit();
                        ending = "COMMIT";
                    } else {
                        transaction.rollback();
                        ending = "ROLLBACK";
                    }
                }
                emit("sent", receipt.getMessageId().toString(), "key", key, "index", i, "ending", ending);
            }
            if ("hang".equals(mode)) {
                emit("ready", true);
                Thread.sleep(Long.MAX_VALUE);   // SIGKILLed here, the transactions open
            }
        }
        emit("done", true);
    }
}
