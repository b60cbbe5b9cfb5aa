package mirror

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// produceN produces n records to topic with the client's settings,
// synchronously in groups of batch records (so batches hold several
// records), and fails the test on error.
func produceN(t *testing.T, cl *kgo.Client, topic string, partition int32, n, batch int, tag string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < n; i += batch {
		var rs []*kgo.Record
		for j := i; j < min(n, i+batch); j++ {
			rs = append(rs, &kgo.Record{
				Topic: topic, Partition: partition,
				Key:     []byte(fmt.Sprintf("k%d", j%7)),
				Value:   []byte(fmt.Sprintf("%s value %d %s", tag, j, "some repetitive payload payload payload payload")),
				Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(tag)}},
			})
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatalf("producing to %s: %v", topic, err)
		}
	}
}

func manualPartitioner() kgo.Opt { return kgo.RecordPartitioner(kgo.ManualPartitioner()) }

// TestMirrorCodecs: batches of every codec land at their source offsets
// with byte-equal payloads (no decompression, no recompression), plain and
// idempotent producers alike.
func TestMirrorCodecs(t *testing.T) {
	a, _ := clusters(t)
	codecs := map[string]kgo.CompressionCodec{
		"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
		"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
	}
	var topics []string
	for name, codec := range codecs {
		topic := "codec-" + name
		topics = append(topics, topic)
		createTopic(t, a, topic, 2, nil)
		idem := newClient(t, a, kgo.ProducerBatchCompression(codec), manualPartitioner(), kgo.ProducerLinger(0))
		plain := newClient(t, a, kgo.ProducerBatchCompression(codec), manualPartitioner(), kgo.DisableIdempotentWrite())
		produceN(t, idem, topic, 0, 300, 50, "idem")
		produceN(t, plain, topic, 0, 120, 40, "plain")
		produceN(t, plain, topic, 1, 10, 1, "single")
	}
	m := startMirror(t, Topics(topics, nil))
	waitCaughtUp(t, m, topics...)
	// More while running.
	for name, codec := range codecs {
		cl := newClient(t, a, kgo.ProducerBatchCompression(codec), manualPartitioner())
		produceN(t, cl, "codec-"+name, 1, 100, 25, "live")
	}
	waitCaughtUp(t, m, topics...)
	for _, topic := range topics {
		for p := range int32(2) {
			sameBatches(t, topic, p)
			unc, _ := sameRecords(t, topic, p)
			if p == 0 && len(unc) != 420 {
				t.Fatalf("%s[0]: %d records, want 420", topic, len(unc))
			}
		}
	}
	for _, st := range m.Status() {
		if st.State != StateCaughtUp || st.LagRecords != 0 || st.Mirrored != st.SourceEnd {
			t.Errorf("status %+v, want caught up with zero lag", st)
		}
	}
}
