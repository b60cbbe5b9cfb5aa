package proxy

// Commits of positions a forced switch lost. A forced switch stops the
// mirror where it is: what the old cluster had acknowledged past that
// point, in each partition, is a lost range [From, To) (routing.LostRange)
// whose offsets the new active cluster fills with other records. A
// consumer that read into a lost range on the old cluster and commits its
// position after the switch (its commit held through it, or sent before
// its first fetch from the new cluster) commits an offset inside the range
// or past it; were it kept, the group would resume there and skip the new
// cluster's records from From on, and the consumer itself, once its fetch
// met the truncation (its leader epoch's end below its position) and reset
// to From, would read below what it had committed (the 30-minute chaos run
// of 2026-12-04: a KIP-848 consumer committed 3963 on the new cluster,
// inside a lost range starting at 3722, 0.3 s before its first fetch).
//
// So such a commit is lowered to the lost range's start. The commit tells
// where its position came from by the leader epoch it carries: one issued
// under a generation before the switch's was read on the old cluster
// (State.LostStart). A commit with no epoch (-1) is kept as it is: nothing
// tells where it was read.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// clampLostCommits lowers, in an OffsetCommit or TxnOffsetCommit under the
// state of a forced switch that lost offsets, each committed offset past
// the start of its partition's lost range to that start, when its leader
// epoch is of a generation before the switch's. It reports whether it
// changed the request.
func (s *Server) clampLostCommits(ctx context.Context, c *clientConn, req *request, kr kmsg.Request) bool {
	st := req.state
	if st.Last == nil || len(st.Last.Lost) == 0 {
		return false // the common case
	}
	clamped := false
	clamp := func(group, topic string, partition int32, offset *int64, epoch int32) {
		from, ok := st.LostStart(topic, partition, epoch)
		if !ok || *offset <= from {
			return
		}
		c.log.Warn("a commit of a position read on the cluster a forced switch left, past what the switch lost there: lowered to the lost range's start",
			zap.String("group", group), zap.String("topic", topic), zap.Int32("partition", partition),
			zap.Int64("committed", *offset), zap.Int64("lowered_to", from), zap.Int32("leader_epoch", epoch))
		*offset = from
		clamped = true
	}
	switch r := kr.(type) {
	case *kmsg.OffsetCommitRequest:
		for i := range r.Topics {
			t := &r.Topics[i]
			name := t.Topic
			if req.hdr.Version >= 10 {
				// By topic ID (KIP-848's OffsetCommit v10).
				ti := req.up.TopicByVID(ctx, t.TopicID)
				if ti == nil {
					continue
				}
				name = ti.Name
			}
			for j := range t.Partitions {
				p := &t.Partitions[j]
				clamp(r.Group, name, p.Partition, &p.Offset, p.LeaderEpoch)
			}
		}
	case *kmsg.TxnOffsetCommitRequest:
		for i := range r.Topics {
			t := &r.Topics[i]
			for j := range t.Partitions {
				p := &t.Partitions[j]
				clamp(r.Group, t.Topic, p.Partition, &p.Offset, p.LeaderEpoch)
			}
		}
	}
	return clamped
}
