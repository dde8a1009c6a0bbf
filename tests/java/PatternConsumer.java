import java.time.Duration;
import java.util.Properties;
import java.util.TreeSet;

import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.SubscriptionPattern;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Kafka's Java consumer (group.protocol=consumer) subscribed by a server-side regular
 * expression (KIP-848's SubscriptionPattern), for the regex comparison of
 * tests/integration/test_kafka_consumer_protocol_regex.py.
 *
 * Arguments: bootstrap, group id, the expression, seconds to run. Prints
 * "assigned topic-partition,..." (sorted) each time its assignment changes.
 */
public class PatternConsumer {
    public static void main(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", args[1]);
        props.put("group.protocol", "consumer");
        props.put("auto.offset.reset", "earliest");
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        long until = System.currentTimeMillis() + Long.parseLong(args[3]) * 1000;
        String last = null;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(new SubscriptionPattern(args[2]));
            while (System.currentTimeMillis() < until) {
                consumer.poll(Duration.ofMillis(200));
                TreeSet<String> held = new TreeSet<>();
                for (TopicPartition tp : consumer.assignment()) held.add(tp.topic() + ":" + tp.partition());
                String now = String.join(",", held);
                if (!now.equals(last)) {
                    System.out.println("assigned " + now);
                    System.out.flush();
                    last = now;
                }
            }
        }
    }
}
