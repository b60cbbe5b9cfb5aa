package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// lostState is generation 1 on b, made by a forced switch from a that lost
// t[0]'s offsets 5 to 9.
func lostState() routing.State {
	from := uint32(0)
	return routing.State{Generation: 1, Active: "b", Phase: routing.PhaseServing, Last: &routing.Switch{
		ID: "f", Mode: routing.Forced, From: "a", To: "b", FromGeneration: &from, Outcome: routing.OutcomeSwitched,
		Lost: []routing.LostRange{{Topic: "t", Partition: 0, From: 5, To: 9}},
	}}
}

// TestCommitPastLostRangeLowered: after a forced switch that lost t[0]'s
// offsets 5–8, a group's commit of a position read on the old cluster (its
// leader epoch of generation 0) at 7 is stored on the new active cluster
// at 5, the lost range's start, where the group resumes reading the new
// cluster's records; so is a commit with no epoch past the new cluster's
// end (6), which cannot have been read there. A position read on the new
// cluster (an epoch of generation 1), one with no epoch within its end,
// one below the range and one of a partition that lost nothing are stored
// as committed.
func TestCommitPastLostRangeLowered(t *testing.T) {
	a := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	b := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	table := routing.NewTable(lostState())
	s, addr := startFerry(t, a.ListenAddrs(), WithRoutingTable(table),
		WithClusters(upstream.Config{Name: "a", Bootstrap: a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: b.ListenAddrs(), MirrorTarget: true}))
	c := dialRaw(t, addr)
	// The new active cluster holds six records of t[0] written since the
	// switch (offsets 0–5 here).
	prod := newClient(t, b.ListenAddrs()[0], kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for range 6 {
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Topic: "t", Partition: 0, Value: []byte("new")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	old, cur := routing.VirtualEpoch(0, 0), routing.VirtualEpoch(1, 0)
	commits := []struct {
		group     string
		partition int32
		offset    int64
		epoch     int32
		want      int64
	}{
		{"read-on-old", 0, 7, old, 5},
		{"read-on-old-by-id", 0, 7, old, 5}, // sent at v10, by topic ID
		{"read-on-old", 1, 7, old, 7},       // t[1] lost nothing
		{"read-on-new", 0, 7, cur, 7},
		{"no-epoch-past-end", 0, 7, -1, 5}, // t[0] ends at 6 on b: read on a
		{"no-epoch-within-end", 0, 6, -1, 6},
		{"below", 0, 4, old, 4},
		{"at-start", 0, 5, old, 5},
	}
	top := maxVersion(t, s, kmsg.OffsetCommit)
	if top < 10 {
		t.Fatalf("OffsetCommit v%d advertised: the test wants v10 (topic IDs) too", top)
	}
	for i, cm := range commits {
		req := kmsg.NewPtrOffsetCommitRequest()
		// By name, and from v10 by topic ID (Kafka 4's KIP-848 consumer).
		req.Version = []int16{9, top}[i%2] // read-on-old-by-id is the second
		req.Group, req.Generation = cm.group, -1
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic, rt.TopicID = "t", routing.VirtualTopicID("ferry-test", "t")
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch = cm.partition, cm.offset, cm.epoch
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp := rawCall(t, c, req, int32(i+1)).(*kmsg.OffsetCommitResponse)
		if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
			t.Fatalf("%s t[%d] commit: %v", cm.group, cm.partition, kerr.ErrorForCode(code))
		}
	}
	cl := newClient(t, b.ListenAddrs()[0])
	adm := kadm.NewClient(cl)
	for _, cm := range commits {
		got, err := adm.FetchOffsets(context.Background(), cm.group)
		if err != nil {
			t.Fatal(err)
		}
		o, ok := got.Lookup("t", cm.partition)
		if !ok || o.At != cm.want {
			t.Errorf("%s t[%d] committed %d with epoch %d: stored at %d (found %v) on the new active cluster, want %d",
				cm.group, cm.partition, cm.offset, cm.epoch, o.At, ok, cm.want)
		}
	}
}

// TestTxnCommitPastLostRangeLowered: a transactional producer's offset
// commit (TxnOffsetCommit) is lowered as a group's is.
func TestTxnCommitPastLostRangeLowered(t *testing.T) {
	s := &Server{}
	c := &clientConn{log: zap.NewNop()}
	req := &request{hdr: protocol.RequestHeader{Key: int16(kmsg.TxnOffsetCommit), Version: 3}, state: lostState()}
	tc := kmsg.NewPtrTxnOffsetCommitRequest()
	tc.Group = "g"
	tt := kmsg.NewTxnOffsetCommitRequestTopic()
	tt.Topic = "t"
	for _, p := range []struct {
		partition int32
		epoch     int32
	}{{0, routing.VirtualEpoch(0, 3)}, {1, routing.VirtualEpoch(0, 3)}} {
		tp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		tp.Partition, tp.Offset, tp.LeaderEpoch = p.partition, 8, p.epoch
		tt.Partitions = append(tt.Partitions, tp)
	}
	tc.Topics = append(tc.Topics, tt)
	if !s.clampLostCommits(context.Background(), c, req, tc) {
		t.Fatal("the commit was not changed")
	}
	if got := tc.Topics[0].Partitions[0].Offset; got != 5 {
		t.Errorf("t[0] committed at 8 from the old cluster: %d, want the lost range's start 5", got)
	}
	if got := tc.Topics[0].Partitions[1].Offset; got != 8 {
		t.Errorf("t[1], which lost nothing: %d, want 8", got)
	}
}

// TestEpochlessCommitKeptAfterStaleWindow: a commit with no epoch is judged
// against the new cluster's end (a round trip) only within the window in
// which Ferry carries commits from before a switch; past it, it is stored
// as committed, as Kafka would store it.
func TestEpochlessCommitKeptAfterStaleWindow(t *testing.T) {
	a := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	b := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	s, addr := startFerry(t, a.ListenAddrs(), WithRoutingTable(routing.NewTable(lostState())),
		WithClusters(upstream.Config{Name: "a", Bootstrap: a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: b.ListenAddrs(), MirrorTarget: true}))
	s.genSince.Store(&genStart{gen: 1, at: time.Now().Add(-2 * staleCommitWindow)})
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version, req.Group, req.Generation = 9, "late", -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = "t"
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Offset, rp.LeaderEpoch = 7, -1 // past the range's start and b's end (0)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	if code := rawCall(t, dialRaw(t, addr), req, 1).(*kmsg.OffsetCommitResponse).Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("commit: %v", kerr.ErrorForCode(code))
	}
	got, err := kadm.NewClient(newClient(t, b.ListenAddrs()[0])).FetchOffsets(context.Background(), "late")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := got.Lookup("t", 0); !ok || o.At != 7 {
		t.Errorf("an epoch-less commit of 7 past the stale-commit window: stored at %d (found %v), want 7", o.At, ok)
	}
}
