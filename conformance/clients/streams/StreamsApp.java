// StreamsApp is the Kafka Streams application of TestStreamsExactlyOnceSwitch
// (conformance/streams_test.go): the Go test compiles it with javac against
// the Kafka Streams jars (conformance/maven-streams/pom.xml) and Kafka's, and
// runs it as
//
//	StreamsApp BOOTSTRAP APPLICATION_ID INPUT OUTPUT STATE_DIR
//
// Input records carry the value "KEY NUMBER" (NUMBER unique per record) under
// a key of their own; the topology re-keys each by KEY (a repartition topic),
// aggregates per KEY into a persistent store with a changelog, the value
// "COUNT NUMBER" (how many records of KEY so far, and the number of the last
// one), and writes every update to OUTPUT. exactly_once_v2, no store cache,
// so each input record yields exactly one output record.
//
// It prints one JSON line on stdout per state change ({"state":"RUNNING"})
// and per uncaught exception ({"uncaught":"..."}, after which the thread is
// replaced, as a production application would); diagnostics go to stderr.
// It closes and exits 0 when stdin ends.

import java.io.IOException;
import java.time.Duration;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public final class StreamsApp {
    public static void main(String[] argv) throws Exception {
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        if (argv.length != 5 && argv.length != 6) {
            System.err.println("usage: StreamsApp BOOTSTRAP APPLICATION_ID INPUT OUTPUT STATE_DIR [GROUP_PROTOCOL]");
            System.exit(2);
        }
        String bootstrap = argv[0], appID = argv[1], input = argv[2], output = argv[3], stateDir = argv[4];
        // classic (Streams' default) or streams (KIP-1071: the group
        // coordinator assigns the tasks, StreamsGroupHeartbeat).
        String groupProtocol = argv.length == 6 ? argv[5] : "classic";

        Properties p = new Properties();
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appID);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        p.put("group.protocol", groupProtocol);
        // A short commit interval and purge interval, so that a test of a
        // minute sees many transactions and repartition purges.
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        p.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, 500);
        // The broker's smallest session: a member left behind on the
        // cluster a switch left expires there soon. (With the streams
        // protocol the broker sets both: group.streams.*.)
        if (groupProtocol.equals("classic")) {
            p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
            p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1500);
        }

        StreamsBuilder b = new StreamsBuilder();
        b.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .selectKey((k, v) -> v.split(" ", 2)[0])
            .groupByKey(Grouped.with("rekey", Serdes.String(), Serdes.String()))
            .aggregate(() -> "0 -1",
                (key, v, agg) -> (Long.parseLong(agg.split(" ", 2)[0]) + 1) + " " + v.split(" ", 2)[1],
                Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("counts")
                    .withKeySerde(Serdes.String())
                    .withValueSerde(Serdes.String())
                    .withCachingDisabled())
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(b.build(), p);
        streams.setStateListener((now, before) -> emit("{\"state\":\"" + now + "\"}"));
        streams.setUncaughtExceptionHandler(e -> {
            emit("{\"uncaught\":" + quote(e.toString()) + "}");
            e.printStackTrace();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.REPLACE_THREAD;
        });
        streams.start();
        try {
            while (System.in.read() >= 0) {
            }
        } catch (IOException e) {
            // stdin gone: close as on its end
        }
        streams.close(Duration.ofSeconds(30));
        emit("{\"closed\":true}");
        System.exit(0);
    }

    static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String quote(String s) {
        StringBuilder q = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                q.append('\\').append(c);
            } else if (c < 0x20) {
                q.append(String.format("\\u%04x", (int) c));
            } else {
                q.append(c);
            }
        }
        return q.append('"').toString();
    }
}
