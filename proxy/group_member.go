package proxy

import (
	"context"
	"time"

	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Group members from before a switch. A consumer that joined its group on
// the cluster active before a switch keeps its member ID and generation (or
// member epoch) after it; the cluster active now does not know it. What the
// answers to its requests become (memberFromBeforeSwitch):
//
//   - A KIP-848 heartbeat with an epoch meets GROUP_ID_NOT_FOUND (the new
//     cluster has no consumer group of that name, or only the classic one
//     holding the offsets the mirror copied; Kafka answers either way "is
//     not a consumer group"), which the Java and librdkafka consumers take
//     as fatal: it is answered UNKNOWN_MEMBER_ID, on which they rejoin with
//     epoch 0, creating the consumer group over the classic one and keeping
//     its committed offsets (memberOfOtherCluster).
//
//   - Its OffsetCommits are refused UNKNOWN_MEMBER_ID (or
//     ILLEGAL_GENERATION) until its next heartbeat tells it to rejoin — up
//     to a heartbeat interval later (5 s for KIP-848, 3 s classic).
//     Meanwhile it goes on reading from its own positions; when it rejoins,
//     it resumes from the offsets the switch copied, older than what it
//     read, and reads the difference again. So such a commit is applied as
//     the switch's own copy is: sent again as a commit from outside the
//     group (generation -1, no member ID), which the group coordinator
//     accepts only while the group has no members — as it has none on the
//     new cluster until its members rejoin (the switch removed any left from
//     an earlier switch). The client gets that answer. Once a member has
//     rejoined, the group's own members own its offsets, and the broker
//     refuses the re-sent commit: the client gets the first answer, as it
//     would have without Ferry (carryStaleCommit).
//
//   - A classic heartbeat is refused UNKNOWN_MEMBER_ID, on which the clients
//     drop their partitions as lost, without committing what they read
//     (franz-go, Java, librdkafka), and resume at the last commit. It is
//     answered REBALANCE_IN_PROGRESS instead: the member rejoins as in any
//     rebalance, committing first (that commit is carried as above), and its
//     JoinGroup under its old member ID is refused UNKNOWN_MEMBER_ID by the
//     new cluster, on which it joins afresh (staleMemberHeartbeat).
//
// The last two only within staleCommitWindow of this member taking the
// current generation: a member of the old cluster learns it is unknown at
// its next heartbeat, well inside it, while a member fenced by its group
// long after a switch is a zombie the broker rightly refuses. The window is
// this member's own clock; no other machine's takes part.
//
// The re-sent commit goes on Ferry's own connection to the cluster, not the
// client's: the broker answered every partition UNKNOWN_MEMBER_ID or
// ILLEGAL_GENERATION, which it checks after the client's rights on the group
// and each topic, and Ferry's principal holds the same rights for the
// switch's copy.

// staleCommitWindow is how long after taking a generation this member
// carries commits of members from before it.
const staleCommitWindow = time.Minute

// staleCommitTimeout bounds the re-sent commit.
const staleCommitTimeout = 5 * time.Second

// genStart is when this member took a generation.
type genStart struct {
	gen uint32
	at  time.Time
}

// noteGeneration records when this member took the generation in force;
// called at every routing change (warmLoop).
func (s *Server) noteGeneration(gen uint32) {
	if g := s.genSince.Load(); g == nil || g.gen != gen {
		s.genSince.Store(&genStart{gen: gen, at: time.Now()})
	}
}

// carriesStaleCommits reports whether commits of members from before gen
// are carried now.
func (s *Server) carriesStaleCommits(gen uint32) bool {
	g := s.genSince.Load()
	return gen > 0 && g != nil && g.gen == gen && time.Since(g.at) < staleCommitWindow
}

// memberFromBeforeSwitch mends, in place, resp (still physical) to a group
// request kr of a member that may have joined before the switch to gen.
func (s *Server) memberFromBeforeSwitch(ctx context.Context, u *upstream.Cluster, gen uint32, kr kmsg.Request, resp kmsg.Response) {
	switch r := resp.(type) {
	case *kmsg.ConsumerGroupHeartbeatResponse:
		memberOfOtherCluster(gen, kr, r)
	case *kmsg.ShareGroupHeartbeatResponse:
		shareMemberOfOtherCluster(gen, kr, r)
	case *kmsg.StreamsGroupHeartbeatResponse:
		streamsMemberOfOtherCluster(gen, kr, r)
	case *kmsg.TxnOffsetCommitResponse:
		txnCommitOfOtherCluster(gen, kr, r)
	case *kmsg.HeartbeatResponse:
		if s.carriesStaleCommits(gen) {
			staleMemberHeartbeat(r)
		}
	case *kmsg.OffsetCommitResponse:
		if oc := kr.(*kmsg.OffsetCommitRequest); s.carriesStaleCommits(gen) && staleMemberCommit(oc, r) {
			s.carryStaleCommit(ctx, u, oc, r)
		}
	}
}

// memberOfOtherCluster answers UNKNOWN_MEMBER_ID for GROUP_ID_NOT_FOUND to
// a KIP-848 member heartbeating with an epoch under a generation after a
// switch.
func memberOfOtherCluster(gen uint32, kr kmsg.Request, r *kmsg.ConsumerGroupHeartbeatResponse) {
	if hb, ok := kr.(*kmsg.ConsumerGroupHeartbeatRequest); ok {
		rejoinNewCluster(gen, hb.MemberEpoch, &r.ErrorCode, &r.ErrorMessage)
	}
}

// rejoinNewCluster is the answer of the *OfOtherCluster functions: under a
// generation after a switch, a member heartbeating with its epoch (above
// 0) that the new cluster answered GROUP_ID_NOT_FOUND is told
// UNKNOWN_MEMBER_ID, on which it rejoins with epoch 0.
func rejoinNewCluster(gen uint32, epoch int32, code *int16, msg **string) {
	if gen == 0 || epoch <= 0 || *code != kerr.GroupIDNotFound.Code {
		return
	}
	m := "member unknown to the cluster active since a switchover: rejoin"
	*code, *msg = kerr.UnknownMemberID.Code, &m
}

// streamsMemberOfOtherCluster is memberOfOtherCluster for a Kafka Streams
// member of a streams group (KIP-1071): after a switch the new cluster has
// no streams group of that name (the mirror's offsets made it an empty
// classic group, which a member joining with epoch 0 converts), so it
// answers a member heartbeating with its epoch GROUP_ID_NOT_FOUND, which
// Streams takes as fatal; on UNKNOWN_MEMBER_ID it rejoins with epoch 0.
//
// A member leaving (epoch -1, or -2 for a static member) meets the same
// answer there, which Streams also takes as fatal (its thread's unsubscribe
// fails, on the task migration a switch causes): it is not a member of that
// group, so it has left, and is answered so.
func streamsMemberOfOtherCluster(gen uint32, kr kmsg.Request, r *kmsg.StreamsGroupHeartbeatResponse) {
	hb, ok := kr.(*kmsg.StreamsGroupHeartbeatRequest)
	if !ok || gen == 0 || hb.MemberEpoch == 0 || r.ErrorCode != kerr.GroupIDNotFound.Code {
		return
	}
	if hb.MemberEpoch < 0 {
		r.ErrorCode, r.ErrorMessage = 0, nil
		r.MemberID, r.MemberEpoch = hb.MemberID, hb.MemberEpoch
		return
	}
	rejoinNewCluster(gen, hb.MemberEpoch, &r.ErrorCode, &r.ErrorMessage)
}

// txnCommitOfOtherCluster answers UNKNOWN_MEMBER_ID for GROUP_ID_NOT_FOUND
// to a member's TxnOffsetCommit under a generation after a switch: a
// Kafka Streams member of a streams group (KIP-1071) commits, with its
// member ID and epoch, to the new cluster's group, which is an empty
// classic group (the mirror's offsets) until the member's first heartbeat
// there makes it a streams group, and the coordinator answers "not a
// streams group", which the Java producer takes as fatal. UNKNOWN_MEMBER_ID
// is abortable (CommitFailedException), a task migration for Streams.
func txnCommitOfOtherCluster(gen uint32, kr kmsg.Request, r *kmsg.TxnOffsetCommitResponse) {
	tc, ok := kr.(*kmsg.TxnOffsetCommitRequest)
	if !ok || gen == 0 || (tc.MemberID == "" && tc.Generation <= 0) {
		return
	}
	for i := range r.Topics {
		for j := range r.Topics[i].Partitions {
			if p := &r.Topics[i].Partitions[j]; p.ErrorCode == kerr.GroupIDNotFound.Code {
				p.ErrorCode = kerr.UnknownMemberID.Code
			}
		}
	}
}

// shareMemberOfOtherCluster is memberOfOtherCluster for a share group
// member: the new cluster has no share group of that name until a member
// joins (or the switch copied its start offsets), and the Java share
// consumer takes GROUP_ID_NOT_FOUND as fatal; on UNKNOWN_MEMBER_ID it
// rejoins with epoch 0.
func shareMemberOfOtherCluster(gen uint32, kr kmsg.Request, r *kmsg.ShareGroupHeartbeatResponse) {
	if hb, ok := kr.(*kmsg.ShareGroupHeartbeatRequest); ok {
		rejoinNewCluster(gen, hb.MemberEpoch, &r.ErrorCode, &r.ErrorMessage)
	}
}

// staleMemberCommit reports whether an OffsetCommit answered resp was sent by
// a member the cluster does not know: a member's commit (a member ID or a
// generation) refused on every partition as from an unknown member or
// generation.
func staleMemberCommit(req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse) bool {
	if req.MemberID == "" && req.Generation < 0 || resp == nil {
		return false
	}
	n, all := partitionCodes(resp, func(code int16) bool {
		return code == kerr.UnknownMemberID.Code || code == kerr.IllegalGeneration.Code
	})
	return all && n > 0
}

// partitionCodes counts the partitions resp answers and reports whether
// every code passes ok.
func partitionCodes(resp *kmsg.OffsetCommitResponse, ok func(int16) bool) (n int, all bool) {
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if !ok(p.ErrorCode) {
				return n, false
			}
			n++
		}
	}
	return n, true
}

// staleMemberHeartbeat answers REBALANCE_IN_PROGRESS for UNKNOWN_MEMBER_ID
// or ILLEGAL_GENERATION to a classic member's heartbeat.
func staleMemberHeartbeat(resp *kmsg.HeartbeatResponse) {
	if resp.ErrorCode == kerr.UnknownMemberID.Code || resp.ErrorCode == kerr.IllegalGeneration.Code {
		resp.ErrorCode = kerr.RebalanceInProgress.Code
	}
}

// carryStaleCommit re-sends in (already physical) as a commit from outside
// the group on u and, if the broker took every partition, clears the
// errors of resp, its first answer: the client learns its commit landed.
func (s *Server) carryStaleCommit(ctx context.Context, u *upstream.Cluster, in *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse) {
	if s.cfg.writeLease != nil && s.cfg.writeLease.Left() <= 0 {
		// A write like the client's own (sendRaw): only under the
		// member's write lease. The client's request still counts as
		// a write in flight, so a switch's hold waits for this one.
		return
	}
	out := kmsg.NewPtrOffsetCommitRequest()
	out.Group, out.Generation, out.MemberID = in.Group, -1, ""
	// Both the name and the ID of each topic: the version the upstream
	// client picks may name topics either way.
	snap := u.Snapshot()
	for _, t := range in.Topics {
		ti := snap.Topics[t.Topic]
		if ti == nil {
			ti = snap.ByID[t.TopicID]
		}
		if ti == nil {
			return
		}
		ot := kmsg.OffsetCommitRequestTopic{Topic: ti.Name, TopicID: ti.ID}
		for _, p := range t.Partitions {
			ot.Partitions = append(ot.Partitions, kmsg.OffsetCommitRequestTopicPartition{
				Partition: p.Partition, Offset: p.Offset, LeaderEpoch: p.LeaderEpoch, Metadata: p.Metadata,
			})
		}
		out.Topics = append(out.Topics, ot)
	}
	ctx, cancel := context.WithTimeout(ctx, staleCommitTimeout)
	defer cancel()
	carried, err := out.RequestWith(ctx, u.Client)
	if err != nil {
		s.log.Debug("carrying a commit of a group member from before the switch", zap.String("group", in.Group), zap.Error(err))
		return
	}
	// Refused (the group has members again), or not every partition
	// answered: the first answer stands.
	n, taken := partitionCodes(carried, func(code int16) bool { return code == 0 })
	if want, _ := partitionCodes(resp, func(int16) bool { return true }); !taken || n != want {
		return
	}
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			resp.Topics[i].Partitions[j].ErrorCode = 0
		}
	}
	s.metrics.staleCommits.Inc()
}
