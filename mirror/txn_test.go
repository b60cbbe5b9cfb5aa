package mirror

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
)

func txnClient(t *testing.T, id string) *kgo.Client {
	a, _ := clusters(t)
	return newClient(t, a, kgo.TransactionalID(id), manualPartitioner(), kgo.ProducerLinger(0))
}

func begin(t *testing.T, cl *kgo.Client) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
}

func end(t *testing.T, cl *kgo.Client, commit bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

// TestMirrorTransactions: committed, aborted and interleaved source
// transactions, some mirrored after the fact and some live: read_committed
// and read_uncommitted readers see the same records at the same offsets on
// both clusters, and every marker sits at its source offset with its type.
func TestMirrorTransactions(t *testing.T) {
	a, _ := clusters(t)
	const topic = "txn"
	createTopic(t, a, topic, 2, nil)
	ta, tb := txnClient(t, "src-ta"), txnClient(t, "src-tb")
	plain := newClient(t, a, manualPartitioner())

	round := func(tag string) {
		// commit of several batches
		begin(t, ta)
		produceN(t, ta, topic, 0, 3, 1, tag+"-c1")
		end(t, ta, true)
		// abort
		begin(t, ta)
		produceN(t, ta, topic, 0, 2, 1, tag+"-a1")
		end(t, ta, false)
		// interleaved: two open at once, plain data in between
		begin(t, ta)
		begin(t, tb)
		produceN(t, ta, topic, 0, 1, 1, tag+"-ta")
		produceN(t, tb, topic, 0, 2, 2, tag+"-tb")
		produceN(t, plain, topic, 0, 1, 1, tag+"-plain")
		produceN(t, ta, topic, 0, 1, 1, tag+"-ta")
		produceN(t, tb, topic, 0, 1, 1, tag+"-tb")
		end(t, ta, true)
		end(t, tb, false)
		// across partitions, and a partition with only a marker
		begin(t, tb)
		produceN(t, tb, topic, 0, 2, 1, tag+"-x0")
		produceN(t, tb, topic, 1, 2, 1, tag+"-x1")
		end(t, tb, true)
		produceN(t, plain, topic, 1, 3, 3, tag+"-plain1")
	}
	round("before")
	m := startMirror(t, Topics([]string{topic}, nil))
	waitCaughtUp(t, m, topic)
	round("live")
	waitCaughtUp(t, m, topic)

	for p := range int32(2) {
		sameBatches(t, topic, p)
		unc, com := sameRecords(t, topic, p)
		if p == 0 && (len(unc) != 2*13 || len(com) != 2*8) {
			t.Fatalf("partition 0: %d read_uncommitted, %d read_committed records; want 26 and 16", len(unc), len(com))
		}
	}
}

// TestMirrorLogStart: a source whose log start was raised (DeleteRecords)
// before mirroring: the standby is filled below it, then its own log start
// is raised to the same offset, and the records above are equal.
func TestMirrorLogStart(t *testing.T) {
	a, s := clusters(t)
	const topic = "logstart"
	createTopic(t, a, topic, 1, nil)
	cl := newClient(t, a, manualPartitioner())
	produceN(t, cl, topic, 0, 100, 10, "ls")
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var o kadm.Offsets
	o.AddOffset(topic, 0, 63, -1)
	if _, err := adm.DeleteRecords(ctx, o); err != nil {
		t.Fatal(err)
	}
	m := startMirror(t, Topics([]string{topic}, nil))
	waitCaughtUp(t, m, topic)
	// The log start is raised right after the writer catches up.
	testwait.Eventually(t, 20*time.Second, "the standby's log start raised to 63", func() error {
		if start, _ := offsetsOf(t, s, topic, 0); start != 63 {
			return fmt.Errorf("log start %d", start)
		}
		return nil
	})
	sameBatches(t, topic, 0)
	unc, _ := sameRecords(t, topic, 0)
	if len(unc) != 37 || unc[0].Offset != 63 {
		t.Fatalf("got %d records from %d, want 37 from 63", len(unc), unc[0].Offset)
	}
}

// TestMirrorLogStartAtEnd: a partition whose every record was deleted
// (log start = end on both clusters, as Kafka Streams leaves a repartition
// topic it has processed to the end and the mirror copies the purge) is
// mirrored again by a new writer session: the tail check finds no batch on
// the standby and lets it start. Before, the standby's fetch at its last
// offset answered OFFSET_OUT_OF_RANGE, and every start failed with it: after
// a switch the mirror never caught up (TestStreamsExactlyOnceSwitch).
func TestMirrorLogStartAtEnd(t *testing.T) {
	a, s := clusters(t)
	const topic = "logstart-end"
	createTopic(t, a, topic, 1, nil)
	cl := newClient(t, a, manualPartitioner())
	produceN(t, cl, topic, 0, 40, 10, "le")
	m := startMirror(t, Topics([]string{topic}, nil))
	waitCaughtUp(t, m, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var o kadm.Offsets
	o.AddOffset(topic, 0, 40, -1)
	if _, err := kadm.NewClient(cl).DeleteRecords(ctx, o); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "the standby's log start raised to its end, 40", func() error {
		if start, end := offsetsOf(t, s, topic, 0); start != 40 || end != 40 {
			return fmt.Errorf("log start %d, end %d", start, end)
		}
		return nil
	})
	m.Close()

	// A new session (a restart, or the mirror of a switch) goes on.
	m = startMirror(t, Topics([]string{topic}, nil))
	produceN(t, cl, topic, 0, 10, 10, "le2")
	if err := m.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatalf("the mirror did not catch up after its restart: %v\n%+v", err, m.Status())
	}
	sameBatches(t, topic, 0)
	unc, _ := sameRecords(t, topic, 0)
	if len(unc) != 10 || unc[0].Offset != 40 {
		t.Fatalf("got %d records, want 10 from 40: %+v", len(unc), unc)
	}
}

// TestMirrorCompactedHoles: a compacted source topic after a real cleaner
// run has holes between batches (and empty batches the cleaner kept for
// idempotent producers): the standby fills them and every surviving record
// sits at its source offset.
func TestMirrorCompactedHoles(t *testing.T) {
	a, _ := clusters(t)
	const topic = "compacted"
	createTopic(t, a, topic, 1, map[string]*string{
		"cleanup.policy":            kmsg.StringPtr("compact"),
		"segment.ms":                kmsg.StringPtr("100"),
		"min.cleanable.dirty.ratio": kmsg.StringPtr("0.01"),
		"delete.retention.ms":       kmsg.StringPtr("100"),
		"min.compaction.lag.ms":     kmsg.StringPtr("0"),
	})
	idem := newClient(t, a, manualPartitioner(), kgo.ProducerLinger(0))
	plain := newClient(t, a, manualPartitioner(), kgo.DisableIdempotentWrite())
	for i := range 6 {
		produceN(t, idem, topic, 0, 14, 1, "idem")  // keys k0..k6, one record per batch
		produceN(t, plain, topic, 0, 7, 1, "plain") // overwrites
		_ = i
		time.Sleep(150 * time.Millisecond) // roll segments
	}
	// Wait for the cleaner to leave holes.
	deadline := time.Now().Add(60 * time.Second)
	for {
		produceN(t, plain, topic, 0, 1, 1, "roll")
		holes := 0
		next := int64(-1)
		for _, b := range rawBatches(t, a, topic, 0) {
			if next >= 0 && b.BaseOffset() > next || b.NumRecords() == 0 {
				holes++
			}
			next = b.NextOffset()
		}
		if holes >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the log cleaner left no holes in a minute")
		}
		time.Sleep(500 * time.Millisecond)
	}
	m := startMirror(t, Topics([]string{topic}, nil))
	waitCaughtUp(t, m, topic)
	// Both cleaners keep running after the mirror copied the log (the
	// standby topic has the source's configs): the standby may still hold
	// records the source has since compacted away, and may itself have
	// compacted away records the source's cleaner has not reached yet
	// (seen in CI, the copy spanning the standby's 100 ms segments). Every
	// source record must be on the standby at its offset, unless the
	// standby holds a later record of its key, which is what compaction
	// removes; every source batch the standby holds must be the same bytes.
	src := map[int64]rec{}
	for _, r := range consumeAll(t, active, topic, 0, false) {
		src[r.Offset] = r
	}
	for _, rc := range []bool{false, true} {
		dst := make(map[int64]rec)
		latest := map[string]int64{} // key → its last offset on the standby
		for _, r := range consumeAll(t, standby, topic, 0, rc) {
			dst[r.Offset] = r
			latest[r.Key] = max(latest[r.Key], r.Offset)
		}
		if !rc {
			sameBatchesBut(t, topic, 0, func(b protocol.Batch) bool {
				for o := b.BaseOffset(); o < b.NextOffset(); o++ {
					if r, ok := src[o]; ok && latest[r.Key] <= o {
						return false
					}
				}
				return true
			})
		}
		for _, r := range consumeAll(t, active, topic, 0, rc) {
			d, ok := dst[r.Offset]
			if !ok && latest[r.Key] > r.Offset {
				continue // compacted on the standby
			}
			if d != r {
				t.Fatalf("read_committed=%v: source record %+v, standby %+v", rc, r, d)
			}
		}
	}
	// Offsets were filled: counted, since the standby's own cleaner may
	// already have removed the filler tombstones (their offsets stay).
	if n := testutil.ToFloat64(m.metrics.fillers); n == 0 {
		t.Fatal("no offset filled on the standby")
	}
}
