package proxy

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/upstream"
)

// deadlineLease is in force until a time that the test moves.
type deadlineLease struct{ until atomic.Int64 }

func (l *deadlineLease) Left() time.Duration      { return time.Until(time.Unix(0, l.until.Load())) }
func (l *deadlineLease) Changed() <-chan struct{} { return make(chan struct{}) }

// TestWriteHeldForAConnectionNotSentAfterTheLeaseLapsed: a produce passes
// the hold and the lease check, then waits for an upstream connection (the
// pool at its bound of one, held by a long-poll fetch). The lease lapses
// while it waits: when the connection comes free the produce must not be
// sent (the member may have been cut off from a switch that flipped
// meanwhile), and the client gets a retriable error. Before, the lease was
// asked only before the wait, and the write reached the cluster 1.3 s
// after the lease had lapsed.
func TestWriteHeldForAConnectionNotSentAfterTheLeaseLapsed(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	lease := &deadlineLease{}
	lease.until.Store(time.Now().Add(time.Hour).UnixNano())
	s, addr := startFerry(t, kf.ListenAddrs(), WithMaxConnsPerBroker(1), WithIdleConnsPerBroker(1), WithWriteLease(lease))

	// The fetch holds the only connection for its MaxWait.
	holder := dialRaw(t, addr)
	holder.SetDeadline(time.Now().Add(60 * time.Second))
	f := kmsg.NewPtrFetchRequest()
	f.Version = 11
	f.MaxWaitMillis = 1500
	f.MinBytes, f.MaxBytes, f.SessionEpoch = 1, 1<<20, -1
	f.Topics = []kmsg.FetchRequestTopic{{Topic: "t", Partitions: []kmsg.FetchRequestTopicPartition{{Partition: 0, PartitionMaxBytes: 1 << 20, CurrentLeaderEpoch: -1, LogStartOffset: -1}}}}
	writeReq(t, holder, f, 1)
	testwait.Eventually(t, 20*time.Second, "the fetch checking out the connection", func() error {
		if inUse, idle := s.cluster("a").ReapIdle(time.Time{}); inUse != 1 {
			return fmt.Errorf("%d in use, %d idle", inUse, idle)
		}
		return nil
	})

	// The lease lapses 200 ms into the produce's wait for a connection.
	lease.until.Store(time.Now().Add(200 * time.Millisecond).UnixNano())
	if e := kerr.ErrorForCode(rawProduce(t, dialRaw(t, addr), "t", 7).ErrorCode); e == nil || !kerr.IsRetriable(e) {
		t.Fatalf("the produce was answered %v, want a retriable error", e)
	}
	if o := endOffset(t, kf, "t"); o != 0 {
		t.Fatalf("the cluster's end offset is %d: the write was sent after the member's lease lapsed", o)
	}
}

// TestWritePausedPastTheLeaseNotSent: a produce checked against the write
// lease with 300 ms left, then held up just before its upstream write (a
// member paused by SIGSTOP there) until the lease has lapsed, is not
// written: the write's deadline is what the lease had left, so it fails,
// and the client gets a retriable error. Before, the write went out on
// waking with the usual 30 s deadline — in the fleet test with a member
// paused through a planned switch, a produce landed on the old cluster
// after the flip and the mirror of the new direction halted diverged.
func TestWritePausedPastTheLeaseNotSent(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	lease := &deadlineLease{}
	lease.until.Store(time.Now().Add(time.Hour).UnixNano())
	_, addr := startFerry(t, kf.ListenAddrs(), WithWriteLease(lease))
	c := dialRaw(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if p := rawProduce(t, c, "t", 1); p.ErrorCode != 0 {
		t.Fatalf("the first produce, the lease in force: %v", kerr.ErrorForCode(p.ErrorCode))
	}

	var paused atomic.Bool
	upstream.TestHookBeforeWrite = func(gated bool) {
		if gated && paused.CompareAndSwap(false, true) {
			time.Sleep(700 * time.Millisecond) // the member stopped, woken past its lease
		}
	}
	t.Cleanup(func() { upstream.TestHookBeforeWrite = nil })
	lease.until.Store(time.Now().Add(300 * time.Millisecond).UnixNano())
	if e := kerr.ErrorForCode(rawProduce(t, c, "t", 2).ErrorCode); e == nil || !kerr.IsRetriable(e) {
		t.Fatalf("the produce paused past the lease was answered %v, want a retriable error", e)
	}
	if !paused.Load() {
		t.Fatal("the produce never reached its upstream write")
	}
	if o := endOffset(t, kf, "t"); o != 1 {
		t.Fatalf("the cluster's end offset is %d, want 1: the write was sent after the member's lease lapsed", o)
	}
}
