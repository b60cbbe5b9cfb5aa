package proxy

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
)

// TestListGroupsMergesEveryBroker: ListGroups through Ferry asks every
// broker and lists each group once, as the cluster has them.
func TestListGroupsMergesEveryBroker(t *testing.T) {
	kf := newKfake(t, 3, kfake.SeedTopics(1, "t"))
	_, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	direct := kadm.NewClient(newClient(t, kf.ListenAddrs()[0]))
	want := []string{"g1", "g2", "g3", "g4"}
	for _, g := range want {
		var os kadm.Offsets
		os.Add(kadm.Offset{Topic: "t", Partition: 0, At: 0, LeaderEpoch: -1})
		if _, err := direct.CommitOffsets(ctx, g, os); err != nil {
			t.Fatalf("commit for %s: %v", g, err)
		}
	}
	listed, err := kadm.NewClient(newClient(t, addr)).ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := listed.Groups()
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("ListGroups through Ferry = %v; want %v, each once", got, want)
	}
}
