package proxy

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// TestHeldTooLongAnsweredRetriable: a produce held by a switch that drains
// for longer than heldAnswerAfter is answered NOT_LEADER_OR_FOLLOWER, which
// every client retries, before its own request timeout would make it close
// the connection; nothing reaches the cluster, the connection stays open,
// and the retry after the switch is written.
func TestHeldTooLongAnsweredRetriable(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	table := routing.NewTable(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseDraining})
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(table), WithHeldAnswerAfter(300*time.Millisecond))
	c := dialRaw(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))

	start := time.Now()
	if code := rawProduce(t, c, "t", 1).ErrorCode; code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the held produce was answered %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("answered after %v, before the hold's bound", took)
	}
	if n := testutil.ToFloat64(s.metrics.heldTooLong); n != 1 {
		t.Fatalf("ferry_requests_held_too_long_total = %v, want 1", n)
	}
	if o := endOffset(t, kf, "t"); o != 0 {
		t.Fatalf("the cluster's end offset is %d: a held write was sent", o)
	}

	// The switch ends: the retry, on the same connection, is written.
	st := table.Current()
	st.Phase = routing.PhaseServing
	table.Update(st)
	if p := rawProduce(t, c, "t", 2); p.ErrorCode != 0 || p.BaseOffset != 0 {
		t.Fatalf("the retry after the switch: %v at %d, want offset 0", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
}

// forcedFixture is Ferry routing to cluster a, whose first Produce is
// paused until release is closed (entered says it arrived), with b to be
// forced to.
type forcedFixture struct {
	a, b             *kfake.Cluster
	s                *Server
	table            *routing.Table
	c                net.Conn
	entered, release chan struct{}
	forced           *routing.Switch
}

func newForcedFixture(t *testing.T) *forcedFixture {
	f := &forcedFixture{
		a:       newKfake(t, 1, kfake.SeedTopics(1, "t")),
		b:       newKfake(t, 1, kfake.SeedTopics(1, "t")),
		entered: make(chan struct{}, 1),
		release: make(chan struct{}),
		table:   routing.NewTable(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseServing}),
		forced:  &routing.Switch{ID: "f", Mode: routing.Forced, From: "a", To: "b"},
	}
	f.a.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		f.a.KeepControl()
		select {
		case f.entered <- struct{}{}:
			f.a.SleepControl(func() { <-f.release }) // the broker paused
		default:
		}
		return nil, nil, false
	})
	var addr string
	f.s, addr = startFerry(t, f.a.ListenAddrs(), WithRoutingTable(f.table),
		WithClusters(upstream.Config{Name: "a", Bootstrap: f.a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: f.b.ListenAddrs(), MirrorTarget: true}))
	f.c = dialRaw(t, addr)
	f.c.SetDeadline(time.Now().Add(30 * time.Second))
	return f
}

// hold waits for the paused produce to reach a, then holds for the forced
// switch.
func (f *forcedFixture) hold(t *testing.T) {
	t.Helper()
	select {
	case <-f.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the produce never reached the old cluster")
	}
	f.table.Update(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseSwitching, Last: f.forced})
}

// install installs the forced switch's generation 1, b active.
func (f *forcedFixture) install() {
	from := uint32(0)
	done := *f.forced
	done.Outcome, done.FromGeneration = routing.OutcomeSwitched, &from
	f.table.Update(routing.State{Generation: 1, Active: "b", Phase: routing.PhaseServing, Last: &done})
}

// TestWriteInFlightRefusedAtAForcedHold: an idempotent producer's batch in
// flight to the old cluster when a forced switch holds is answered at once,
// refused (retriable), while that cluster's broker is still paused, not
// when it comes back: by then the producer's next batch would have been
// written to the new active cluster ahead of it, and the batch sent again
// would meet OUT_OF_ORDER_SEQUENCE_NUMBER there for good (the 30-minute
// runs with forced switches: a Java producer stuck on one partition for up
// to two minutes). The next batch waits behind it instead, and the two are
// written in order.
func TestWriteInFlightRefusedAtAForcedHold(t *testing.T) {
	f := newForcedFixture(t)
	defer close(f.release)
	s, b, c := f.s, f.b, f.c

	init := kmsg.NewPtrInitProducerIDRequest()
	init.Version = maxVersion(t, s, kmsg.InitProducerID)
	ip := rawCall(t, c, init, 1).(*kmsg.InitProducerIDResponse)
	if ip.ErrorCode != 0 {
		t.Fatalf("InitProducerId: %v", kerr.ErrorForCode(ip.ErrorCode))
	}
	produce := func(corr, seq int32, v string) kmsg.ProduceResponseTopicPartition {
		req := oneRecordProduce("t")
		req.Topics[0].Partitions[0].Records = valueBatch(ip.ProducerID, ip.ProducerEpoch, seq, false, v)
		return rawCall(t, c, req, corr).(*kmsg.ProduceResponse).Topics[0].Partitions[0]
	}

	answered := make(chan kmsg.ProduceResponseTopicPartition, 1)
	go func() { answered <- produce(2, 0, "first") }()
	f.hold(t)
	select {
	case p := <-answered:
		if p.ErrorCode != kerr.NotLeaderForPartition.Code {
			t.Fatalf("the batch in flight at the forced hold: %v at %d, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the batch in flight at the forced hold not answered while the old cluster's broker is paused")
	}
	if n := testutil.ToFloat64(s.metrics.refusals.WithLabelValues("Produce", reasonForcedSwitch)); n != 1 {
		t.Fatalf("ferry_refusals_total{api=Produce,reason=forced_switch} = %v, want 1", n)
	}

	f.install()
	if p := produce(3, 1, "second"); p.ErrorCode != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("the next batch before the refused one is sent again: %v at %d, want OUT_OF_ORDER_SEQUENCE_NUMBER (wait behind it)", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if o := endOffset(t, b, "t"); o != 0 {
		t.Fatalf("the new active cluster's end offset is %d, want 0: the next batch was written ahead of the refused one", o)
	}
	if p := produce(4, 0, "first"); p.ErrorCode != 0 || p.BaseOffset != 0 {
		t.Fatalf("the refused batch sent again: %v at %d, want offset 0", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if p := produce(5, 1, "second"); p.ErrorCode != 0 || p.BaseOffset != 1 {
		t.Fatalf("the next batch sent again: %v at %d, want offset 1", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
}

// TestAnswerAfterAForcedSwitchHeldRefused: a produce in flight to the old
// cluster when a forced switch holds the member's writes, which that
// cluster writes and answers only afterwards (a paused broker resumed), is
// answered NOT_LEADER_OR_FOLLOWER, not acknowledged: the switch stopped the
// mirror before that write, and its lost ranges do not name it. The
// client's retry, once the forced switch installs, is written on the new
// active cluster.
func TestAnswerAfterAForcedSwitchHeldRefused(t *testing.T) {
	f := newForcedFixture(t)
	s, a, b, c := f.s, f.a, f.b, f.c

	answered := make(chan kmsg.ProduceResponseTopicPartition, 1)
	go func() { answered <- rawProduce(t, c, "t", 1) }()
	f.hold(t)
	close(f.release)
	if p := <-answered; p.ErrorCode != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the old cluster's late answer was passed on: %v at %d, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	// The refusal may go out at the hold, before the resumed broker has
	// written the batch: wait for the write the test is about.
	testwait.Eventually(t, 10*time.Second, "the old cluster wrote the produce", func() error {
		if o := endOffset(t, a, "t"); o != 1 {
			return fmt.Errorf("the old cluster's end offset is %d, want 1: the test did not make it write the produce", o)
		}
		return nil
	})
	if n := testutil.ToFloat64(s.metrics.refusals.WithLabelValues("Produce", reasonForcedSwitch)); n != 1 {
		t.Fatalf("ferry_refusals_total{api=Produce,reason=forced_switch} = %v, want 1", n)
	}

	f.install()
	if p := rawProduce(t, c, "t", 2); p.ErrorCode != 0 || p.BaseOffset != 0 {
		t.Fatalf("the retry after the forced switch: %v at %d, want offset 0 on the new cluster", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if o := endOffset(t, b, "t"); o != 1 {
		t.Fatalf("the new active cluster's end offset is %d, want 1", o)
	}
}
