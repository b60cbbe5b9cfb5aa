package proxy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

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
