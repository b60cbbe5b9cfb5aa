package proxy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
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
	a := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	b := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	entered, release := make(chan struct{}, 1), make(chan struct{})
	a.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		a.KeepControl()
		select {
		case entered <- struct{}{}:
			a.SleepControl(func() { <-release }) // the broker paused
		default:
		}
		return nil, nil, false
	})
	defer close(release)
	table := routing.NewTable(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseServing})
	s, addr := startFerry(t, a.ListenAddrs(), WithRoutingTable(table),
		WithClusters(Cluster{Name: "a", Bootstrap: a.ListenAddrs()}, Cluster{Name: "b", Bootstrap: b.ListenAddrs(), MirrorTarget: true}))
	c := dialRaw(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))

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
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the produce never reached the old cluster")
	}
	forced := &routing.Switch{ID: "f", Mode: routing.Forced, From: "a", To: "b"}
	table.Update(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseSwitching, Last: forced})
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

	from := uint32(0)
	done := *forced
	done.Outcome, done.FromGeneration = routing.OutcomeSwitched, &from
	table.Update(routing.State{Generation: 1, Active: "b", Phase: routing.PhaseServing, Last: &done})
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
	a := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	b := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	entered, release := make(chan struct{}, 1), make(chan struct{})
	a.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		a.KeepControl()
		select {
		case entered <- struct{}{}:
			a.SleepControl(func() { <-release }) // the broker paused
		default:
		}
		return nil, nil, false
	})
	table := routing.NewTable(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseServing})
	s, addr := startFerry(t, a.ListenAddrs(), WithRoutingTable(table),
		WithClusters(Cluster{Name: "a", Bootstrap: a.ListenAddrs()}, Cluster{Name: "b", Bootstrap: b.ListenAddrs(), MirrorTarget: true}))
	c := dialRaw(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))

	answered := make(chan kmsg.ProduceResponseTopicPartition, 1)
	go func() { answered <- rawProduce(t, c, "t", 1) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the produce never reached the old cluster")
	}
	forced := &routing.Switch{ID: "f", Mode: routing.Forced, From: "a", To: "b"}
	table.Update(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseSwitching, Last: forced})
	close(release)
	if p := <-answered; p.ErrorCode != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the old cluster's late answer was passed on: %v at %d, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if o := endOffset(t, a, "t"); o != 1 {
		t.Fatalf("the old cluster's end offset is %d: the test did not make it write the produce", o)
	}
	if n := testutil.ToFloat64(s.metrics.refusals.WithLabelValues("Produce", reasonForcedSwitch)); n != 1 {
		t.Fatalf("ferry_refusals_total{api=Produce,reason=forced_switch} = %v, want 1", n)
	}

	from := uint32(0)
	done := *forced
	done.Outcome, done.FromGeneration = routing.OutcomeSwitched, &from
	table.Update(routing.State{Generation: 1, Active: "b", Phase: routing.PhaseServing, Last: &done})
	if p := rawProduce(t, c, "t", 2); p.ErrorCode != 0 || p.BaseOffset != 0 {
		t.Fatalf("the retry after the forced switch: %v at %d, want offset 0 on the new cluster", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if o := endOffset(t, b, "t"); o != 1 {
		t.Fatalf("the new active cluster's end offset is %d, want 1", o)
	}
}
