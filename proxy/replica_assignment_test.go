package proxy

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// addMember adds a second Ferry member (node 1) to the fleet: its lanes are
// virtual brokers 1000, 1001, ...
func addMember(t *testing.T, s *Server) {
	t.Helper()
	f := s.brokers.(*routing.StaticBrokerSet)
	m := f.Brokers()[0]
	m.NodeID = 1
	f.Set(append(f.Brokers(), m))
}

func createTopicsRaw(t *testing.T, addr string, topics ...kmsg.CreateTopicsRequestTopic) map[string]kmsg.CreateTopicsResponseTopic {
	t.Helper()
	conn := dialRaw(t, addr)
	req := kmsg.NewPtrCreateTopicsRequest()
	req.Version, req.TimeoutMillis, req.Topics = 7, 10000, topics
	writeReq(t, conn, req, 1)
	resp := kmsg.NewPtrCreateTopicsResponse()
	resp.Version = 7
	if err := resp.ReadFrom(readResp(t, conn)[5:]); err != nil { // correlation ID, empty tags
		t.Fatal(err)
	}
	out := map[string]kmsg.CreateTopicsResponseTopic{}
	for _, rt := range resp.Topics {
		out[rt.Topic] = rt
	}
	return out
}

func assigned(name string, replicas ...[]int32) kmsg.CreateTopicsRequestTopic {
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, -1, -1
	for p, rs := range replicas {
		rt.ReplicaAssignment = append(rt.ReplicaAssignment, kmsg.CreateTopicsRequestTopicReplicaAssignment{Partition: int32(p), Replicas: rs})
	}
	return rt
}

func wantRefused(t *testing.T, what string, code int16, msg *string, substr string) {
	t.Helper()
	if code != kerr.InvalidReplicaAssignment.Code || msg == nil || !strings.Contains(*msg, substr) {
		m := "<nil>"
		if msg != nil {
			m = *msg
		}
		t.Errorf("%s: %v %q; want INVALID_REPLICA_ASSIGNMENT saying %q", what, kerr.ErrorForCode(code), m, substr)
	}
}

// TestReplicaAssignmentAcrossMembersAndLanes: lanes of different members
// for one physical broker are one broker in an assignment; with fewer
// lanes than brokers, a lane that stands for several brokers cannot place
// a replica, and the message names the IDs that can.
func TestReplicaAssignmentAcrossMembersAndLanes(t *testing.T) {
	kf := newKfake(t, 3)
	s, addr := startFerry(t, kf.ListenAddrs())
	addMember(t, s)
	got := createTopicsRaw(t, addr, assigned("same-broker", []int32{0, 1000}), assigned("two-members", []int32{1001, 2}))
	wantRefused(t, "brokers 0 and 1000", got["same-broker"].ErrorCode, got["same-broker"].ErrorMessage, "brokers 0 and 1000 are the same broker")
	if code := got["two-members"].ErrorCode; code != 0 {
		t.Errorf("assignment [1001 2]: %v %v", kerr.ErrorForCode(code), got["two-members"].ErrorMessage)
	}

	_, addr2 := startFerry(t, kf.ListenAddrs(), WithLanes(2)) // lane 0 stands for brokers 0 and 2
	got = createTopicsRaw(t, addr2, assigned("shared-lane", []int32{0}), assigned("own-lane", []int32{1}))
	wantRefused(t, "a lane of two brokers", got["shared-lane"].ErrorCode, got["shared-lane"].ErrorMessage, "valid broker IDs: 1")
	if code := got["own-lane"].ErrorCode; code != 0 {
		t.Errorf("assignment [1]: %v", kerr.ErrorForCode(code))
	}
}

// TestPartitionReassignmentsThroughFerry: AlterPartitionReassignments
// reaches the cluster with the physical brokers the lanes stand for, a
// partition that cannot be mapped is refused beside the others, and
// ListPartitionReassignments names replicas by the lanes Metadata shows.
func TestPartitionReassignmentsThroughFerry(t *testing.T) {
	kf := newKfake(t, 3)
	var mu sync.Mutex
	var sent *kmsg.AlterPartitionAssignmentsRequest
	kf.ControlKey(int16(kmsg.AlterPartitionAssignments), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		mu.Lock()
		sent = kr.(*kmsg.AlterPartitionAssignmentsRequest)
		mu.Unlock()
		return nil, nil, false
	})
	s, addr := startFerry(t, kf.ListenAddrs(), WithRequestPolicy([]string{"cluster_admin"}, nil)) // reassignments are refused by default
	addMember(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr)
	ct := kmsg.NewPtrCreateTopicsRequest()
	ct.Topics = []kmsg.CreateTopicsRequestTopic{{Topic: "moved", NumPartitions: 8, ReplicationFactor: 3}}
	if _, err := ct.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}

	alter := kmsg.NewPtrAlterPartitionAssignmentsRequest()
	alter.TimeoutMillis = 10000
	alter.Topics = []kmsg.AlterPartitionAssignmentsRequestTopic{{Topic: "moved", Partitions: []kmsg.AlterPartitionAssignmentsRequestTopicPartition{
		{Partition: 0, Replicas: []int32{1002, 0}},
		{Partition: 1, Replicas: []int32{2, 1002}},
		{Partition: 2, Replicas: nil}, // cancel: passes as it is
	}}}
	resp, err := alter.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[int32]kmsg.AlterPartitionAssignmentsResponseTopicPartition{}
	for _, rt := range resp.Topics {
		for _, p := range rt.Partitions {
			codes[p.Partition] = p
		}
	}
	if len(resp.Topics) != 1 || len(codes) != 3 {
		t.Fatalf("answer %+v; want one topic with three partitions", resp.Topics)
	}
	wantRefused(t, "partition 1", codes[1].ErrorCode, codes[1].ErrorMessage, "brokers 2 and 1002 are the same broker")
	mu.Lock()
	got := sent
	mu.Unlock()
	if got == nil || len(got.Topics) != 1 || len(got.Topics[0].Partitions) != 2 {
		t.Fatalf("the cluster got %+v; want partitions 0 and 2 only", got)
	}
	if p := got.Topics[0].Partitions[0]; p.Partition != 0 || !slices.Equal(p.Replicas, []int32{2, 0}) {
		t.Errorf("the cluster got partition %d with replicas %v; want 0 with [2 0]", p.Partition, p.Replicas)
	}
	if p := got.Topics[0].Partitions[1]; p.Partition != 2 || p.Replicas != nil {
		t.Errorf("the cluster got partition %d with replicas %v; want 2 with null (cancel)", p.Partition, p.Replicas)
	}

	// A partition Ferry's Metadata shows on member 1: its reassignment's
	// replicas are member 1's lanes too.
	md := kmsg.NewPtrMetadataRequest()
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr("moved")}}
	mresp, err := md.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	var part, leader int32 = -1, -1
	for _, p := range mresp.Topics[0].Partitions {
		if p.Leader >= laneStride {
			part, leader = p.Partition, p.Leader
			break
		}
	}
	if part < 0 {
		t.Fatal("no partition of 8 on member 1; the test needs one")
	}
	physLeader := kf.LeaderFor("moved", part)
	kf.ControlKey(int16(kmsg.ListPartitionReassignments), func(kmsg.Request) (kmsg.Response, error, bool) {
		r := kmsg.NewPtrListPartitionReassignmentsResponse()
		r.Topics = []kmsg.ListPartitionReassignmentsResponseTopic{{Topic: "moved", Partitions: []kmsg.ListPartitionReassignmentsResponseTopicPartition{
			{Partition: part, Replicas: []int32{physLeader, (physLeader + 1) % 3}, AddingReplicas: []int32{(physLeader + 1) % 3}, RemovingReplicas: []int32{}}}}}
		return r, nil, true
	})
	list := kmsg.NewPtrListPartitionReassignmentsRequest()
	lresp, err := list.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	other := leader - leader%laneStride + (physLeader+1)%3
	if len(lresp.Topics) != 1 || len(lresp.Topics[0].Partitions) != 1 {
		t.Fatalf("list answered %+v", lresp.Topics)
	}
	if p := lresp.Topics[0].Partitions[0]; !slices.Equal(p.Replicas, []int32{leader, other}) || !slices.Equal(p.AddingReplicas, []int32{other}) {
		t.Errorf("list: replicas %v adding %v; want [%d %d] adding [%d] (the lanes Metadata shows)", p.Replicas, p.AddingReplicas, leader, other, other)
	}
}

// TestReplicaLanes: Metadata shows a partition's physical replicas as
// lanes of its leader's member, in the cluster's order, so an assignment
// reads back as given; lanes shared by two replicas are filled up so the
// replication factor stays.
func TestReplicaLanes(t *testing.T) {
	members := func(lanes int, ids ...int32) []routing.Broker {
		var out []routing.Broker
		for _, m := range ids {
			for l := range lanes {
				out = append(out, routing.Broker{NodeID: laneNode(m, l)})
			}
		}
		return out
	}
	for _, c := range []struct {
		name                string
		lanes               int
		brokers             []routing.Broker
		leader              int32
		replicas, isr       []int32 // physical: brokers 11, 12, 13 have lanes 0, 1, 2 (mod lanes)
		wantReplicas, wantI []int32
	}{
		{"one member", 3, members(3, 0), 1, []int32{12, 13}, []int32{13, 12}, []int32{1, 2}, []int32{2, 1}},
		{"leader not preferred", 3, members(3, 0), 2, []int32{12, 13, 11}, []int32{13}, []int32{1, 2, 0}, []int32{2}},
		{"second member leads", 3, members(3, 0, 1), 1002, []int32{13, 11}, []int32{13, 11}, []int32{1002, 1000}, []int32{1002, 1000}},
		{"fewer lanes than brokers", 2, members(2, 0), 0, []int32{11, 13}, []int32{11, 13}, []int32{0, 1}, []int32{0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Server{lanes: c.lanes}
			u := &upstream.Cluster{Lanes: map[int32]int{11: 0, 12: 1, 13: 2}}
			r, isr := s.replicaLanes(u, c.brokers, c.leader, c.replicas, c.isr)
			if !slices.Equal(r, c.wantReplicas) || !slices.Equal(isr, c.wantI) {
				t.Errorf("replicas %v isr %v, want %v and %v", r, isr, c.wantReplicas, c.wantI)
			}
		})
	}
}
