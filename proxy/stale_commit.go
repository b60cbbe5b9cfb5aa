package proxy

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Commits of group members from before a switch. A consumer that joined its
// group on the cluster active before a switch keeps its member ID and
// generation (or member epoch) after it: the cluster active now does not
// know it, and answers its OffsetCommits UNKNOWN_MEMBER_ID (or
// ILLEGAL_GENERATION) until the member's next heartbeat tells it so and it
// rejoins — up to a heartbeat interval later (5 s for KIP-848, 3 s classic).
// Meanwhile it goes on reading from its own positions; when it rejoins, it
// resumes from the offsets the switch copied, older than what it read, and
// reads the difference again.
//
// So such a commit is applied as the switch's own copy is: sent again as a
// commit from outside the group (generation -1, no member ID), which the
// group coordinator accepts only while the group has no members — as it has
// none on the new cluster until its members rejoin (the switch removed any
// left from an earlier switch). The client gets that answer. Once a member
// has rejoined, the group's own members own its offsets, and the broker
// refuses the re-sent commit: the client gets the first answer, as it
// would have without Ferry.
//
// Only within staleCommitWindow of this member taking the current
// generation: a member of the old cluster learns it is unknown at its next
// heartbeat, well inside it, while a member fenced by its group long after
// a switch is a zombie the broker rightly refuses. The window is this
// member's own clock; no other machine's takes part.
//
// The re-sent commit goes on Ferry's own connection to the cluster, not the
// client's: the broker answered every partition UNKNOWN_MEMBER_ID or
// ILLEGAL_GENERATION, which it checks after the client's rights on the group
// and each topic, and Ferry's principal holds the same rights for the
// switch's copy.

// A classic member's heartbeat meets the same: UNKNOWN_MEMBER_ID, on which
// the clients drop their partitions as lost, without committing what they
// read (franz-go, Java, librdkafka), and resume at the last commit. Within
// the same window it is answered REBALANCE_IN_PROGRESS instead: the member
// rejoins as in any rebalance, committing first (that commit is carried as
// above), and its JoinGroup under its old member ID is refused
// UNKNOWN_MEMBER_ID by the new cluster, on which it joins afresh.

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

// staleMemberCommit reports whether an OffsetCommit answered resp was sent by
// a member the cluster does not know: a member's commit (a member ID or a
// generation) refused on every partition as from an unknown member or
// generation.
func staleMemberCommit(req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse) bool {
	if req.MemberID == "" && req.Generation < 0 || resp == nil {
		return false
	}
	n := 0
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != kerr.UnknownMemberID.Code && p.ErrorCode != kerr.IllegalGeneration.Code {
				return false
			}
			n++
		}
	}
	return n > 0
}

// staleMemberHeartbeat answers REBALANCE_IN_PROGRESS for UNKNOWN_MEMBER_ID
// or ILLEGAL_GENERATION to a classic member's heartbeat, when carried.
func staleMemberHeartbeat(resp *kmsg.HeartbeatResponse) bool {
	if resp.ErrorCode != kerr.UnknownMemberID.Code && resp.ErrorCode != kerr.IllegalGeneration.Code {
		return false
	}
	resp.ErrorCode = kerr.RebalanceInProgress.Code
	return true
}

// carryStaleCommit re-sends in (already physical) as a commit from outside
// the group on u and, if the broker took every partition, clears the
// errors of resp, its first answer: the client learns its commit landed.
func (s *Server) carryStaleCommit(ctx context.Context, u *upstream, in *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse) {
	out := kmsg.NewPtrOffsetCommitRequest()
	out.Group, out.Generation, out.MemberID = in.Group, -1, ""
	// Both the name and the ID of each topic: the version the upstream
	// client picks may name topics either way.
	snap := u.snapshot()
	for _, t := range in.Topics {
		ti := snap.topics[t.Topic]
		if ti == nil {
			ti = snap.byID[t.TopicID]
		}
		if ti == nil {
			return
		}
		ot := kmsg.OffsetCommitRequestTopic{Topic: ti.name, TopicID: ti.id}
		for _, p := range t.Partitions {
			ot.Partitions = append(ot.Partitions, kmsg.OffsetCommitRequestTopicPartition{
				Partition: p.Partition, Offset: p.Offset, LeaderEpoch: p.LeaderEpoch, Metadata: p.Metadata,
			})
		}
		out.Topics = append(out.Topics, ot)
	}
	if s.cfg.lease != nil && !s.cfg.lease.Valid() {
		// A write like the client's own (sendRaw): only under the
		// member's write lease. The client's request still counts as
		// a write in flight, so a switch's hold waits for this one.
		return
	}
	ctx, cancel := context.WithTimeout(ctx, staleCommitTimeout)
	defer cancel()
	carried, err := out.RequestWith(ctx, u.cl)
	if err != nil {
		s.log.Debug("carrying a commit of a group member from before the switch", zap.String("group", in.Group), zap.Error(err))
		return
	}
	n := 0
	for _, t := range carried.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				// Refused (the group has members again): the
				// first answer stands.
				return
			}
			n++
		}
	}
	want := 0
	for i := range resp.Topics {
		want += len(resp.Topics[i].Partitions)
	}
	if n != want {
		return
	}
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			resp.Topics[i].Partitions[j].ErrorCode = 0
		}
	}
	s.metrics.staleCommits.Inc()
}
