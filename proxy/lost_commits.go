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
// (State.LostStart). A commit with no epoch (-1: Kafka's VerifiableConsumer
// commits `new OffsetAndMetadata(offset)`, as applications that commit
// offsets of their own do) is lowered only when it lies past the new active
// cluster's end, listed then: nothing there can have been read, so it was
// read on the old cluster, and kept it would send the consumer's fetch out
// of range, back to the start of the log or past the new records by its
// reset policy (the chaos replay of 2026-12-05: a KIP-848 consumer reset to
// 0 after its commit of 39268 past a range lost from 38981). One with no
// epoch at or below the end is kept: it may have been read on either.
// Listing the end costs a round trip, so it is done only within the
// window in which Ferry carries the commits of members from before a
// switch (carriesStaleCommits): a consumer with a position read on the old
// cluster commits well inside it, and one that has read on since commits
// epoch-less offsets past the range's start for as long as the switch is
// the last, each of which would cost the listing.

import (
	"context"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// clampLostCommits lowers, in an OffsetCommit or TxnOffsetCommit under the
// state of a forced switch that lost offsets, each committed offset past
// the start of its partition's lost range to that start, when its leader
// epoch is of a generation before the switch's, or when it has none and
// lies past the active cluster's end (within the stale-commit window). It
// reports whether it changed the request.
func (s *Server) clampLostCommits(ctx context.Context, c *clientConn, req *request, kr kmsg.Request) bool {
	st := req.state
	if st.Last == nil || len(st.Last.Lost) == 0 {
		return false // the common case
	}
	clamped := false
	lower := func(group, topic string, partition int32, offset *int64, epoch int32, from int64) {
		c.log.Warn("a commit of a position read on the cluster a forced switch left, past what the switch lost there: lowered to the lost range's start",
			zap.String("group", group), zap.String("topic", topic), zap.Int32("partition", partition),
			zap.Int64("committed", *offset), zap.Int64("lowered_to", from), zap.Int32("leader_epoch", epoch))
		*offset = from
		clamped = true
	}
	// Commits with no epoch past a lost range's start, judged against the
	// new active cluster's ends once they are listed.
	type unknown struct {
		topic     string
		partition int32
		offset    *int64
		from      int64
	}
	var group string
	var unknowns []unknown
	clamp := func(topic string, partition int32, offset *int64, epoch int32) {
		if epoch < 0 {
			if !s.carriesStaleCommits(st.Generation) {
				return
			}
			if r, ok := st.LostRangeOf(topic, partition); ok && *offset > r.From {
				unknowns = append(unknowns, unknown{topic, partition, offset, r.From})
			}
			return
		}
		if from, ok := st.LostStart(topic, partition, epoch); ok && *offset > from {
			lower(group, topic, partition, offset, epoch, from)
		}
	}
	switch r := kr.(type) {
	case *kmsg.OffsetCommitRequest:
		group = r.Group
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
				clamp(name, p.Partition, &p.Offset, p.LeaderEpoch)
			}
		}
	case *kmsg.TxnOffsetCommitRequest:
		group = r.Group
		for i := range r.Topics {
			t := &r.Topics[i]
			for j := range t.Partitions {
				p := &t.Partitions[j]
				clamp(t.Topic, p.Partition, &p.Offset, p.LeaderEpoch)
			}
		}
	}
	if len(unknowns) > 0 {
		var topics []string
		for _, u := range unknowns {
			if !slices.Contains(topics, u.topic) {
				topics = append(topics, u.topic)
			}
		}
		ends, err := kadm.NewClient(req.up.Client).ListEndOffsets(ctx, topics...)
		if err != nil {
			// Kept as committed: what Kafka would have done.
			c.log.Warn("listing end offsets to judge commits with no leader epoch after a forced switch", zap.String("group", group), zap.Error(err))
		}
		for _, u := range unknowns {
			if e, ok := ends.Lookup(u.topic, u.partition); ok && e.Err == nil && *u.offset > e.Offset {
				lower(group, u.topic, u.partition, u.offset, -1, u.from)
			}
		}
	}
	return clamped
}
