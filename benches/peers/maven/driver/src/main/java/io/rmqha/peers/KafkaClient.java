package io.rmqha.peers;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Kafka's Java client (kafka-clients 4.1.1) as an application uses it: one KafkaProducer with
 * {@code acks=all} (idempotent, Kafka's default since 3.0) and {@code linger.ms=0}, so a send
 * is answered once every in-sync replica has it; a KafkaConsumer assigned to the topic's
 * partitions from the beginning for reading back.  {@code create TOPIC PARTITIONS RF MISR}
 * (run by the harness through {@link Load}) makes the topics with the Admin client.
 */
final class KafkaClient implements Load.Client {
    private final String bootstrap;
    private final KafkaProducer<byte[], byte[]> producer;

    KafkaClient(String bootstrap) {
        this.bootstrap = bootstrap;
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        p.put("linger.ms", "0");
        p.put("request.timeout.ms", "10000");
        p.put("delivery.timeout.ms", "60000");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        producer = new KafkaProducer<>(p);
    }

    static void create(String bootstrap, String topic, int partitions, short rf, String minIsr) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(p)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, rf)
                .configs(Map.of("min.insync.replicas", minIsr)))).all().get();
        }
    }

    /** "LEADER ISR_SIZE" of partition 0 of {@code topic} (leader -1 while there is none). */
    static String partition(String bootstrap, String topic) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(p)) {
            TopicPartitionInfo info = admin.describeTopics(List.of(topic)).allTopicNames().get()
                .get(topic).partitions().get(0);
            int leader = info.leader() == null ? -1 : info.leader().id();
            return leader + " " + info.isr().size();
        }
    }

    @Override
    public void sendOne(String topic, byte[] body) throws Exception {
        producer.send(new ProducerRecord<>(topic, body)).get();
    }

    @Override
    public void sendBatch(String topic, byte[] body, int size) throws Exception {
        List<Future<RecordMetadata>> sent = new ArrayList<>(size);
        for (int i = 0; i < size; i++) {
            sent.add(producer.send(new ProducerRecord<>(topic, body)));
        }
        for (Future<RecordMetadata> f : sent) {
            f.get();
        }
    }

    @Override
    public void window(String topic, byte[] body, int n, int window) throws Exception {
        Semaphore free = new Semaphore(window);
        AtomicReference<Exception> failed = new AtomicReference<>();
        for (int i = 0; i < n && failed.get() == null; i++) {
            free.acquire();
            producer.send(new ProducerRecord<>(topic, body), (md, e) -> {
                if (e != null) {
                    failed.compareAndSet(null, e);
                }
                free.release();
            });
        }
        free.acquire(window);
        if (failed.get() != null) {
            throw new IllegalStateException("a windowed send failed: " + failed.get(), failed.get());
        }
    }

    @Override
    public long read(String topic, long n) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("enable.auto.commit", "false");
        p.put("max.poll.records", "2000");
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        long got = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(topic)) {
                parts.add(new TopicPartition(topic, info.partition()));
            }
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            long deadline = System.nanoTime() + 120_000_000_000L;
            while (got < n && System.nanoTime() < deadline) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(2000));
                got += records.count();
            }
        }
        return got;
    }

    @Override
    public void probe(String topic, byte[] body, long timeoutMs) throws Exception {
        // The producer retries until delivery.timeout.ms itself: the first send answered is
        // the first one acked after the kill.
        producer.send(new ProducerRecord<>(topic, body)).get(timeoutMs, TimeUnit.MILLISECONDS);
    }

    @Override
    public void close() {
        producer.close(Duration.ofSeconds(5));
    }
}
