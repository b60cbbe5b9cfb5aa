package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// TestSavedVersionsNarrowWhileAClusterIsDown: a member that starts with a
// cluster unreachable (as after a forced failover from it) advertises no
// more than the API versions saved with the routing state, which every
// cluster supported when it was saved; it saves nothing of its own until
// every cluster is reached. With no saved versions it advertises what the
// clusters it reached support.
func TestSavedVersionsNarrowWhileAClusterIsDown(t *testing.T) {
	c := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	deadAddr := closedAddr(t)
	produceMax := func(st routing.State) (int16, *Server) {
		s, addr := startFerry(t, c.ListenAddrs(),
			WithClusters(upstream.Config{Name: "a", Bootstrap: c.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: []string{deadAddr}}),
			WithRoutingTable(routing.NewTable(st)), WithStandbyWait(200*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, newClient(t, addr))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range resp.ApiKeys {
			if k.ApiKey == int16(kmsg.Produce) {
				return k.MaxVersion, s
			}
		}
		t.Fatal("Produce not advertised")
		return 0, nil
	}
	full, s := produceMax(routing.State{Active: "a"})
	if full <= 9 {
		t.Fatalf("without saved versions Produce v%d is advertised; the test needs more than v9", full)
	}
	if s.SavedVersions() != nil {
		t.Fatal("SavedVersions with a cluster never reached: a narrower set than every cluster's would be saved")
	}
	saved := map[int16][2]int16{}
	for k, r := range s.Versions() {
		saved[k] = [2]int16{r.Min, r.Max}
	}
	saved[int16(kmsg.Produce)] = [2]int16{3, 9}
	if got, _ := produceMax(routing.State{Active: "a", APIVersions: saved}); got != 9 {
		t.Fatalf("with Produce v3-9 saved and the other cluster down: Produce v%d advertised, want 9", got)
	}
}

// TestStartFollowsTheActiveCluster: a member starting while its active
// cluster is dead waits for it; when the routing state names another
// active cluster meanwhile (its fleet switched away, read from the
// clusters), it waits for that one instead, and starts.
func TestStartFollowsTheActiveCluster(t *testing.T) {
	c := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	deadAddr := closedAddr(t)
	routes := routing.NewTable(routing.State{Active: "a"})
	s, err := New(WithClusterID("ferry-test"),
		WithClusters(upstream.Config{Name: "a", Bootstrap: []string{deadAddr}}, upstream.Config{Name: "b", Bootstrap: c.ListenAddrs()}),
		WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1})),
		WithRoutingTable(routes), WithStandbyWait(200*time.Millisecond),
		WithLogger(zaptest.NewLogger(t)), WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- s.Start(ctx) }()
	select {
	case err := <-started:
		t.Fatalf("Start returned %v with the active cluster dead", err)
	case <-time.After(time.Second):
	}
	routes.Advance(routing.State{Generation: 1, Active: "b", Phase: routing.PhaseServing})
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("Start after the active cluster became b: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start still waiting 10 s after the routing state named b, which answers")
	}
}
