// FleetProducer is fleetbench's Java (kafka-clients) producer: it produces
// one keyed record every interval milliseconds with the client's default
// settings (plus any key=value producer settings given after the fixed
// arguments) until its standard input closes, and prints one JSON line per
// record sent, per acknowledgement and, every 500 ms, the partition leaders
// in its metadata:
//
//	java FleetProducer BOOTSTRAP TOPIC INTERVAL_MS NAME [key=value...]
//
//	{"sent":SEQ,"at":MS}
//	{"ack":SEQ,"at":MS,"partition":P,"error":"..."}
//	{"leaders":{"0":1000,"1":0,...}}
//
// Times are milliseconds since the epoch. Diagnostics go to stderr.

import java.io.PrintStream;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.serialization.StringSerializer;

public final class FleetProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], name = args[3];
        long interval = Long.parseLong(args[2]);
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            p.put(kv[0], kv[1]);
        }
        PrintStream out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), false, "UTF-8");
        AtomicBoolean done = new AtomicBoolean();
        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                }
            } catch (java.io.IOException e) {
                // closed
            }
            done.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
            long next = System.currentTimeMillis();
            long leadersAt = 0;
            for (int seq = 0; !done.get(); seq++) {
                long now = System.currentTimeMillis();
                if (now - leadersAt >= 500) {
                    leadersAt = now;
                    List<PartitionInfo> parts = prod.partitionsFor(topic);
                    StringBuilder sb = new StringBuilder("{\"leaders\":{");
                    for (int i = 0; i < parts.size(); i++) {
                        PartitionInfo pi = parts.get(i);
                        if (i > 0) {
                            sb.append(',');
                        }
                        sb.append('"').append(pi.partition()).append("\":").append(pi.leader() == null ? -1 : pi.leader().id());
                    }
                    synchronized (out) {
                        out.println(sb.append("}}"));
                        out.flush();
                    }
                }
                final int s = seq;
                synchronized (out) {
                    out.println("{\"sent\":" + s + ",\"at\":" + System.currentTimeMillis() + "}");
                }
                prod.send(new ProducerRecord<>(topic, name + "-k" + (seq % 257), "fleetbench " + name + " record " + seq), (md, e) -> {
                    long at = System.currentTimeMillis();
                    String line = "{\"ack\":" + s + ",\"at\":" + at + ",\"partition\":" + (md == null ? -1 : md.partition())
                            + (e == null ? "" : ",\"error\":\"" + e.toString().replace("\\", "\\\\").replace("\"", "'") + "\"") + "}";
                    synchronized (out) {
                        out.println(line);
                        out.flush();
                    }
                });
                next += interval;
                long sleep = next - System.currentTimeMillis();
                if (sleep > 0) {
                    Thread.sleep(sleep);
                }
            }
            prod.flush();
        }
        out.flush();
    }
}
