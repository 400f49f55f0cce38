package io.rmqha.interop;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * RocketMQ's remoting {@link TransactionMQProducer} against rmqha.  Message {@code i} has
 * body {@code body-RUN-i} and key {@code key-RUN-i}; its outcome is decided by its index:
 * even commits, odd rolls back.
 *
 * <pre>
 *   TransactionDriver end   TOPIC GROUP RUN COUNT
 *       the local transaction answers at once (even COMMIT, odd ROLLBACK)
 *   TransactionDriver hang  TOPIC GROUP RUN COUNT
 *       the local transaction answers UNKNOW, as does any check; prints {"ready":true}
 *       and waits to be killed (the test SIGKILLs the JVM)
 *   TransactionDriver check TOPIC GROUP EXPECT TIMEOUT_S
 *       a second producer of the same group that only answers the brokers' checks
 *       (even COMMIT, odd ROLLBACK, by the message's seq) until EXPECT messages were
 *       checked or TIMEOUT_S passed
 * </pre>
 */
public final class TransactionDriver {
    private TransactionDriver() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            throw new IllegalArgumentException("usage: TransactionDriver end|hang|check TOPIC GROUP ...");
        }
        String topic = args[1];
        String group = args[2];
        switch (args[0]) {
            case "end" -> send(topic, group, args[3], Integer.parseInt(args[4]), false);
            case "hang" -> send(topic, group, args[3], Integer.parseInt(args[4]), true);
            case "check" -> check(topic, group, Integer.parseInt(args[3]), Integer.parseInt(args[4]));
            default -> throw new IllegalArgumentException("unknown command " + args[0]);
        }
        Out.emit("done", true);
        System.exit(0);
    }

    static LocalTransactionState decide(Message msg) {
        int seq = Integer.parseInt(msg.getUserProperty("seq"));
        return seq % 2 == 0 ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.ROLLBACK_MESSAGE;
    }

    static void send(String topic, String group, String run, int count, boolean hang) throws Exception {
        TransactionMQProducer producer = Connect.transactionProducer(group);
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return hang ? LocalTransactionState.UNKNOW : decide(msg);
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                Out.emit("checkedBy", "sender", "key", msg.getKeys());
                return hang ? LocalTransactionState.UNKNOW : decide(msg);
            }
        });
        producer.start();
        for (int i = 0; i < count; i++) {
            Message msg = new Message(topic, "tx", "key-" + run + "-" + i,
                ("body-" + run + "-" + i).getBytes(StandardCharsets.UTF_8));
            msg.putUserProperty("seq", Integer.toString(i));
            SendResult r = producer.sendMessageInTransaction(msg, null);
            Out.emit("i", i, "status", r.getSendStatus().name(), "msgId", r.getMsgId(),
                "transactionId", r.getTransactionId(),
                "localState", String.valueOf(((org.apache.rocketmq.client.producer.TransactionSendResult) r)
                    .getLocalTransactionState()));
        }
        if (hang) {
            Out.emit("ready", true);
            TimeUnit.MINUTES.sleep(10);  // killed by the test long before
        }
        producer.shutdown();
    }

    static void check(String topic, String group, int expect, int timeoutS) throws Exception {
        Set<String> checked = ConcurrentHashMap.newKeySet();
        TransactionMQProducer producer = Connect.transactionProducer(group);
        // Without a send, only the topics named here get a route, and so a heartbeat to
        // their brokers: the brokers' checks reach producers they know.
        producer.setTopics(List.of(topic));
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                throw new IllegalStateException("the checker sends nothing");
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                LocalTransactionState answer = decide(msg);
                checked.add(msg.getKeys());
                Out.emit("checkedBy", "checker", "key", msg.getKeys(), "answer", answer.name(),
                    "transactionId", msg.getTransactionId(), "msgId", msg.getMsgId());
                return answer;
            }
        });
        producer.start();
        Out.emit("ready", true);
        long deadline = System.currentTimeMillis() + timeoutS * 1000L;
        while (checked.size() < expect && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
        }
        Out.emit("checked", checked.size());
        // Answers go out on the client's own threads: give the last one a moment on the wire.
        Thread.sleep(500);
        producer.shutdown();
    }
}
