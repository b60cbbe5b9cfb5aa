package mirror

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
)

// compactedTopic is a compacted source topic whose producer compresses
// with codec (attr is the codec's value in batch attributes), and, when
// txn, produces each batch in a transaction of its own, committed.
type compactedTopic struct {
	name  string
	codec kgo.CompressionCodec
	attr  int8
	txn   bool
}

// produceCompacted creates the topics, compacted with a fast cleaner, and
// produces batches of several records to each until the real log cleaner
// has left at least wantHoles batches with holes inside them (records
// removed, base offset and lastOffsetDelta kept) in every topic, and
// transactional ones in a txn topic. It returns how many there were in all.
func produceCompacted(t *testing.T, topics []compactedTopic, wantHoles int) int {
	t.Helper()
	a, _ := clusters(t)
	clients := make([]*kgo.Client, len(topics))
	for i, tp := range topics {
		createTopic(t, a, tp.name, 1, map[string]*string{
			"cleanup.policy":            kmsg.StringPtr("compact"),
			"segment.ms":                kmsg.StringPtr("100"),
			"min.cleanable.dirty.ratio": kmsg.StringPtr("0.01"),
			"delete.retention.ms":       kmsg.StringPtr("100"),
			"min.compaction.lag.ms":     kmsg.StringPtr("0"),
		})
		opts := []kgo.Opt{manualPartitioner(), kgo.ProducerBatchCompression(tp.codec), kgo.ProducerLinger(20 * time.Millisecond)}
		if tp.txn {
			opts = append(opts, kgo.TransactionalID("src-"+tp.name))
		}
		clients[i] = newClient(t, a, opts...)
	}
	produce := func(round int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i, tp := range topics {
			// One batch: hot keys updated every round (compacted away
			// from older batches), keys unique to the round (kept) in
			// between, so that a batch keeps records once holed.
			var rs []*kgo.Record
			for j := range 24 {
				key := fmt.Sprintf("hot%d", j%4)
				if j%3 == 1 {
					key = fmt.Sprintf("u%d-%d", round, j)
				}
				rs = append(rs, &kgo.Record{Topic: tp.name, Partition: 0, Key: []byte(key),
					Value:     []byte(fmt.Sprintf("round %d record %d", round, j)),
					Headers:   []kgo.RecordHeader{{Key: "r", Value: []byte(fmt.Sprint(round))}, {Key: "j", Value: []byte(fmt.Sprint(j))}},
					Timestamp: time.UnixMilli(1_700_000_000_000 + int64(round)*1000 + int64(j)*7)})
			}
			if tp.txn {
				begin(t, clients[i])
			}
			if err := clients[i].ProduceSync(ctx, rs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if tp.txn {
				end(t, clients[i], true)
			}
		}
	}
	round := 0
	for ; round < 6; round++ {
		produce(round)
		time.Sleep(150 * time.Millisecond) // roll segments
	}
	innerHoles := func() (total, fewest int) {
		fewest = -1
		for _, tp := range topics {
			n := 0
			for _, b := range rawBatches(t, a, tp.name, 0) {
				if b.IsControl() {
					continue
				}
				if b.Compression() != tp.attr {
					t.Fatalf("%s: source batch at %d has codec %d, want %d", tp.name, b.BaseOffset(), b.Compression(), tp.attr)
				}
				if b.NumRecords() > 1 && !b.HasConsecutiveOffsets() && b.IsTransactional() == tp.txn {
					n++
				}
			}
			total += n
			if fewest < 0 || n < fewest {
				fewest = n
			}
		}
		return total, fewest
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		total, fewest := innerHoles()
		if fewest >= wantHoles {
			return total
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log cleaner left %d batches with holes inside them in a topic, want %d", fewest, wantHoles)
		}
		produce(round)
		round++
		time.Sleep(500 * time.Millisecond)
	}
}

// sourceRecordsOnStandby fails unless every record the source holds now is
// on the standby at its offset with the same key, value, headers and
// timestamp, read_committed and read_uncommitted, and the standby ends where
// the source does. As in TestMirrorCompactedHoles, the source's cleaner may
// remove more after the copy, and the standby's own cleaner compacts its
// copy: only source records are looked up.
func sourceRecordsOnStandby(t *testing.T, topic string) {
	t.Helper()
	a, s := clusters(t)
	for _, rc := range []bool{false, true} {
		dst := make(map[int64]rec)
		for _, r := range consumeAll(t, s, topic, 0, rc) {
			dst[r.Offset] = r
		}
		src := consumeAll(t, a, topic, 0, rc)
		if len(src) == 0 {
			t.Fatalf("%s: no source records", topic)
		}
		for _, r := range src {
			if dst[r.Offset] != r {
				t.Fatalf("%s read_committed=%v: source record %+v, standby %+v", topic, rc, r, dst[r.Offset])
			}
		}
	}
	_, se := offsetsOf(t, a, topic, 0)
	_, de := offsetsOf(t, s, topic, 0)
	if se != de {
		t.Fatalf("%s: source ends at %d, standby at %d", topic, se, de)
	}
}

func noHalts(t *testing.T, m *Mirror) {
	t.Helper()
	for _, st := range m.Status() {
		if st.State == StateHalted {
			t.Fatalf("%s[%d] halted: %v", st.Topic, st.Partition, st.Err)
		}
	}
}

// TestMirrorCompactedInnerHoles: an uncompressed compacted source topic
// whose batches hold several records each; after a real cleaner run some
// batches have holes inside them (records removed, base offset and
// lastOffsetDelta kept). The writer re-frames them into runs of
// consecutive records, fills the holes, and nothing halts: every surviving
// source record is on the standby at its offset, with the same key, value,
// headers and timestamp.
func TestMirrorCompactedInnerHoles(t *testing.T) {
	const topic = "compacted-inner"
	produceCompacted(t, []compactedTopic{{topic, kgo.NoCompression(), protocol.CompressionNone, false}}, 3)

	m := startMirror(t, Topics([]string{topic}, nil))
	waitCaughtUp(t, m, topic)
	noHalts(t, m)
	if n := testutil.ToFloat64(m.metrics.reframed); n < 3 {
		t.Fatalf("%v batches re-framed, want at least 3", n)
	}
	if n := testutil.ToFloat64(m.metrics.recompressed); n != 0 {
		t.Fatalf("%v uncompressed batches counted as recompressed", n)
	}
	sourceRecordsOnStandby(t, topic)
}

// TestMirrorCompactedInnerHolesCompressed: as TestMirrorCompactedInnerHoles,
// with one topic per codec whose producer compresses. The cleaner
// recompressed the batches it left with holes; the writer splits each into
// runs, each compressed again with the same codec.
//
// First, with RecompressCompacted(false), every partition halts with
// ErrUnsupportedBatch and the standby holds nothing of the batch. Then a
// mirror with the default goes on from there; each of its writers ends its
// session once right after a run that is not its batch's last, so the next
// session's tail check compares the standby's last batch with a
// recompressed run, and resumes between the runs.
func TestMirrorCompactedInnerHolesCompressed(t *testing.T) {
	topics := []compactedTopic{
		{"compacted-lz4", kgo.Lz4Compression(), protocol.CompressionLZ4, false},
		{"compacted-zstd", kgo.ZstdCompression(), protocol.CompressionZstd, false},
		{"compacted-gzip", kgo.GzipCompression(), protocol.CompressionGzip, false},
		{"compacted-snappy", kgo.SnappyCompression(), protocol.CompressionSnappy, false},
	}
	var names []string
	for _, tp := range topics {
		names = append(names, tp.name)
	}
	holed := produceCompacted(t, topics, 2)
	a, s := clusters(t)

	// Recompressing turned off: a halt at the first batch with holes.
	off := startMirror(t, Topics(names, nil), RecompressCompacted(false))
	testwait.Eventually(t, 60*time.Second, "every partition halted", func() error {
		st := off.Status()
		if len(st) != len(topics) {
			return fmt.Errorf("%d writers", len(st))
		}
		for _, p := range st {
			if p.State != StateHalted || !errors.Is(p.Err, ErrUnsupportedBatch) {
				return fmt.Errorf("%s: %v, %v", p.Topic, p.State, p.Err)
			}
		}
		return nil
	})
	if n := testutil.ToFloat64(off.metrics.halts.WithLabelValues("unsupported_batch")); n != float64(len(topics)) {
		t.Fatalf("%v unsupported_batch halts, want %d", n, len(topics))
	}
	if n := testutil.ToFloat64(off.metrics.recompressed); n != 0 {
		t.Fatalf("%v batches recompressed with recompressing off", n)
	}
	for _, p := range off.Status() {
		var halt *HaltError
		if !errors.As(p.Err, &halt) {
			t.Fatalf("%s: %v is not a HaltError", p.Topic, p.Err)
		}
		// The standby ends at the halted batch: nothing of it was written.
		if _, de := offsetsOf(t, s, p.Topic, 0); de != halt.Offset {
			t.Fatalf("%s: halted at %d, standby ends at %d", p.Topic, halt.Offset, de)
		}
		var b protocol.Batch
		for _, sb := range rawBatches(t, a, p.Topic, 0) {
			if sb.BaseOffset() == halt.Offset {
				b = sb
			}
		}
		if b == nil || b.Compression() == protocol.CompressionNone || b.HasConsecutiveOffsets() {
			t.Fatalf("%s: halted at %d, not at a compressed batch with holes", p.Topic, halt.Offset)
		}
	}
	off.Close()

	// Recompressing on (the default), one session end between runs per
	// topic.
	var mu sync.Mutex
	stopped := map[string]bool{}
	testHookRunWritten = func(topic string, _ protocol.Batch, i, n int, _ bool) error {
		mu.Lock()
		defer mu.Unlock()
		if stopped[topic] || i == n-1 {
			return nil
		}
		stopped[topic] = true
		return fmt.Errorf("test: session ends after run %d of %d", i+1, n)
	}
	t.Cleanup(func() { testHookRunWritten = nil }) // after the mirror's Close (cleanups run last first)
	m := startMirror(t, Topics(names, nil))
	waitCaughtUp(t, m, names...)
	noHalts(t, m)
	mu.Lock()
	for _, tp := range topics {
		if !stopped[tp.name] {
			t.Fatalf("%s: the writer never stopped between runs", tp.name)
		}
	}
	mu.Unlock()
	if n := testutil.ToFloat64(m.metrics.recompressed); n < float64(holed) {
		t.Fatalf("%v batches recompressed, want at least %d", n, holed)
	}
	if n := testutil.ToFloat64(m.metrics.reframed); n != 0 {
		t.Fatalf("%v compressed batches counted as re-framed uncompressed", n)
	}
	for _, tp := range topics {
		sourceRecordsOnStandby(t, tp.name)
		// The runs are compressed with the source's codec. (Fillers are
		// not; the standby's own cleaner may have emptied them, or set
		// a delete horizon, which IsFillerBatch does not recognise.)
		for _, b := range rawBatches(t, s, tp.name, 0) {
			if !b.IsControl() && !fillerRecords(t, b) && b.Compression() != tp.attr {
				t.Fatalf("%s: standby batch %d..%d (%d records) has codec %d, want %d",
					tp.name, b.BaseOffset(), b.NextOffset()-1, b.NumRecords(), b.Compression(), tp.attr)
			}
		}
	}
}

// fillerRecords reports whether b is uncompressed and every record it holds
// (maybe none) has the filler key.
func fillerRecords(t *testing.T, b protocol.Batch) bool {
	t.Helper()
	if b.Compression() != protocol.CompressionNone {
		return false
	}
	for p := b.Payload(); len(p) > 0; {
		l, k := binary.Varint(p)
		if k <= 0 || l < 0 || int(l) > len(p)-k {
			t.Fatalf("standby batch at %d: bad record", b.BaseOffset())
		}
		var r kmsg.Record
		if err := r.ReadFrom(p[:k+int(l)]); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Key, protocol.FillerKey) {
			return false
		}
		p = p[k+int(l):]
	}
	return true
}
