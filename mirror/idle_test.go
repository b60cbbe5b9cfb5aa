package mirror

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
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
