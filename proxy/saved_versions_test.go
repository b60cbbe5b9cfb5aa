package proxy

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

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
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
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
