// A Kafka Streams application for the exactly-once tests: it counts an input topic's
// records per value and writes each new count to an output topic, with
// processing.guarantee=exactly_once_v2.
//
//   java -cp '<kafka libs>/*' StreamsCount.java <bootstrap> <application.id> <input>
//        <output> <state dir> [<ms to sleep per count> [<stream threads> [<instance id>]]]
//
// (a source-file launch; tests/kafka_streams.py compiles it once with javac instead).
//
// The topology: the input (keyed records) is re-keyed by its value (a repartition topic,
// <application.id>-counts-repartition), counted in a state store (RocksDB with its
// changelog, <application.id>-counts-changelog) and each count is written to the output
// as <value> -> "<count>". The record cache is off, so every input record makes exactly
// one output record: a reader of the output sees, for each value, 1, 2, ..., n in order;
// a record processed twice shows as a repeated count, a lost one as a gap.
//
// The sleep per count slows the application down so that a test can kill it (SIGKILL)
// while a transaction is open (the sleep is after the repartition: the thread polls only
// when its tasks have nothing left to process, and a sleep before it would hold the
// counting task back until the whole input was read); every 10 counts it prints
// "processed <n>". Every
// state change is printed on stdout as "state <old> -> <new>"; SIGTERM closes the application (a commit and a clean leave).
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

public class StreamsCount {
    public static void main(String[] argv) throws Exception {
        String bootstrap = argv[0];
        String applicationId = argv[1];
        String input = argv[2];
        String output = argv[3];
        String stateDir = argv[4];
        long sleepMs = argv.length > 5 ? Long.parseLong(argv[5]) : 0L;
        int threads = argv.length > 6 ? Integer.parseInt(argv[6]) : 1;
        String instance = argv.length > 7 ? argv[7] : "";

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        // what the repartition topic's consumer has committed is deleted (DeleteRecords)
        // at the first commit after 500 ms, not 30 s: a test's run sees it done
        props.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, 500);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // a killed instance's member leaves the group 6 s after its last heartbeat (the
        // brokers' smallest session), not 45 s: the restarted one waits for that
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1000);
        if (!instance.isEmpty()) {
            // a static member (KIP-345): a restart within its session (30 s, room for a
            // JVM's start) takes its place back without a rebalance
            props.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, instance);
            props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 30000);
        }

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .groupBy((key, value) -> value, Grouped.with("counts", Serdes.String(), Serdes.String()))
                .count(Materialized.as("counts"))
                .toStream()
                .peek((value, count) -> progress(sleepMs))
                .map((value, count) -> KeyValue.pair(value, Long.toString(count)))
                .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch done = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("state " + before + " -> " + now);
            System.out.flush();
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
                done.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(exception -> {
            System.out.println("uncaught " + exception);
            System.out.flush();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(30))));
        streams.start();
        done.await();
        System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
    }

    static final java.util.concurrent.atomic.AtomicLong processed = new java.util.concurrent.atomic.AtomicLong();

    // Every 10 counts, "processed <n>" on stdout (n counts this process's counts,
    // uncommitted ones included); then the sleep.
    static void progress(long ms) {
        long n = processed.incrementAndGet();
        if (n % 10 == 0) {
            System.out.println("processed " + n);
            System.out.flush();
        }
        if (ms <= 0) {
            return;
        }
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
