package gateway

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// A group member that joined on the cluster active before a switch goes on
// committing under its member ID until its next heartbeat tells it the new
// cluster does not know it. Those commits land on the new cluster while the
// group there has no members (as the switch's own copy did), so that the
// member, once it rejoins, resumes where it committed rather than at the
// switch's copy. Once the group has members again, they own its offsets: a
// late commit of the old member is refused as a broker refuses it. A
// classic member's heartbeat meanwhile is told to rejoin as in a rebalance.
// For a classic member and a KIP-848 one, on real Kafka.
func TestCommitOfMemberFromBeforeSwitchLands(t *testing.T) {
	primary := cluster(t)
	standby, err := kafkatest.New(kafkatest.Config{Brokers: 1, Name: "carry-standby"})
	if err != nil {
		t.Fatalf("starting the standby cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("standby broker logs:\n%s", standby.LogTail(60))
		}
		standby.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic = "carry"
	onStandby := kadm.NewClient(client(t, standby.Bootstrap()))
	createTopic(t, kadm.NewClient(client(t, primary.Bootstrap())), topic, 2, nil)
	createTopicRF(t, onStandby, topic, 2, 1, nil)

	// commit commits at to both partitions through Ferry as member (id,
	// gen) and returns the answer's codes. (The helpers take the subtest's
	// t: FailNow only from the test's own goroutine.)
	commit := func(t *testing.T, via *kgo.Client, topicID [16]byte, group, id string, gen int32, at int64) []int16 {
		t.Helper()
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Group, req.MemberID, req.Generation = group, id, gen
		rt := kmsg.OffsetCommitRequestTopic{Topic: topic, TopicID: topicID}
		for p := range int32(2) {
			rt.Partitions = append(rt.Partitions, kmsg.OffsetCommitRequestTopicPartition{Partition: p, Offset: at, LeaderEpoch: -1})
		}
		req.Topics = []kmsg.OffsetCommitRequestTopic{rt}
		resp, err := req.RequestWith(ctx, via)
		if err != nil {
			t.Fatalf("OffsetCommit through Ferry: %v", err)
		}
		var codes []int16
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				codes = append(codes, p.ErrorCode)
			}
		}
		return codes
	}
	committed := func(t *testing.T, group string) []int64 {
		t.Helper()
		offs, err := onStandby.FetchOffsets(ctx, group)
		if err == nil {
			err = offs.Error()
		}
		if err != nil {
			t.Fatalf("committed offsets of %s on the standby: %v", group, err)
		}
		var ats []int64
		for p := range int32(2) {
			o, _ := offs.Lookup(topic, p)
			ats = append(ats, o.At)
		}
		return ats
	}
	allCode := func(codes []int16, want ...int16) bool {
		for _, c := range codes {
			if !slices.Contains(want, c) {
				return false
			}
		}
		return len(codes) == 2
	}

	for _, tc := range []struct {
		name string
		join func(t *testing.T, via *kgo.Client, group string) groupMember // joins through Ferry
	}{
		{"classic", func(t *testing.T, via *kgo.Client, group string) groupMember { return joinClassic(t, ctx, via, group) }},
		{"consumer", func(t *testing.T, via *kgo.Client, group string) groupMember {
			return joinConsumer(t, ctx, via, group, topic)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := "carry-" + tc.name
			table := routing.NewTable(routing.State{Active: "primary"})
			f := ferrytest.Start(t, primary.Bootstrap(), proxy.WithRoutingTable(table), proxy.WithClusters(
				upstream.Config{Name: "primary", Bootstrap: primary.Addrs()},
				upstream.Config{Name: "standby", Bootstrap: standby.Addrs(), MirrorTarget: true}))
			via := client(t, f.Addr)
			// The topic's ID as Ferry shows it: OffsetCommit v10
			// names topics by ID, earlier versions by name.
			td, err := kadm.NewClient(via).ListTopics(ctx, topic)
			if err != nil || td[topic].Err != nil {
				t.Fatalf("topic %s through Ferry: %v %v", topic, err, td[topic].Err)
			}
			topicID := td[topic].ID

			old := tc.join(t, via, group)
			if codes := commit(t, via, topicID, group, old.id, old.gen, 5); !allCode(codes, 0) {
				t.Fatalf("commit on the primary answered %v", codes)
			}

			// The switch: its copy of the offsets makes the group
			// on the standby, with no members, then the flip.
			copied := kadm.Offsets{}
			for p := range int32(2) {
				copied.Add(kadm.Offset{Topic: topic, Partition: p, At: 5, LeaderEpoch: -1})
			}
			if err := onStandby.CommitAllOffsets(ctx, group, copied); err != nil {
				t.Fatalf("copying the offsets to the standby: %v", err)
			}
			table.Update(routing.State{Generation: 1, Active: "standby", Last: &routing.Switch{From: "primary", To: "standby"}})
			before := counter(t, f.Registry, "ferry_group_commits_carried_total")

			if tc.name == "classic" {
				// Its heartbeat is told to rejoin as in any
				// rebalance (REBALANCE_IN_PROGRESS), on which
				// clients commit first, rather than that it is
				// unknown, on which they drop what they read.
				hb := kmsg.NewPtrHeartbeatRequest()
				hb.Group, hb.MemberID, hb.Generation = group, old.id, old.gen
				resp, err := hb.RequestWith(ctx, via)
				if err != nil {
					t.Fatalf("Heartbeat through Ferry: %v", err)
				}
				if resp.ErrorCode != kerr.RebalanceInProgress.Code {
					t.Errorf("heartbeat of the member from before the switch answered %v, want REBALANCE_IN_PROGRESS", kerr.ErrorForCode(resp.ErrorCode))
				}
			}

			// The old member commits under its old identity: it
			// lands, and the client is told so.
			if codes := commit(t, via, topicID, group, old.id, old.gen, 9); !allCode(codes, 0) {
				t.Errorf("commit of the member from before the switch answered %v, want success", codes)
			}
			if got := committed(t, group); got[0] != 9 || got[1] != 9 {
				t.Errorf("the standby holds %v committed, want the member's 9 on both partitions", got)
			}
			if n := counter(t, f.Registry, "ferry_group_commits_carried_total") - before; n != 1 {
				t.Errorf("ferry_group_commits_carried_total rose by %v, want 1", n)
			}

			// A member joins on the standby: the group's offsets are
			// its own now, and a late commit of the old member is
			// refused and changes nothing.
			tc.join(t, via, group)
			if codes := commit(t, via, topicID, group, old.id, old.gen, 12); !allCode(codes, kerr.UnknownMemberID.Code, kerr.IllegalGeneration.Code, kerr.StaleMemberEpoch.Code) {
				t.Errorf("commit of the old member once the group has members answered %v, want it refused", codes)
			}
			if got := committed(t, group); got[0] != 9 || got[1] != 9 {
				t.Errorf("the standby holds %v committed after the refused commit, want 9 still", got)
			}
		})
	}
}

// groupMember is a member's identity in its group.
type groupMember struct {
	id  string
	gen int32 // classic generation, or KIP-848 member epoch
}

// joinClassic joins group as a classic consumer member through cl (the
// member ID round and SyncGroup as its leader) and returns its identity.
func joinClassic(t *testing.T, ctx context.Context, cl *kgo.Client, group string) (m groupMember) {
	t.Helper()
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.SessionTimeoutMillis, join.RebalanceTimeoutMillis, join.ProtocolType = group, 45000, 60000, "consumer"
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: (&kmsg.ConsumerMemberMetadata{Topics: []string{"carry"}}).AppendTo(nil)}}
	for range 3 {
		resp, err := join.RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("JoinGroup: %v", err)
		}
		switch err := kerr.ErrorForCode(resp.ErrorCode); err {
		case kerr.MemberIDRequired:
			join.MemberID = resp.MemberID
			continue
		case nil:
		default:
			t.Fatalf("JoinGroup: %v", err)
		}
		sync := kmsg.NewPtrSyncGroupRequest()
		sync.Group, sync.Generation, sync.MemberID = group, resp.Generation, resp.MemberID
		pt, pn := "consumer", "range"
		sync.ProtocolType, sync.Protocol = &pt, &pn
		sync.GroupAssignment = []kmsg.SyncGroupRequestGroupAssignment{{MemberID: resp.MemberID,
			MemberAssignment: (&kmsg.ConsumerMemberAssignment{Topics: []kmsg.ConsumerMemberAssignmentTopic{{Topic: "carry", Partitions: []int32{0, 1}}}}).AppendTo(nil)}}
		sresp, err := sync.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(sresp.ErrorCode)
		}
		if err != nil {
			t.Fatalf("SyncGroup: %v", err)
		}
		m.id, m.gen = resp.MemberID, resp.Generation
		return m
	}
	t.Fatal("JoinGroup: no member ID settled in three rounds")
	return m
}

// joinConsumer joins group as a KIP-848 member through cl and returns its
// member ID and epoch.
func joinConsumer(t *testing.T, ctx context.Context, cl *kgo.Client, group, topic string) (m groupMember) {
	t.Helper()
	hb := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	// The member ID is the client's own since Kafka 4.0 (KIP-1082).
	id := make([]byte, 16)
	rand.Read(id)
	hb.Group, hb.MemberID, hb.MemberEpoch = group, base64.RawURLEncoding.EncodeToString(id), 0
	hb.RebalanceTimeoutMillis = 60000
	hb.SubscribedTopicNames = []string{topic}
	hb.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	resp, err := hb.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("ConsumerGroupHeartbeat (join): %v", err)
	}
	m.id, m.gen = hb.MemberID, resp.MemberEpoch
	if resp.MemberID != nil {
		m.id = *resp.MemberID
	}
	return m
}
