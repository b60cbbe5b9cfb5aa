package mirror

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
)

// TestMirrorCompactedInnerHoles: an uncompressed compacted source topic
// whose batches hold several records each; after a real cleaner run some
// batches have holes inside them (records removed, base offset and
// lastOffsetDelta kept). The writer re-frames them into runs of
// consecutive records, fills the holes, and nothing halts: every surviving
// source record is on the standby at its offset, with the same key, value,
// headers and timestamp.
func TestMirrorCompactedInnerHoles(t *testing.T) {
	a, s := clusters(t)
	const topic = "compacted-inner"
	createTopic(t, a, topic, 1, map[string]*string{
		"cleanup.policy":            kmsg.StringPtr("compact"),
		"segment.ms":                kmsg.StringPtr("100"),
		"min.cleanable.dirty.ratio": kmsg.StringPtr("0.01"),
		"delete.retention.ms":       kmsg.StringPtr("100"),
		"min.compaction.lag.ms":     kmsg.StringPtr("0"),
	})
	cl := newClient(t, a, manualPartitioner(), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerLinger(20*time.Millisecond))
	produce := func(round int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// One batch: hot keys updated every round (compacted away from
		// older batches), keys unique to the round (kept) in between.
		var rs []*kgo.Record
		for j := range 24 {
			key := fmt.Sprintf("hot%d", j%4)
			if j%3 == 1 {
				key = fmt.Sprintf("u%d-%d", round, j)
			}
			rs = append(rs, &kgo.Record{Topic: topic, Partition: 0, Key: []byte(key),
				Value:     []byte(fmt.Sprintf("round %d record %d", round, j)),
				Headers:   []kgo.RecordHeader{{Key: "r", Value: []byte(fmt.Sprint(round))}, {Key: "j", Value: []byte(fmt.Sprint(j))}},
				Timestamp: time.UnixMilli(1_700_000_000_000 + int64(round)*1000 + int64(j)*7)})
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	round := 0
	for ; round < 6; round++ {
		produce(round)
		time.Sleep(150 * time.Millisecond) // roll segments
	}
	innerHoles := func() int {
		n := 0
		for _, b := range rawBatches(t, a, topic, 0) {
			if b.Compression() != protocol.CompressionNone {
				t.Fatalf("source batch at %d is compressed", b.BaseOffset())
			}
			if !b.IsControl() && b.NumRecords() > 1 && !b.HasConsecutiveOffsets() {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	for innerHoles() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the log cleaner left no batch with holes inside it in a minute")
		}
		produce(round)
		round++
		time.Sleep(500 * time.Millisecond)
	}

	m := startMirror(t, Topics([]string{topic}, nil))
	waitCaughtUp(t, m, topic)
	for _, st := range m.Status() {
		if st.State == StateHalted {
			t.Fatalf("%s[%d] halted: %v", st.Topic, st.Partition, st.Err)
		}
	}
	if n := testutil.ToFloat64(m.metrics.reframed); n < 3 {
		t.Fatalf("%v batches re-framed, want at least 3", n)
	}
	// As in TestMirrorCompactedHoles, the source's cleaner may remove more
	// after the copy: every source record must be on the standby at its
	// offset.
	for _, rc := range []bool{false, true} {
		dst := make(map[int64]rec)
		for _, r := range consumeAll(t, s, topic, 0, rc) {
			dst[r.Offset] = r
		}
		src := consumeAll(t, a, topic, 0, rc)
		if len(src) == 0 {
			t.Fatal("no source records")
		}
		for _, r := range src {
			if dst[r.Offset] != r {
				t.Fatalf("read_committed=%v: source record %+v, standby %+v", rc, r, dst[r.Offset])
			}
		}
	}
	// (The standby's own cleaner compacts its copy too, so its batches
	// may have holes by now.) The standby ends where the source does.
	_, se := offsetsOf(t, a, topic, 0)
	_, de := offsetsOf(t, s, topic, 0)
	if se != de {
		t.Fatalf("source ends at %d, standby at %d", se, de)
	}

}
