package io.rmqha.peers;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * RocketMQ's remoting client (rocketmq-client 5.5.0), used as an application would: one
 * DefaultMQProducer (sync send, batch send, async send with a callback), a
 * DefaultLitePullConsumer of a fresh group for reading back.  The name server is polled for
 * routes every second (the default is 30 s), for RocketMQ and rmqha alike, so the failover
 * probe sees the new master soon after the name server does.
 */
final class RocketmqClient implements Load.Client {
    private final String namesrv;
    private final DefaultMQProducer producer;

    RocketmqClient(String namesrv) throws Exception {
        this.namesrv = namesrv;
        producer = new DefaultMQProducer("bench_java_" + System.nanoTime());
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(10_000);
        producer.setPollNameServerInterval(1000);
        producer.setInstanceName("bench_java_" + ProcessHandle.current().pid());
        producer.start();
    }

    private static void check(SendResult r) {
        if (r.getSendStatus() != SendStatus.SEND_OK) {
            throw new IllegalStateException("send answered " + r.getSendStatus());
        }
    }

    @Override
    public void sendOne(String topic, byte[] body) throws Exception {
        check(producer.send(new Message(topic, body)));
    }

    @Override
    public void sendBatch(String topic, byte[] body, int size) throws Exception {
        List<Message> batch = new ArrayList<>(size);
        for (int i = 0; i < size; i++) {
            batch.add(new Message(topic, body));
        }
        check(producer.send(batch));
    }

    @Override
    public void window(String topic, byte[] body, int n, int window) throws Exception {
        Semaphore free = new Semaphore(window);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        SendCallback done = new SendCallback() {
            @Override
            public void onSuccess(SendResult r) {
                if (r.getSendStatus() != SendStatus.SEND_OK) {
                    failed.compareAndSet(null, new IllegalStateException("send answered " + r.getSendStatus()));
                }
                free.release();
            }

            @Override
            public void onException(Throwable e) {
                failed.compareAndSet(null, e);
                free.release();
            }
        };
        for (int i = 0; i < n && failed.get() == null; i++) {
            free.acquire();
            producer.send(new Message(topic, body), done);
        }
        free.acquire(window);  // every send answered
        if (failed.get() != null) {
            throw new IllegalStateException("a windowed send failed: " + failed.get(), failed.get());
        }
    }

    @Override
    public long read(String topic, long n) throws Exception {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer("bench_read_" + System.nanoTime());
        consumer.setNamesrvAddr(namesrv);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPullBatchSize(256);
        consumer.setInstanceName("bench_read_" + System.nanoTime());
        consumer.subscribe(topic, "*");
        consumer.start();
        long got = 0;
        long deadline = System.nanoTime() + 120_000_000_000L;
        try {
            while (got < n && System.nanoTime() < deadline) {
                List<MessageExt> batch = consumer.poll(2000);
                got += batch.size();
            }
        } finally {
            consumer.shutdown();
        }
        return got;
    }

    @Override
    public void probe(String topic, byte[] body, long timeoutMs) throws Exception {
        check(producer.send(new Message(topic, body), Math.min(1000, timeoutMs)));
    }

    @Override
    public void close() {
        producer.shutdown();
    }
}
