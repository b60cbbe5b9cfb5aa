package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// TestSwitchTargetWarmed: when a switch starts, the cluster it goes to has
// the coordinators of the groups clients used on the old one looked up
// before the flip, so that the first group request after it finds them
// cached.
func TestSwitchTargetWarmed(t *testing.T) {
	a, b := newKfake(t, 1), newKfake(t, 1)
	table := routing.NewTable(routing.State{Active: "a"})
	s, addr := startFerry(t, a.ListenAddrs(), WithRoutingTable(table),
		WithClusters(upstream.Config{Name: "a", Bootstrap: a.ListenAddrs(), MirrorTarget: true}, upstream.Config{Name: "b", Bootstrap: b.ListenAddrs(), MirrorTarget: true}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr)
	groups := []string{"g1", "g2", "g3"}
	for _, g := range groups {
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.CoordinatorKey = g
		if _, err := req.RequestWith(ctx, cl); err != nil {
			t.Fatal(err)
		}
	}
	cached := func(cluster string) int {
		u := s.cluster(cluster)
		n := 0
		for _, g := range groups {
			if u.CachedCoordinator(0, g) {
				n++
			}
		}
		return n
	}
	if n := cached("a"); n != len(groups) {
		t.Fatalf("%d of %d groups' coordinators cached on a after FindCoordinator", n, len(groups))
	}
	if n := cached("b"); n != 0 {
		t.Fatalf("b has %d coordinators cached before any switch", n)
	}
	table.Update(routing.State{Active: "a", Phase: routing.PhaseDraining, Last: &routing.Switch{From: "a", To: "b"}})
	testwait.Until(t, 10*time.Second, "every group's coordinator on b cached", func() bool { return cached("b") == len(groups) })
}
