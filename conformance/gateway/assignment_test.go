package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/proxy"
)

// TestReplicaAssignmentThroughFerry: an explicit replica assignment naming
// the brokers Ferry's Metadata shows places the replicas on the physical
// brokers those lanes stand for; an ID that stands for none, or two that
// stand for one, is refused with INVALID_REPLICA_ASSIGNMENT and a message
// saying which IDs are valid, and nothing is created.
func TestReplicaAssignmentThroughFerry(t *testing.T) {
	c := cluster(t)
	// Reassignments and elections are cluster_admin, refused by default.
	f := ferrytest.Start(t, c.Bootstrap(), proxy.WithRequestPolicy([]string{"cluster_admin"}, nil))
	cl := client(t, f.Addr)
	adm := kadm.NewClient(cl)
	direct := kadm.NewClient(client(t, c.Bootstrap()))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The virtual brokers a client sees, and the physical brokers they
	// stand for: lanes are given to physical brokers in ID order.
	bm, err := adm.BrokerMetadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	virt := bm.Brokers.NodeIDs()
	slices.Sort(virt)
	phys := c.NodeIDs()
	slices.Sort(phys)
	if len(virt) != len(phys) {
		t.Fatalf("Ferry shows brokers %v for physical brokers %v; want one lane each", virt, phys)
	}
	toPhys := map[int32]int32{}
	for i, v := range virt {
		toPhys[v] = phys[i]
	}
	physOf := func(vs []int32) []int32 {
		out := make([]int32, len(vs))
		for i, v := range vs {
			out[i] = toPhys[v]
		}
		return out
	}
	v0, v1, v2 := virt[0], virt[1], virt[2]

	createTopics := func(t *testing.T, topics ...kmsg.CreateTopicsRequestTopic) map[string]kmsg.CreateTopicsResponseTopic {
		t.Helper()
		req := kmsg.NewPtrCreateTopicsRequest()
		req.TimeoutMillis = 30000
		req.Topics = topics
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]kmsg.CreateTopicsResponseTopic{}
		for _, rt := range resp.Topics {
			out[rt.Topic] = rt
		}
		if len(out) != len(topics) {
			t.Fatalf("CreateTopics answered %d topics for %d", len(out), len(topics))
		}
		return out
	}
	topic := func(name string, assignment ...[]int32) kmsg.CreateTopicsRequestTopic {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, -1, -1
		for p, rs := range assignment {
			a := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
			a.Partition, a.Replicas = int32(p), rs
			rt.ReplicaAssignment = append(rt.ReplicaAssignment, a)
		}
		return rt
	}
	// replicasOn waits until the topic's partitions have their leaders and
	// returns each partition's replicas as the cluster reports them,
	// directly and through Ferry (with the leader Ferry shows).
	type view struct {
		replicas []int32
		leader   int32
	}
	describe := func(t *testing.T, a *kadm.Client, name string, partitions int) map[int32]view {
		t.Helper()
		var out map[int32]view
		testwait.Eventually(t, 20*time.Second, fmt.Sprintf("topic %s: all %d partitions with a leader", name, partitions), func() error {
			td, err := a.ListTopics(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			d := td[name]
			out = map[int32]view{}
			for _, p := range d.Partitions {
				if p.Leader >= 0 {
					out[p.Partition] = view{p.Replicas, p.Leader}
				}
			}
			if d.Err != nil || len(out) != partitions {
				return fmt.Errorf("%v, %d of %d partitions with a leader", d.Err, len(out), partitions)
			}
			return nil
		})
		return out
	}
	refused := func(t *testing.T, code int16, msg *string, wantInMsg string) {
		t.Helper()
		if code != kerr.InvalidReplicaAssignment.Code {
			t.Fatalf("error %v, want INVALID_REPLICA_ASSIGNMENT", kerr.ErrorForCode(code))
		}
		if msg == nil || !strings.Contains(*msg, wantInMsg) {
			t.Fatalf("message %v, want one containing %q", msg, wantInMsg)
		}
	}

	t.Run("CreateTopics", func(t *testing.T) {
		want := [][]int32{{v1, v2}, {v2, v0}, {v0, v1}} // Kafka wants one replication factor for all
		got := createTopics(t, topic("assigned", want...))["assigned"]
		if err := kerr.ErrorForCode(got.ErrorCode); err != nil {
			t.Fatalf("create with assignment %v: %v (%v)", want, err, got.ErrorMessage)
		}
		onCluster := describe(t, direct, "assigned", len(want))
		viaFerry := describe(t, adm, "assigned", len(want))
		for p, vs := range want {
			if d := onCluster[int32(p)]; !slices.Equal(d.replicas, physOf(vs)) {
				t.Errorf("partition %d: replicas %v on the cluster, want %v (the brokers behind %v)", p, d.replicas, physOf(vs), vs)
			}
			// Ferry's Metadata reads the assignment back as given; a new
			// partition is led by its first replica.
			if f := viaFerry[int32(p)]; f.leader != vs[0] || !slices.Equal(f.replicas, vs) {
				t.Errorf("partition %d through Ferry: leader %d, replicas %v; want leader %d, replicas %v", p, f.leader, f.replicas, vs[0], vs)
			}
		}
	})

	// After CreateTopics: partition 0 of "assigned" is on [v1 v2].
	t.Run("AlterPartitionReassignments", func(t *testing.T) {
		var req kadm.AlterPartitionAssignmentsReq
		req.Assign("assigned", 0, []int32{v0, v1})
		req.Assign("assigned", 1, []int32{v0, 9})
		resp, err := adm.AlterPartitionAssignments(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if r := resp["assigned"][0]; r.Err != nil {
			t.Fatalf("reassign partition 0 to %v: %v %s", []int32{v0, v1}, r.Err, r.ErrMessage)
		}
		bad := resp["assigned"][1]
		if !errors.Is(bad.Err, kerr.InvalidReplicaAssignment) || !strings.Contains(bad.ErrMessage, "valid broker IDs: 0, 1, 2") {
			t.Errorf("reassign partition 1 to broker 9: %v %q; want INVALID_REPLICA_ASSIGNMENT listing the valid IDs", bad.Err, bad.ErrMessage)
		}
		want := physOf([]int32{v0, v1})
		testwait.Eventually(t, 30*time.Second, fmt.Sprintf("partition 0 on %v after the reassignment", want), func() error {
			if d := describe(t, direct, "assigned", 3); !slices.Equal(d[0].replicas, want) {
				return fmt.Errorf("on %v", d[0].replicas)
			}
			return nil
		})
		if _, err := adm.ListPartitionReassignments(ctx, kadm.TopicsSet{"assigned": {0: {}}}); err != nil {
			t.Errorf("ListPartitionReassignments through Ferry: %v", err)
		}
		// The preferred replica is now v0: electing it through Ferry
		// moves the leader Ferry shows.
		testwait.Eventually(t, 30*time.Second, "electing the preferred leader of partition 0", func() error {
			res, err := adm.ElectLeaders(ctx, kadm.ElectPreferredReplica, kadm.TopicsSet{"assigned": {0: {}}})
			if err != nil {
				t.Fatal(err)
			}
			if r := res["assigned"][0]; r.Err != nil && !errors.Is(r.Err, kerr.ElectionNotNeeded) {
				return fmt.Errorf("%v %s", r.Err, r.ErrMessage)
			}
			return nil
		})
		testwait.Eventually(t, 20*time.Second, fmt.Sprintf("partition 0 through Ferry led by %d on [%d %d] after the reassignment and election", v0, v0, v1), func() error {
			if f := describe(t, adm, "assigned", 3); f[0].leader != v0 || !slices.Equal(f[0].replicas, []int32{v0, v1}) {
				return fmt.Errorf("leader %d, replicas %v", f[0].leader, f[0].replicas)
			}
			return nil
		})
	})

	t.Run("CreateTopicsRefused", func(t *testing.T) {
		got := createTopics(t,
			topic("bad-id", []int32{v0, 7}),
			topic("dup-id", []int32{v1, v1}),
			topic("good-beside-bad", []int32{v2}))
		refused(t, got["bad-id"].ErrorCode, got["bad-id"].ErrorMessage, "valid broker IDs: 0, 1, 2")
		refused(t, got["dup-id"].ErrorCode, got["dup-id"].ErrorMessage, "named twice")
		if err := kerr.ErrorForCode(got["good-beside-bad"].ErrorCode); err != nil {
			t.Fatalf("a valid topic in the same request: %v", err)
		}
		if d := describe(t, direct, "good-beside-bad", 1); !slices.Equal(d[0].replicas, physOf([]int32{v2})) {
			t.Errorf("good-beside-bad: replicas %v, want %v", d[0].replicas, physOf([]int32{v2}))
		}
		td, err := direct.ListTopics(ctx, "bad-id", "dup-id")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"bad-id", "dup-id"} {
			if d, ok := td[name]; ok && d.Err == nil {
				t.Errorf("refused topic %s exists on the cluster", name)
			}
		}
	})

	t.Run("CreatePartitions", func(t *testing.T) {
		if got := createTopics(t, topic("grown", []int32{v0, v1}))["grown"]; got.ErrorCode != 0 {
			t.Fatalf("create: %v", kerr.ErrorForCode(got.ErrorCode))
		}
		grow := func(assignment ...[]int32) kmsg.CreatePartitionsResponseTopic {
			req := kmsg.NewPtrCreatePartitionsRequest()
			req.TimeoutMillis = 30000
			rt := kmsg.NewCreatePartitionsRequestTopic()
			rt.Topic, rt.Count = "grown", int32(1+len(assignment))
			for _, rs := range assignment {
				a := kmsg.NewCreatePartitionsRequestTopicAssignment()
				a.Replicas = rs
				rt.Assignment = append(rt.Assignment, a)
			}
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, cl)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Topics) != 1 {
				t.Fatalf("CreatePartitions answered %d topics", len(resp.Topics))
			}
			return resp.Topics[0]
		}
		bad := grow([]int32{v0, 5000})
		refused(t, bad.ErrorCode, bad.ErrorMessage, "valid broker IDs: 0, 1, 2")
		good := grow([]int32{v2, v0})
		if err := kerr.ErrorForCode(good.ErrorCode); err != nil {
			t.Fatalf("grow with assignment: %v (%v)", err, good.ErrorMessage)
		}
		if d := describe(t, direct, "grown", 2); !slices.Equal(d[1].replicas, physOf([]int32{v2, v0})) {
			t.Errorf("new partition: replicas %v on the cluster, want %v", d[1].replicas, physOf([]int32{v2, v0}))
		}
		if f := describe(t, adm, "grown", 2); f[1].leader != v2 || !slices.Equal(f[1].replicas, []int32{v2, v0}) {
			t.Errorf("new partition through Ferry: leader %d, replicas %v; want %d, [%d %d]", f[1].leader, f[1].replicas, v2, v2, v0)
		}
	})
}
