// The Kafka Streams application of `kop-dedup bench --streams-restart`: it keeps the
// latest value of each key of its input in a keyed state store (RocksDB, with its
// changelog <application.id>-store-changelog), with processing.guarantee=exactly_once_v2.
//
//   java -cp '<classes>:<kafka libs>/*' StreamsStore <bootstrap> <application.id> <input>
//        <state dir> <value bytes> <commit interval ms>
//
// (compiled once by kop_dedup_tools.bench.streams_app, as tests/java/StreamsCount.java
// is by the tests.)
//
// The input is small (a key and a sequence number); each record's value is widened to
// <value bytes> characters before the store (pseudo-random letters, so nothing on the way
// compresses it away), so the changelog grows by about <value bytes> per input record
// while the input stays small. The record cache is off: every input record is one
// changelog record.
//
// On stdout, one line each:
//   state <old> -> <new>                               every state change
//   processed <n>                                      each second it has moved
//   restore-start <topic> <partition> <from> <to>      a changelog partition's restore begins
//   restoring <records>                                records restored so far, every 2 s at most
//   restore-end <topic> <partition> <records> <ms>     ... and ends
// SIGTERM closes the application (a last commit, the checkpoints written, the group left).
import java.time.Duration;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

public class StreamsStore {
    static final AtomicLong processed = new AtomicLong();
    static final AtomicLong restored = new AtomicLong();
    static volatile long lastSaid = 0L;

    public static void main(String[] argv) throws Exception {
        String bootstrap = argv[0];
        String applicationId = argv[1];
        String input = argv[2];
        String stateDir = argv[3];
        int valueBytes = Integer.parseInt(argv[4]);
        int commitMs = Integer.parseInt(argv[5]);

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitMs);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // as the tests: a killed instance's member leaves the group after 6 s, not 45 s
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1000);
        // values of kilobytes: batches of 256 KiB rather than the default 16 KiB (a few
        // records each)
        props.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), 262144);

        // pseudo-random letters, twice the value's length: value i is a window of it
        Random random = new Random(42);
        StringBuilder letters = new StringBuilder(2 * valueBytes);
        for (int i = 0; i < 2 * valueBytes; i++) {
            letters.append((char) ('a' + random.nextInt(26)));
        }
        String pad = letters.toString();

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .peek((key, value) -> progress())
                .mapValues(value -> widen(value, pad, valueBytes))
                .toTable(Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("store")
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch done = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            say("state " + before + " -> " + now);
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
                done.countDown();
            }
        });
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long from, long to) {
                say("restore-start " + tp.topic() + " " + tp.partition() + " " + from + " " + to);
                starts.put(tp, System.nanoTime());
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long end, long n) {
                long total = restored.addAndGet(n);
                long now = System.nanoTime();
                if (now - lastSaid > 2_000_000_000L) {
                    lastSaid = now;
                    say("restoring " + total);
                }
            }

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                Long started = starts.get(tp);
                long ms = started == null ? -1 : (System.nanoTime() - started) / 1_000_000L;
                say("restore-end " + tp.topic() + " " + tp.partition() + " " + total + " " + ms);
            }

            final java.util.concurrent.ConcurrentHashMap<TopicPartition, Long> starts =
                    new java.util.concurrent.ConcurrentHashMap<>();
        });
        streams.setUncaughtExceptionHandler(exception -> {
            say("uncaught " + exception);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(60))));
        ScheduledExecutorService ticker = Executors.newSingleThreadScheduledExecutor(runnable -> {
            Thread thread = new Thread(runnable, "progress");
            thread.setDaemon(true);
            return thread;
        });
        ticker.scheduleAtFixedRate(StreamsStore::sayProcessed, 1, 1, TimeUnit.SECONDS);
        streams.start();
        done.await();
        System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
    }

    static String widen(String value, String pad, int valueBytes) {
        String head = value + ":";
        if (head.length() >= valueBytes) {
            return head;
        }
        int at = (int) (Math.abs((long) value.hashCode()) % valueBytes);
        return head + pad.substring(at, at + valueBytes - head.length());
    }

    static void progress() {
        processed.incrementAndGet();
    }

    static long lastProcessed = 0L;

    static void sayProcessed() {
        long n = processed.get();
        if (n != lastProcessed) {
            lastProcessed = n;
            say("processed " + n);
        }
    }

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }
}
