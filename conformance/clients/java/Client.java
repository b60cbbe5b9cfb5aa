// Client is the Java (kafka-clients) member of Ferry's client conformance
// matrix. The Go tests in conformance/ compile it with javac against the
// Kafka jars and run it as
//
//	produce --bootstrap B --topic T --count N [--compression C] [--transactional-id X]
//	consume --bootstrap B --topic T --group G --count N [--isolation read_committed]
//	        [--group-protocol classic|consumer]
//	admin   --bootstrap B [--topic T] [--replication-factor R]
//	produce-steady --bootstrap B --topic T --count N --duration S
//	stream --bootstrap B --partitions P --rate R [--produce T] [--txn T:ID]
//	       [--consume NAME:T:GROUP:PROTOCOL:ISOLATION]...
//	share-consume --bootstrap B --topic T --group G [--consumers K] [--ack explicit|implicit]
//
// produce and consume print one JSON line per record (see ../README.md);
// admin prints one JSON object; produce-steady prints one line per
// acknowledged record and a summary line. Diagnostics go to stderr. Any failure exits
// non-zero.

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class Client {
    /** How long consume waits for --count records before giving up. */
    static final Duration CONSUME_TIMEOUT = Duration.ofSeconds(60);
    /** Records per transaction in transactional produce. */
    static final int TXN_BATCH = 25;

    public static void main(String[] argv) throws Exception {
        // Keep the clients' INFO chatter out of the test logs unless asked for.
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        if (argv.length < 1) {
            usage("missing mode");
        }
        Map<String, String> a = flags(argv);
        switch (argv[0]) {
            case "produce" -> produce(a);
            case "consume" -> consume(a);
            case "admin" -> admin(a);
            case "produce-steady" -> produceSteady(a);
            case "stream" -> Streaming.run(argv);
            case "share-consume" -> shareConsume(a);
            default -> usage("unknown mode " + argv[0]);
        }
    }

    // ---- security ----

    // security adds the client-side security settings the tests pass in
    // the environment (clients/README.md, "Security"): nothing when
    // CONFORMANCE_SECURITY_PROTOCOL is unset.
    static void security(Properties p) {
        String proto = System.getenv("CONFORMANCE_SECURITY_PROTOCOL");
        if (proto == null || proto.isEmpty()) {
            return;
        }
        p.put("security.protocol", proto);
        String ca = System.getenv("CONFORMANCE_SSL_CA_FILE");
        if (ca != null && !ca.isEmpty()) {
            p.put("ssl.truststore.type", "PEM");
            p.put("ssl.truststore.location", ca);
        }
        String mech = System.getenv("CONFORMANCE_SASL_MECHANISM");
        if (mech != null && !mech.isEmpty()) {
            p.put("sasl.mechanism", mech);
            String module = mech.startsWith("SCRAM-")
                ? "org.apache.kafka.common.security.scram.ScramLoginModule"
                : "org.apache.kafka.common.security.plain.PlainLoginModule";
            p.put("sasl.jaas.config", module + " required username=\"" + System.getenv("CONFORMANCE_SASL_USERNAME")
                + "\" password=\"" + System.getenv("CONFORMANCE_SASL_PASSWORD") + "\";");
        }
    }

    // ---- produce ----

    static void produce(Map<String, String> a) throws Exception {
        String topic = need(a, "topic");
        int count = Integer.parseInt(need(a, "count"));
        String txnId = a.get("transactional-id");

        Properties p = new Properties();
        security(p);
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, need(a, "bootstrap"));
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, a.getOrDefault("compression", "none"));
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "4096"); // several batches per partition
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
        if (txnId != null) {
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        }
        String run = randomToken();
        long base = System.currentTimeMillis() - count; // explicit, distinct, in the past

        try (KafkaProducer<String, String> producer =
                new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            if (txnId != null) {
                producer.initTransactions();
            }
            List<ProducerRecord<String, String>> records = new ArrayList<>(count);
            List<Future<RecordMetadata>> acks = new ArrayList<>(count);
            List<Boolean> aborted = new ArrayList<>(count);
            int batch = txnId == null ? count : TXN_BATCH;
            for (int start = 0, n = 0; start < count; start += batch, n++) {
                // Odd-numbered transactions are aborted: half committed, a marked set aborted.
                boolean abort = txnId != null && n % 2 == 1;
                if (txnId != null) {
                    producer.beginTransaction();
                }
                List<Future<RecordMetadata>> inTxn = new ArrayList<>();
                for (int i = start; i < Math.min(count, start + batch); i++) {
                    RecordHeaders h = new RecordHeaders();
                    h.add("h", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                    ProducerRecord<String, String> r = new ProducerRecord<>(
                            topic, null, base + i, "k-" + i, "v-" + i + "-" + run, h);
                    records.add(r);
                    Future<RecordMetadata> f = producer.send(r);
                    acks.add(f);
                    inTxn.add(f);
                    aborted.add(abort);
                }
                if (txnId != null) {
                    // Offsets of the records are needed even for aborted ones: flush first.
                    producer.flush();
                    for (Future<RecordMetadata> f : inTxn) {
                        f.get(60, TimeUnit.SECONDS);
                    }
                    if (abort) {
                        producer.abortTransaction();
                    } else {
                        producer.commitTransaction();
                    }
                }
            }
            producer.flush();
            StringBuilder out = new StringBuilder();
            for (int i = 0; i < records.size(); i++) {
                RecordMetadata md = acks.get(i).get(60, TimeUnit.SECONDS);
                ProducerRecord<String, String> r = records.get(i);
                out.append(recordJson(md.partition(), md.offset(), r.key(), r.value(),
                        r.headers(), r.timestamp(), aborted.get(i))).append('\n');
            }
            System.out.print(out);
            System.out.flush();
        }
    }

    // ---- produce-steady ----

    /** How long produce-steady waits for outstanding acks after its last send. */
    static final Duration STEADY_GRACE = Duration.ofSeconds(60);

    /**
     * Produces --count records spread evenly over --duration seconds with an
     * idempotent acks=all producer left at the client's default retries and
     * delivery timeout, as an application would have it. A failed record is
     * counted, never fatal. Prints one line per acknowledged record, then
     * {"acked":a,"failed":f,"first_error":"..."}.
     */
    static void produceSteady(Map<String, String> a) throws Exception {
        String topic = need(a, "topic");
        int count = Integer.parseInt(need(a, "count"));
        long durationNanos = (long) (Double.parseDouble(need(a, "duration")) * 1e9);

        Properties p = new Properties();
        security(p);
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, need(a, "bootstrap"));
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        String run = randomToken();
        long base = System.currentTimeMillis() - count; // explicit, distinct, in the past

        RecordMetadata[] acked = new RecordMetadata[count];
        AtomicReference<String> firstError = new AtomicReference<>();
        CountDownLatch done = new CountDownLatch(count);
        List<ProducerRecord<String, String>> records = new ArrayList<>(count);
        int ackedCount = 0;
        int failedCount;
        try (KafkaProducer<String, String> producer =
                new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            long start = System.nanoTime();
            for (int i = 0; i < count; i++) {
                long wait = start + durationNanos * i / count - System.nanoTime();
                if (wait > 0) {
                    TimeUnit.NANOSECONDS.sleep(wait);
                }
                RecordHeaders h = new RecordHeaders();
                h.add("h", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                ProducerRecord<String, String> r = new ProducerRecord<>(
                        topic, null, base + i, "k-" + i, "v-" + i + "-" + run, h);
                records.add(r);
                int idx = i;
                try {
                    producer.send(r, (md, err) -> {
                        if (err != null) {
                            firstError.compareAndSet(null, err.toString());
                        } else {
                            synchronized (acked) {
                                acked[idx] = md;
                            }
                        }
                        done.countDown();
                    });
                } catch (Exception e) {
                    firstError.compareAndSet(null, e.toString());
                    done.countDown();
                }
            }
            if (!done.await(STEADY_GRACE.toMillis(), TimeUnit.MILLISECONDS)) {
                firstError.compareAndSet(null, "unacknowledged " + STEADY_GRACE + " after the last send");
            }
            StringBuilder out = new StringBuilder();
            synchronized (acked) {
                for (int i = 0; i < count; i++) {
                    RecordMetadata md = acked[i];
                    if (md == null) {
                        continue;
                    }
                    ackedCount++;
                    ProducerRecord<String, String> r = records.get(i);
                    out.append(recordJson(md.partition(), md.offset(), r.key(), r.value(),
                            r.headers(), r.timestamp(), false)).append('\n');
                }
            }
            // Anything neither acknowledged nor failed by now counts as failed.
            failedCount = count - ackedCount;
            Map<String, Object> summary = new LinkedHashMap<>();
            summary.put("acked", ackedCount);
            summary.put("failed", failedCount);
            summary.put("first_error", firstError.get() == null ? "" : firstError.get());
            out.append(json(summary)).append('\n');
            System.out.print(out);
            System.out.flush();
            producer.close(Duration.ofSeconds(1));
        }
    }

    // ---- consume ----

    static void consume(Map<String, String> a) throws Exception {
        String topic = need(a, "topic");
        int count = Integer.parseInt(need(a, "count"));
        String protocol = a.getOrDefault("group-protocol", "classic");

        Properties p = new Properties();
        security(p);
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, need(a, "bootstrap"));
        p.put(ConsumerConfig.GROUP_ID_CONFIG, need(a, "group"));
        p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, a.getOrDefault("isolation", "read_uncommitted"));
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "100");

        long deadline = System.nanoTime() + CONSUME_TIMEOUT.toNanos();
        StringBuilder out = new StringBuilder();
        try (KafkaConsumer<String, String> consumer =
                new KafkaConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
            consumer.subscribe(List.of(topic));
            int got = 0;
            while (got < count && System.nanoTime() < deadline) {
                got += print(consumer.poll(Duration.ofMillis(200)), out);
            }
            // Drain to the end offsets (last stable offsets under read_committed),
            // so that extra records show up and the committed positions step over
            // trailing aborted records and transaction markers.
            Set<TopicPartition> assigned = consumer.assignment();
            Map<TopicPartition, Long> end = consumer.endOffsets(assigned);
            while (System.nanoTime() < deadline && !caughtUp(consumer, end)) {
                got += print(consumer.poll(Duration.ofMillis(200)), out);
            }
            if (got < count) {
                System.err.printf("consume: timed out with %d of %d records%n", got, count);
            }
            consumer.commitSync(Duration.ofSeconds(30));
        }
        System.out.print(out);
        System.out.flush();
    }

    static boolean caughtUp(KafkaConsumer<?, ?> c, Map<TopicPartition, Long> end) {
        for (Map.Entry<TopicPartition, Long> e : end.entrySet()) {
            if (c.position(e.getKey()) < e.getValue()) {
                return false;
            }
        }
        return true;
    }

    static int print(ConsumerRecords<String, String> recs, StringBuilder out) {
        for (ConsumerRecord<String, String> r : recs) {
            out.append(recordJson(r.partition(), r.offset(), r.key(), r.value(),
                    r.headers(), r.timestamp(), false)).append('\n');
        }
        return recs.count();
    }

    // ---- share-consume ----

    /**
     * Runs --consumers KafkaShareConsumers (default 2), each its own member of
     * share group --group, on --topic until stdin ends. Each prints, as it
     * happens, {"ev":"rec","consumer":i,"partition":p,"offset":o,"value":v,
     * "delivery_count":c} per record delivered; with --ack explicit (the
     * default) it accepts each record and commits the acknowledgements after
     * every poll, with --ack implicit the poll's records are accepted by the
     * commit. A commit prints {"ev":"ack_error","consumer":i,"partition":p,
     * "error":"..."} per partition that refused it (p -1: the commit failed
     * as a whole), then {"ev":"acked","consumer":i,"records":n}, n the
     * records on the partitions that took it. A poll that throws prints
     * {"ev":"error",...} and the consumer polls on. At the end each consumer
     * closes (leaving the group) and {"ev":"done","consumer":i} is printed.
     */
    static void shareConsume(Map<String, String> a) throws Exception {
        String topic = need(a, "topic");
        String group = need(a, "group");
        int n = Integer.parseInt(a.getOrDefault("consumers", "2"));
        boolean explicit = !"implicit".equals(a.getOrDefault("ack", "explicit"));
        java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
        List<Thread> threads = new ArrayList<>();
        AtomicReference<Throwable> failed = new AtomicReference<>();
        for (int i = 0; i < n; i++) {
            int id = i;
            Thread th = new Thread(() -> {
                try {
                    shareMember(need(a, "bootstrap"), topic, group, id, explicit, stop);
                } catch (Throwable e) {
                    failed.compareAndSet(null, e);
                    stop.set(true);
                }
            });
            th.start();
            threads.add(th);
        }
        try (var in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            while (!stop.get() && in.readLine() != null) {
                // any line: ignored; the end of stdin stops the consumers
            }
        }
        stop.set(true);
        for (Thread th : threads) {
            th.join();
        }
        if (failed.get() != null) {
            failed.get().printStackTrace();
            System.exit(1);
        }
    }

    static synchronized void emit(Map<String, Object> m) {
        System.out.println(json(m));
        System.out.flush();
    }

    static void shareMember(String bootstrap, String topic, String group, int id, boolean explicit,
            java.util.concurrent.atomic.AtomicBoolean stop) {
        Properties p = new Properties();
        security(p);
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, explicit ? "explicit" : "implicit");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50");
        try (org.apache.kafka.clients.consumer.KafkaShareConsumer<String, String> c =
                new org.apache.kafka.clients.consumer.KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
            c.subscribe(List.of(topic));
            while (!stop.get()) {
                ConsumerRecords<String, String> recs;
                try {
                    recs = c.poll(Duration.ofMillis(200));
                } catch (Exception e) {
                    Map<String, Object> m = new LinkedHashMap<>();
                    m.put("ev", "error");
                    m.put("consumer", id);
                    m.put("error", e.toString());
                    emit(m);
                    continue;
                }
                for (ConsumerRecord<String, String> r : recs) {
                    Map<String, Object> m = new LinkedHashMap<>();
                    m.put("ev", "rec");
                    m.put("consumer", id);
                    m.put("partition", r.partition());
                    m.put("offset", r.offset());
                    m.put("value", r.value());
                    m.put("delivery_count", r.deliveryCount().map(x -> (Object) (int) x).orElse(null));
                    emit(m);
                    if (explicit) {
                        c.acknowledge(r, org.apache.kafka.clients.consumer.AcknowledgeType.ACCEPT);
                    }
                }
                if (recs.isEmpty()) {
                    continue;
                }
                // Per failed partition an ack_error (partition -1: the commit
                // failed as a whole), then always one acked line with the
                // number of records on the partitions that took it.
                int ok = 0;
                try {
                    Set<Integer> failedParts = new java.util.HashSet<>();
                    for (var e : c.commitSync(Duration.ofSeconds(30)).entrySet()) {
                        if (e.getValue().isPresent()) {
                            failedParts.add(e.getKey().partition());
                            Map<String, Object> m = new LinkedHashMap<>();
                            m.put("ev", "ack_error");
                            m.put("consumer", id);
                            m.put("partition", e.getKey().partition());
                            m.put("error", e.getValue().get().toString());
                            emit(m);
                        }
                    }
                    for (ConsumerRecord<String, String> r : recs) {
                        if (!failedParts.contains(r.partition())) {
                            ok++;
                        }
                    }
                } catch (Exception e) {
                    Map<String, Object> m = new LinkedHashMap<>();
                    m.put("ev", "ack_error");
                    m.put("consumer", id);
                    m.put("partition", -1);
                    m.put("error", e.toString());
                    emit(m);
                }
                Map<String, Object> done = new LinkedHashMap<>();
                done.put("ev", "acked");
                done.put("consumer", id);
                done.put("records", ok);
                emit(done);
            }
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("ev", "done");
        m.put("consumer", id);
        emit(m);
    }

    // ---- admin ----

    static void admin(Map<String, String> a) throws Exception {
        String topic = a.getOrDefault("topic", "admin-" + randomToken());
        short rf = Short.parseShort(a.getOrDefault("replication-factor", "3"));
        Properties p = new Properties();
        security(p);
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, need(a, "bootstrap"));
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        Map<String, Object> seen = new LinkedHashMap<>();
        seen.put("topic", topic);
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        try (Admin admin = Admin.create(p)) {
            NewTopic nt = new NewTopic(topic, 3, rf).configs(Map.of("retention.ms", "3600000"));
            admin.createTopics(List.of(nt)).all().get(30, TimeUnit.SECONDS);
            seen.put("created", true);

            TopicDescription d = describeWhenReady(admin, topic);
            seen.put("partitions", d.partitions().size());
            seen.put("replicas", d.partitions().get(0).replicas().size());
            seen.put("config_before", topicConfigs(admin, res));

            Collection<AlterConfigOp> ops = List.of(
                    new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
                    new AlterConfigOp(new ConfigEntry("max.message.bytes", "2097152"), AlterConfigOp.OpType.SET));
            admin.incrementalAlterConfigs(Map.of(res, ops)).all().get(30, TimeUnit.SECONDS);
            seen.put("config_after", topicConfigs(admin, res));

            List<String> groups = new ArrayList<>();
            for (GroupListing g : admin.listGroups().all().get(30, TimeUnit.SECONDS)) {
                groups.add(g.groupId());
            }
            Collections.sort(groups);
            seen.put("groups", groups);

            admin.deleteTopics(List.of(topic)).all().get(30, TimeUnit.SECONDS);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (admin.listTopics().names().get(30, TimeUnit.SECONDS).contains(topic)) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("topic " + topic + " still listed 30s after delete");
                }
                Thread.sleep(100);
            }
            seen.put("deleted", true);
        }
        System.out.println(json(seen));
    }

    /** Describes topic, retrying while metadata has not yet propagated. */
    static TopicDescription describeWhenReady(Admin admin, String topic) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (true) {
            try {
                return admin.describeTopics(List.of(topic)).allTopicNames()
                        .get(30, TimeUnit.SECONDS).get(topic);
            } catch (java.util.concurrent.ExecutionException e) {
                if (System.nanoTime() > deadline) {
                    throw e;
                }
                Thread.sleep(100);
            }
        }
    }

    /** Returns the topic's configs that were set on the topic itself (not defaults). */
    static Map<String, String> topicConfigs(Admin admin, ConfigResource res) throws Exception {
        Config c = admin.describeConfigs(List.of(res)).all().get(30, TimeUnit.SECONDS).get(res);
        Map<String, String> m = new TreeMap<>();
        for (ConfigEntry e : c.entries()) {
            if (e.source() == ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG) {
                m.put(e.name(), e.value());
            }
        }
        return m;
    }

    // ---- stream ----

    /**
     * stream runs several roles at once, each on its own thread, until told
     * to stop: an idempotent producer (--produce T), a transactional one
     * (--txn T:ID) and consumer groups (--consume NAME:T:GROUP:PROTOCOL:ISOLATION,
     * repeatable). Each role prints, as it happens, one JSON line per event,
     * tagged with its name ("produce", "txn" or NAME): ack, rec, end (a
     * transaction's outcome), error, done. A stdin line "stop ROLE" stops one
     * role; end of stdin stops every role left. See ../README.md.
     */
    static final class Streaming {
        /** Records per transaction. */
        static final int TXN_RECORDS = 10;
        /** Every TXN_ABORT_EVERY-th transaction is aborted on purpose. */
        static final int TXN_ABORT_EVERY = 4;
        /** Pause between transactions, so that a transaction is a few a second. */
        static final long TXN_PAUSE_MS = 100;

        static final java.io.PrintStream OUT = new java.io.PrintStream(
                new java.io.BufferedOutputStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), 1 << 16),
                false, StandardCharsets.UTF_8);
        static final Map<String, java.util.concurrent.atomic.AtomicBoolean> STOPS = new java.util.concurrent.ConcurrentHashMap<>();

        static void emit(Map<String, Object> m) {
            String line = json(m);
            synchronized (OUT) {
                OUT.println(line);
            }
        }

        static Map<String, Object> ev(String role, String ev) {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("role", role);
            m.put("ev", ev);
            return m;
        }

        /** Prints the offsets a commit that succeeded acknowledged. */
        static void committed(String role, Map<TopicPartition, OffsetAndMetadata> offsets) {
            Map<String, Object> m = ev(role, "committed");
            Map<String, Object> offs = new LinkedHashMap<>();
            offsets.forEach((tp, o) -> offs.put(String.valueOf(tp.partition()), o.offset()));
            m.put("offsets", offs);
            emit(m);
        }

        static void ack(String role, String ev, int partition, long offset, String value, int txn) {
            Map<String, Object> m = ev(role, ev);
            m.put("partition", partition);
            m.put("offset", offset);
            m.put("value", value);
            if (txn > 0) {
                m.put("txn", txn);
            }
            emit(m);
        }

        /** Prints an error: code is the exception's class, and its cause's after a slash. */
        static void error(String role, Throwable e, boolean fatal) {
            if (e instanceof java.util.concurrent.ExecutionException && e.getCause() != null) {
                e = e.getCause();
            }
            String code = e.getClass().getSimpleName();
            if (e.getCause() != null && e.getCause() != e) {
                code += "/" + e.getCause().getClass().getSimpleName();
            }
            Map<String, Object> m = ev(role, "error");
            m.put("code", code);
            m.put("error", String.valueOf(e));
            m.put("fatal", fatal);
            emit(m);
        }

        static void run(String[] argv) throws Exception {
            String bootstrap = null;
            int partitions = 3;
            double rate = 100;
            List<Thread> roles = new ArrayList<>();
            List<Runnable> starts = new ArrayList<>();
            String produce = null, txn = null;
            List<String[]> consumes = new ArrayList<>();
            for (int i = 1; i < argv.length; i += 2) {
                if (i + 1 >= argv.length) {
                    usage("bad argument " + argv[i]);
                }
                String v = argv[i + 1];
                switch (argv[i]) {
                    case "--bootstrap" -> bootstrap = v;
                    case "--partitions" -> partitions = Integer.parseInt(v);
                    case "--rate" -> rate = Double.parseDouble(v);
                    case "--produce" -> produce = v;
                    case "--txn" -> txn = v;
                    case "--consume" -> {
                        String[] f = v.split(":");
                        if (f.length != 5) {
                            usage("--consume NAME:TOPIC:GROUP:PROTOCOL:ISOLATION, got " + v);
                        }
                        consumes.add(f);
                    }
                    default -> usage("bad argument " + argv[i]);
                }
            }
            if (bootstrap == null) {
                usage("missing --bootstrap");
            }
            final String b = bootstrap;
            final int parts = partitions;
            final double r = rate;
            if (produce != null) {
                final String topic = produce;
                roles.add(role("produce", stop -> produceRole(b, topic, parts, r, stop)));
            }
            if (txn != null) {
                String[] f = txn.split(":", 2);
                roles.add(role("txn", stop -> txnRole(b, f[0], f[1], parts, stop)));
            }
            for (String[] f : consumes) {
                roles.add(role(f[0], stop -> consumeRole(b, f[0], f[1], f[2], f[3], f[4], stop)));
            }
            Thread flusher = new Thread(() -> {
                while (true) {
                    synchronized (OUT) {
                        OUT.flush();
                    }
                    try {
                        Thread.sleep(50);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            });
            flusher.setDaemon(true);
            flusher.start();
            Thread control = new Thread(() -> {
                try (var in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                    for (String line; (line = in.readLine()) != null; ) {
                        String[] w = line.trim().split("\\s+");
                        if (w.length == 2 && w[0].equals("stop") && STOPS.containsKey(w[1])) {
                            STOPS.get(w[1]).set(true);
                        }
                    }
                } catch (java.io.IOException e) {
                    // Treated as end of input.
                }
                STOPS.values().forEach(s -> s.set(true));
            });
            control.setDaemon(true);
            control.start();
            for (Thread t : roles) {
                t.start();
            }
            for (Thread t : roles) {
                t.join();
            }
            synchronized (OUT) {
                OUT.flush();
            }
            // Client threads left behind (a producer's sender) must not hold the exit.
            System.exit(0);
        }

        interface Body {
            void run(java.util.concurrent.atomic.AtomicBoolean stop) throws Exception;
        }

        static Thread role(String name, Body body) {
            var stop = new java.util.concurrent.atomic.AtomicBoolean();
            STOPS.put(name, stop);
            return new Thread(() -> {
                try {
                    body.run(stop);
                } catch (Throwable e) {
                    error(name, e, true);
                }
                emit(ev(name, "done"));
            }, name);
        }

        /** An idempotent producer at the client's defaults, R records a second round robin over the partitions. */
        static void produceRole(String bootstrap, String topic, int partitions, double rate,
                java.util.concurrent.atomic.AtomicBoolean stop) throws Exception {
            Properties p = new Properties();
            security(p);
            p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
            p.put(ProducerConfig.ACKS_CONFIG, "all");
            String run = randomToken();
            long[] seq = new long[partitions];
            var outstanding = new java.util.concurrent.atomic.AtomicInteger();
            try (KafkaProducer<String, String> producer =
                    new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
                long start = System.nanoTime();
                for (long i = 0; !stop.get(); ) {
                    long wait = start + (long) (i * 1e9 / rate) - System.nanoTime();
                    if (wait > 0) {
                        Thread.sleep(Math.min(50, wait / 1_000_000 + 1));
                        continue;
                    }
                    int part = (int) (i++ % partitions);
                    String v = String.format("p%d-%06d-%s", part, ++seq[part], run);
                    outstanding.incrementAndGet();
                    try {
                        producer.send(new ProducerRecord<>(topic, part, null, v), (md, err) -> {
                            if (err != null) {
                                error("produce", err, false);
                            } else {
                                ack("produce", "ack", md.partition(), md.offset(), v, 0);
                            }
                            outstanding.decrementAndGet();
                        });
                    } catch (Exception e) {
                        outstanding.decrementAndGet();
                        error("produce", e, false);
                    }
                }
                long deadline = System.nanoTime() + STEADY_GRACE.toNanos();
                while (outstanding.get() > 0 && System.nanoTime() < deadline) {
                    Thread.sleep(20);
                }
                if (outstanding.get() > 0) {
                    error("produce", new IllegalStateException(outstanding.get()
                            + " records unacknowledged " + STEADY_GRACE + " after the last send"), false);
                }
                producer.close(Duration.ofSeconds(1));
            }
        }

        /**
         * A transactional producer: transactions of TXN_RECORDS records, every
         * TXN_ABORT_EVERY-th aborted on purpose. On an error it aborts and
         * carries on with a new transaction; an error the abort cannot get
         * past ends the role (fatal).
         */
        static void txnRole(String bootstrap, String topic, String txnId, int partitions,
                java.util.concurrent.atomic.AtomicBoolean stop) throws Exception {
            Properties p = new Properties();
            security(p);
            p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
            p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
            p.put(ProducerConfig.ACKS_CONFIG, "all");
            String run = randomToken();
            long[] seq = new long[partitions];
            try (KafkaProducer<String, String> producer =
                    new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
                producer.initTransactions();
                int k = 0;
                for (int n = 1; !stop.get(); n++) {
                    boolean abort = n % TXN_ABORT_EVERY == 0;
                    List<Future<RecordMetadata>> fs = new ArrayList<>();
                    List<String> vals = new ArrayList<>();
                    try {
                        producer.beginTransaction();
                        for (int j = 0; j < TXN_RECORDS; j++) {
                            int part = k++ % partitions;
                            String v = String.format("p%d-%06d-t%d-%s", part, ++seq[part], n, run);
                            vals.add(v);
                            fs.add(producer.send(new ProducerRecord<>(topic, part, null, v)));
                        }
                        producer.flush();
                        for (Future<RecordMetadata> f : fs) {
                            f.get(60, TimeUnit.SECONDS);
                        }
                        acks(fs, vals, n);
                        Map<String, Object> end = ev("txn", "end");
                        end.put("txn", n);
                        if (abort) {
                            producer.abortTransaction();
                            end.put("outcome", "aborted");
                        } else {
                            producer.commitTransaction();
                            end.put("outcome", "committed");
                        }
                        emit(end);
                    } catch (Exception e) {
                        error("txn", e, false);
                        acks(fs, vals, n);
                        try {
                            producer.abortTransaction();
                        } catch (Exception e2) {
                            error("txn", e2, true);
                            return;
                        }
                        Map<String, Object> end = ev("txn", "end");
                        end.put("txn", n);
                        end.put("outcome", "aborted");
                        end.put("after_error", true);
                        emit(end);
                    }
                    Thread.sleep(TXN_PAUSE_MS);
                }
                producer.close(Duration.ofSeconds(5));
            }
        }

        /** Prints an ack for each of fs that completed without error. */
        static void acks(List<Future<RecordMetadata>> fs, List<String> vals, int txn) {
            for (int i = 0; i < fs.size(); i++) {
                Future<RecordMetadata> f = fs.get(i);
                if (!f.isDone()) {
                    continue;
                }
                try {
                    RecordMetadata md = f.get();
                    ack("txn", "ack", md.partition(), md.offset(), vals.get(i), txn);
                } catch (Exception e) {
                    // Failed: the transaction's error says why.
                }
            }
        }

        /** A consumer group member that commits its position after every poll that returned records. */
        static void consumeRole(String bootstrap, String name, String topic, String group, String protocol,
                String isolation, java.util.concurrent.atomic.AtomicBoolean stop) throws Exception {
            Properties p = new Properties();
            security(p);
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
            p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
            try (KafkaConsumer<String, String> consumer =
                    new KafkaConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
                consumer.subscribe(List.of(topic));
                while (!stop.get()) {
                    try {
                        ConsumerRecords<String, String> recs = consumer.poll(Duration.ofMillis(200));
                        Map<TopicPartition, OffsetAndMetadata> next = new LinkedHashMap<>();
                        for (ConsumerRecord<String, String> r : recs) {
                            ack(name, "rec", r.partition(), r.offset(), r.value(), 0);
                            next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                        }
                        // What was read of the partitions still assigned,
                        // explicitly: the event then names exactly what the
                        // group acknowledged.
                        next.keySet().retainAll(consumer.assignment());
                        if (!next.isEmpty()) {
                            consumer.commitSync(next, Duration.ofSeconds(30));
                            committed(name, next);
                        }
                    } catch (org.apache.kafka.common.KafkaException | IllegalStateException e) {
                        // IllegalStateException: a partition was taken
                        // away between the check and the commit.
                        error(name, e, false);
                    }
                }
                try {
                    consumer.commitSync(Duration.ofSeconds(30));
                } catch (org.apache.kafka.common.KafkaException e) {
                    error(name, e, false);
                }
            }
        }
    }

    // ---- output ----

    static String recordJson(int partition, long offset, String key, String value,
            Iterable<Header> headers, long timestamp, boolean aborted) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("partition", partition);
        m.put("offset", offset);
        m.put("key", key);
        m.put("value", value);
        Map<String, String> h = new LinkedHashMap<>();
        for (Header x : headers) {
            h.put(x.key(), x.value() == null ? null : new String(x.value(), StandardCharsets.UTF_8));
        }
        m.put("headers", h);
        m.put("timestamp", timestamp);
        if (aborted) {
            m.put("aborted", true);
        }
        return json(m);
    }

    /** A small JSON encoder for maps, lists, strings, numbers and booleans. */
    static String json(Object o) {
        StringBuilder b = new StringBuilder();
        writeJson(b, o);
        return b.toString();
    }

    static void writeJson(StringBuilder b, Object o) {
        if (o == null) {
            b.append("null");
        } else if (o instanceof String s) {
            b.append('"');
            for (char c : s.toCharArray()) {
                switch (c) {
                    case '"' -> b.append("\\\"");
                    case '\\' -> b.append("\\\\");
                    case '\n' -> b.append("\\n");
                    default -> {
                        if (c < 0x20) {
                            b.append(String.format("\\u%04x", (int) c));
                        } else {
                            b.append(c);
                        }
                    }
                }
            }
            b.append('"');
        } else if (o instanceof Map<?, ?> m) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : m.entrySet()) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                writeJson(b, String.valueOf(e.getKey()));
                b.append(':');
                writeJson(b, e.getValue());
            }
            b.append('}');
        } else if (o instanceof Collection<?> c) {
            b.append('[');
            boolean first = true;
            for (Object x : c) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                writeJson(b, x);
            }
            b.append(']');
        } else {
            b.append(o); // Number, Boolean
        }
    }

    // ---- flags ----

    static Map<String, String> flags(String[] argv) {
        Map<String, String> m = new HashMap<>();
        for (int i = 1; i < argv.length; i++) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                usage("bad argument " + argv[i]);
            }
            m.put(argv[i].substring(2), argv[++i]);
        }
        return m;
    }

    static String need(Map<String, String> a, String name) {
        String v = a.get(name);
        if (v == null) {
            usage("missing --" + name);
        }
        return v;
    }

    static void usage(String why) {
        System.err.println("Client: " + why);
        System.err.println("usage: Client produce|consume|admin|produce-steady|stream|share-consume --bootstrap B [flags]");
        System.exit(2);
    }

    static String randomToken() {
        byte[] b = new byte[6];
        new SecureRandom().nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    private Client() {}
}
