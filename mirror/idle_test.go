package mirror

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestIdlePartitionFetchesRarely: a partition with nothing new is fetched
// with a wait that doubles up to idleFetchMaxWait (each fetch of an idle
// partition is a round trip of CPU, per partition), and a record appended
// while such a long fetch waits at the leader is mirrored at once, not when
// the wait ends: the leader answers the fetch as soon as it has a byte.
func TestIdlePartitionFetchesRarely(t *testing.T) {
	a, s := clusters(t)
	const topic = "idle-fetch"
	createTopic(t, a, topic, 1, nil)
	src := newClient(t, a, manualPartitioner())
	produceN(t, src, topic, 0, 1, 1, "first")

	var mu sync.Mutex
	var waits []time.Duration
	longWait := make(chan time.Time, 1)
	m := startMirror(t, Topics([]string{topic}, nil), func(c *config) {
		c.onFetch = func(tp string, _ int32, wait time.Duration) {
			if tp != topic {
				return
			}
			mu.Lock()
			waits = append(waits, wait)
			mu.Unlock()
			if wait >= 6*time.Second {
				select {
				case longWait <- time.Now():
				default:
				}
			}
		}
	})
	waitCaughtUp(t, m, topic)

	// Idle: 100 ms, 200 ms, … 6.4 s is reached after about 6.3 s of empty
	// fetches.
	var sent time.Time
	select {
	case sent = <-longWait:
	case <-time.After(60 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("no fetch waited 6 s or more in a minute idle: waits %v", waits)
	}
	mu.Lock()
	n := len(waits)
	mu.Unlock()
	// At a flat 100 ms, the ~6.3 s of idleness would have been 60 fetches
	// and more.
	if n > 15 {
		t.Errorf("%d fetches before the wait reached 6 s, want the wait doubling (about 8): %v", n, waits)
	}

	// A record appended while that fetch waits is mirrored well before its
	// wait would end.
	produceN(t, src, topic, 0, 1, 1, "second")
	dst := newClient(t, s, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithDeadline(context.Background(), sent.Add(4*time.Second))
	defer cancel()
	got := 0
	for got < 2 {
		fs := dst.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the record appended during a 6 s fetch wait was not mirrored within 4 s of the fetch (%d of 2 records on the standby)", got)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset != int64(got) {
				t.Fatalf("record at offset %d, want %d", r.Offset, got)
			}
			got++
		})
	}
	// The fetch after the one that returned the record waits FetchMaxWait
	// again.
	for deadline := time.Now().Add(10 * time.Second); ; {
		mu.Lock()
		after := waits[n:]
		back := false
		for _, w := range after {
			back = back || w == 100*time.Millisecond
		}
		mu.Unlock()
		if back {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after records, the fetches wait %v, want FetchMaxWait (100ms) again first", after)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIdlePartitionsPark: partitions idle long enough park (watch.go): their
// writers hold no connection, and one fetch session per source broker
// watches them all. A record appended to one parked partition wakes that
// partition's writer only, and is mirrored at its offset; the partition
// parks again, and a second record wakes it again (the session forgets a
// woken partition before naming it again, so the broker compares it with
// its log afresh). A source transaction left open wakes nothing that can
// copy; its commit does, and the committed record is mirrored.
func TestIdlePartitionsPark(t *testing.T) {
	a, s := clusters(t)
	const topic, parts = "idle-park", 8
	createTopic(t, a, topic, parts, nil)
	src := newClient(t, a, manualPartitioner())
	for p := range int32(parts) {
		produceN(t, src, topic, p, 1, 1, "first")
	}

	var mu sync.Mutex
	fetches := make(map[int32]int) // the writers' own copy fetches, per partition
	var watches []*kmsg.FetchRequest
	m := startMirror(t, Topics([]string{topic}, nil), func(c *config) {
		c.onWatch = func(req *kmsg.FetchRequest) {
			mu.Lock()
			watches = append(watches, req)
			mu.Unlock()
		}
		c.idleWait = 400 * time.Millisecond
		c.parkedListEvery = 1 << 30 // the watcher alone wakes (TestParkedPartitionListedNowAndThen)
		c.onFetch = func(tp string, p int32, _ time.Duration) {
			if tp == topic {
				mu.Lock()
				fetches[p]++
				mu.Unlock()
			}
		}
	})
	waitCaughtUp(t, m, topic)
	// Each writer's session start is timed (a retried session counts again).
	var h dto.Metric
	if err := m.metrics.starts.Write(&h); err != nil {
		t.Fatal(err)
	}
	if n := h.GetHistogram().GetSampleCount(); n < parts {
		t.Fatalf("ferry_mirror_writer_start_seconds counts %d starts, want at least %d (one per partition)", n, parts)
	}

	parked := func() int { return int(testutil.ToFloat64(m.metrics.parked)) }
	waitParked := func(what string) {
		t.Helper()
		testwait.Eventually(t, 30*time.Second, what+": every partition parked", func() error {
			if n := parked(); n != parts {
				return fmt.Errorf("%d of %d partitions parked", n, parts)
			}
			return nil
		})
	}
	waitParked("idle")
	// One connection: the watcher's. Every writer closed both of its own.
	if n := testutil.ToFloat64(m.metrics.conns); n != 1 {
		t.Fatalf("%v mirror connections open with every partition parked, want 1 (the watcher's)", n)
	}
	// Caught up, as the watcher's first answer told each writer (they
	// parked as their sessions started, before fetching anything).
	for _, st := range m.Status() {
		if st.State != StateCaughtUp || st.LagRecords != 0 || st.SourceEnd != 1 {
			t.Errorf("%s[%d] parked: %v, source end %d, lag %d; want caught up at 1", st.Topic, st.Partition, st.State, st.SourceEnd, st.LagRecords)
		}
	}
	// And no goroutine: a parked partition is its writer's state alone.
	if n := writerGoroutines(); n != 0 {
		t.Fatalf("%d writer goroutines with every partition parked, want none", n)
	}
	mirrored := func(p int32, want int64) {
		t.Helper()
		testwait.Eventually(t, 15*time.Second, "mirrored", func() error {
			if _, end := offsetsOf(t, s, topic, p); end != want {
				return fmt.Errorf("standby %s[%d] ends at %d, want %d", topic, p, end, want)
			}
			return nil
		})
	}
	snapshot := func() map[int32]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(fetches)
	}

	// A record on partition 3 wakes its writer, and only its.
	before := snapshot()
	produceN(t, src, topic, 3, 1, 1, "second")
	mirrored(3, 2)
	after := snapshot()
	for p := range int32(parts) {
		if woke := after[p] > before[p]; woke != (p == 3) {
			t.Errorf("partition %d: own fetches %d before the record on partition 3, %d after", p, before[p], after[p])
		}
	}

	// It parks again, and wakes again.
	waitParked("partition 3 idle again")
	produceN(t, src, topic, 3, 1, 1, "third")
	mirrored(3, 3)
	waitParked("partition 3 idle a third time")

	// A transaction on partition 6: open, nothing a read_committed fetch
	// can copy; committed, its record and marker are mirrored.
	txn := txnClient(t, "idle-park-txn")
	begin(t, txn)
	produceN(t, txn, topic, 6, 1, 1, "txn")
	// Its lag shows the open transaction's record: listEnds leaves parked
	// partitions to their watcher, which reports the high watermark.
	testwait.Eventually(t, 10*time.Second, "the open transaction in the lag", func() error {
		for _, st := range m.Status() {
			if st.Topic == topic && st.Partition == 6 {
				if st.SourceEnd != 2 || st.LagRecords != 1 {
					return fmt.Errorf("%s[6]: source end %d, lag %d, want 2 and 1", topic, st.SourceEnd, st.LagRecords)
				}
				return nil
			}
		}
		return fmt.Errorf("no status for %s[6]", topic)
	})
	if parked() != parts {
		t.Fatalf("%d of %d partitions parked with a source transaction open on one, want all: an open transaction has nothing to copy", parked(), parts)
	}
	if _, end := offsetsOf(t, s, topic, 6); end != 1 {
		t.Fatalf("standby %s[6] ends at %d with the source transaction open, want 1", topic, end)
	}
	end(t, txn, true)
	mirrored(6, 3) // the record and the COMMIT marker
	got := consumeAll(t, s, topic, 6, true)
	if len(got) != 2 || got[1].Offset != 1 || !strings.HasPrefix(got[1].Value, "txn ") {
		t.Fatalf("standby %s[6], read_committed: %+v, want the transaction's record at offset 1", topic, got)
	}
	waitParked("after the transaction")

	// Kafka 4 offers Fetch v13: the watcher named the topic by its ID in
	// every request, including those that forgot partitions woken.
	ids := topicIDs(t, a, topic)
	mu.Lock()
	defer mu.Unlock()
	forgot := 0
	for i, req := range watches {
		if req.Version != watchIDVersion {
			t.Fatalf("watcher request %d: Fetch v%d, want v%d (by topic ID)", i, req.Version, watchIDVersion)
		}
		for _, rt := range req.Topics {
			if rt.Topic != "" || rt.TopicID != ids[topic] {
				t.Fatalf("watcher request %d names topic %q, ID %x; want ID %x alone", i, rt.Topic, rt.TopicID, ids[topic])
			}
		}
		for _, ft := range req.ForgottenTopics {
			forgot++
			if ft.Topic != "" || ft.TopicID != ids[topic] {
				t.Fatalf("watcher request %d forgets topic %q, ID %x; want ID %x alone", i, ft.Topic, ft.TopicID, ids[topic])
			}
		}
	}
	if len(watches) == 0 || forgot == 0 {
		t.Fatalf("%d watcher requests, %d forgetting partitions; want some of each", len(watches), forgot)
	}
}

// writerGoroutines counts the goroutines running a partition writer.
func writerGoroutines() int {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2) // each goroutine's stack
	return strings.Count(buf.String(), "mirror.(*writer).run(")
}

// TestParkedPartitionListedNowAndThen: a change the watcher misses (here
// a watcher that wakes nothing) still reaches the standby, through the end
// listing that names the parked partitions every parkedListEvery rounds,
// and shows in the lag meanwhile.
func TestParkedPartitionListedNowAndThen(t *testing.T) {
	a, s := clusters(t)
	const topic = "idle-listed"
	createTopic(t, a, topic, 1, nil)
	src := newClient(t, a, manualPartitioner())
	produceN(t, src, topic, 0, 1, 1, "first")
	m := startMirror(t, Topics([]string{topic}, nil), func(c *config) {
		c.idleWait = 400 * time.Millisecond
		c.deafWatcher = true
		c.endsInterval = 200 * time.Millisecond
		c.parkedListEvery = 10 // every 2 s
	})
	waitCaughtUp(t, m, topic)
	testwait.Eventually(t, 30*time.Second, "the partition parked", func() error {
		if n := testutil.ToFloat64(m.metrics.parked); n != 1 {
			return fmt.Errorf("%v partitions parked", n)
		}
		return nil
	})
	produceN(t, src, topic, 0, 1, 1, "second")
	t0 := time.Now()
	testwait.Eventually(t, 15*time.Second, "the record mirrored", func() error {
		if _, end := offsetsOf(t, s, topic, 0); end != 2 {
			return fmt.Errorf("standby ends at %d, want 2", end)
		}
		return nil
	})
	t.Logf("mirrored %v after the record, the watcher deaf", time.Since(t0).Round(time.Millisecond))
}

// TestWriterStartsParkedCaughtUp: a writer whose partition has nothing to
// copy when its session starts (empty here; a mirror started again over
// partitions already mirrored is the same) parks at once, and is caught
// up as its watcher's first answer tells it: no fetch of its own did.
func TestWriterStartsParkedCaughtUp(t *testing.T) {
	a, _ := clusters(t)
	const topic = "idle-empty"
	createTopic(t, a, topic, 2, nil)
	// No end listing: the watcher alone tells the writers.
	m := startMirror(t, Topics([]string{topic}, nil), func(c *config) { c.endsInterval = time.Hour })
	testwait.Eventually(t, 30*time.Second, "both partitions parked and caught up", func() error {
		if n := testutil.ToFloat64(m.metrics.parked); n != 2 {
			return fmt.Errorf("%v partitions parked", n)
		}
		for _, st := range m.Status() {
			if st.State != StateCaughtUp || st.SourceEnd != 0 || st.LagRecords != 0 {
				return fmt.Errorf("%s[%d]: %v, source end %d, lag %d; want caught up at 0", st.Topic, st.Partition, st.State, st.SourceEnd, st.LagRecords)
			}
		}
		return nil
	})
}

// TestCaughtUpWritersParkOverConnectionBudget: a write to every partition
// wakes every writer, each holding two connections while it copies. Over
// the mirror's connection budget a writer parks as soon as it has copied
// what the source held, instead of long-polling for idleWait (here ten
// minutes) with both connections open; under no budget they stay. Every
// record reaches the standby at its offset either way.
func TestCaughtUpWritersParkOverConnectionBudget(t *testing.T) {
	a, s := clusters(t)
	const parts = 12
	for _, budget := range []int{0, 2} {
		t.Run(fmt.Sprintf("budget=%d", budget), func(t *testing.T) {
			topic := fmt.Sprintf("conn-budget-%d", budget)
			createTopic(t, a, topic, parts, nil)
			m := startMirror(t, Topics([]string{topic}, nil), ConnectionBudget(budget), func(c *config) {
				c.idleWait = 10 * time.Minute
				c.parkedListEvery = 1 << 30 // the watcher alone wakes
			})
			parked := func() int { return int(testutil.ToFloat64(m.metrics.parked)) }
			// Nothing to copy: every writer parks as its session starts.
			testwait.Eventually(t, 60*time.Second, "every empty partition parked", func() error {
				if n := parked(); n != parts {
					return fmt.Errorf("%d of %d partitions parked", n, parts)
				}
				return nil
			})

			src := newClient(t, a, manualPartitioner())
			for p := range int32(parts) {
				produceN(t, src, topic, p, 1, 1, "woken")
			}
			for p := range int32(parts) {
				testwait.Eventually(t, 30*time.Second, "mirrored", func() error {
					if _, end := offsetsOf(t, s, topic, p); end != 1 {
						return fmt.Errorf("standby %s[%d] ends at %d, want 1", topic, p, end)
					}
					return nil
				})
			}
			if budget == 0 {
				// Woken and caught up, each writer long-polls its
				// source until idleWait: none is parked, and each
				// holds its two connections.
				time.Sleep(time.Second)
				if n := parked(); n != 0 {
					t.Fatalf("%d of %d partitions parked a second after their copies with no connection budget, want none (idleWait is 10 min)", n, parts)
				}
				if n := testutil.ToFloat64(m.metrics.conns); n < 2*parts {
					t.Fatalf("%v mirror connections open with %d writers copying, want at least %d", n, parts, 2*parts)
				}
				return
			}
			testwait.Eventually(t, 30*time.Second, "every caught-up writer parked over the budget", func() error {
				if n := parked(); n != parts {
					return fmt.Errorf("%d of %d partitions parked", n, parts)
				}
				return nil
			})
			if n := testutil.ToFloat64(m.metrics.conns); n != 1 {
				t.Fatalf("%v mirror connections open with every partition parked, want 1 (the watcher's)", n)
			}
			// Parked, each still copies what comes next.
			produceN(t, src, topic, 5, 1, 1, "again")
			testwait.Eventually(t, 30*time.Second, "mirrored again", func() error {
				if _, end := offsetsOf(t, s, topic, 5); end != 2 {
					return fmt.Errorf("standby %s[5] ends at %d, want 2", topic, end)
				}
				return nil
			})
			got := consumeAll(t, s, topic, 5, false)
			if len(got) != 2 || got[0].Offset != 0 || got[1].Offset != 1 || !strings.HasPrefix(got[0].Value, "woken") || !strings.HasPrefix(got[1].Value, "again") {
				t.Fatalf("standby %s[5]: %+v, want the two records at offsets 0 and 1", topic, got)
			}
		})
	}
}
