package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

// The switch's hold. While the routing state's phase is not serving, a
// request that writes to a cluster waits on its connection's reader before
// it is handled (so a connection's requests still reach the upstream in the
// order sent), and is handled under the state in force once the hold ends:
// the new active cluster after a switch, the old one after a rollback.
// Reads (fetches, metadata, group heartbeats) are never held themselves,
// but one sent on a connection behind a held write waits with it: the
// connection's reader waits, and Kafka answers a connection's requests in
// the order sent, so reading it sooner could not answer it sooner. A
// consumer's heartbeat shares its coordinator connection with its commits:
// it is delayed by at most the hold's bound (heldAnswerAfter), well
// inside a session timeout.
//
// Writes in flight are counted from the moment one passes the hold until
// its answer is written to the client (or abandoned), so the switch knows
// when everything sent to the old cluster has been answered (Settled).
// A write counts itself before it reads the phase: a switch that sets the
// phase and then finds no write counted has none to wait for.

// heldWrites are the keys held while a switch drains. EndTxn is not among
// them: a transaction already open may finish while the mirror drains. It
// is held once the drain is done (switchingWrites).
var heldWrites = map[int16]bool{
	int16(kmsg.Produce):                   true,
	int16(kmsg.OffsetCommit):              true,
	int16(kmsg.TxnOffsetCommit):           true,
	int16(kmsg.AddPartitionsToTxn):        true,
	int16(kmsg.AddOffsetsToTxn):           true,
	int16(kmsg.InitProducerID):            true,
	int16(kmsg.DeleteRecords):             true,
	int16(kmsg.OffsetDelete):              true,
	int16(kmsg.DeleteGroups):              true,
	int16(kmsg.CreateTopics):              true,
	int16(kmsg.DeleteTopics):              true,
	int16(kmsg.CreatePartitions):          true,
	int16(kmsg.AlterConfigs):              true,
	int16(kmsg.IncrementalAlterConfigs):   true,
	int16(kmsg.CreateACLs):                true,
	int16(kmsg.DeleteACLs):                true,
	int16(kmsg.AlterPartitionAssignments): true,
	// A share group's start offsets are copied at the switch: changed
	// meanwhile on the old cluster, the change would be lost.
	// Acknowledgements (ShareAcknowledge, ShareFetch) are not held: one
	// that lands on the old cluster after the copy leaves its records to
	// be delivered again on the new one, as one held to the new cluster
	// would (it acquired nothing there).
	int16(kmsg.AlterShareGroupOffsets):  true,
	int16(kmsg.DeleteShareGroupOffsets): true,
}

// holds reports whether a request of key waits under phase.
func holds(phase routing.Phase, key int16) bool {
	switch phase {
	case routing.PhaseDraining:
		return heldWrites[key]
	case routing.PhaseSwitching:
		return heldWrites[key] || key == int16(kmsg.EndTxn)
	}
	return false
}

// isWrite reports whether requests of key are counted as writes.
func isWrite(key int16) bool { return heldWrites[key] || key == int16(kmsg.EndTxn) }

// defaultHeldAnswerAfter bounds how long one request waits in the hold
// (WithHeldAnswerAfter): then it is answered with its API's retriable error
// (errHeldTooLong) and the client sends it again, to be held anew. A drain
// may take up to the switch's timeout (30 s by default), as long as the
// clients' own request timeouts (30 s in Java, kafkajs and librdkafka, 10 s
// plus 10 s in franz-go), and a client whose request times out closes its
// connection: an answer before that keeps it.
const defaultHeldAnswerAfter = 10 * time.Second

// errHeldTooLong is a request that waited in the hold for heldAnswerAfter.
var errHeldTooLong = errors.New("held by a switchover longer than a client waits; retry")

// passHold waits while the routing state holds requests of key, or while
// the member's write lease is not in force (a write of any kind), then
// counts the request as a write in flight and returns the state it passed
// under: the one the request is handled under. It fails when ctx ends, and
// with errHeldTooLong after the server's heldAnswerAfter.
func (s *Server) passHold(ctx context.Context, key int16) (routing.State, error) {
	lease := s.cfg.writeLease
	var expired <-chan time.Time
	for {
		s.writes.Add(1)
		changed := s.routes.Changed()
		var renewed <-chan struct{}
		if lease != nil {
			renewed = lease.Changed()
		}
		st := s.routes.Current()
		if !holds(st.Phase, key) && (lease == nil || lease.Left() > 0) {
			return st, nil
		}
		s.writes.Add(-1)
		if expired == nil {
			t := time.NewTimer(s.cfg.heldAnswerAfter)
			defer t.Stop()
			expired = t.C
		}
		s.metrics.held.Inc()
		select {
		case <-changed:
			s.metrics.held.Dec()
		case <-renewed:
			s.metrics.held.Dec()
		case <-expired:
			s.metrics.held.Dec()
			return st, errHeldTooLong
		case <-ctx.Done():
			s.metrics.held.Dec()
			return routing.State{}, ctx.Err()
		}
	}
}

// writeDone ends a write's count; safe to call more than once per request.
func (s *Server) writeDone(req *request) {
	if req.write {
		req.write = false
		s.writes.Add(-1)
	}
}

// Settled returns once no write is in flight — every write that passed the
// hold before the routing state began holding it has been answered — or
// with ctx's error. The switch calls it after setting a holding phase.
func (s *Server) Settled(ctx context.Context) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for s.writes.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// refusedAfterForced reports whether the answers to writes of key are
// refused once a forced switch holds (State.ForcedFrom): the records and
// committed offsets a client would count on.
func refusedAfterForced(key int16) bool {
	return key == int16(kmsg.Produce) || key == int16(kmsg.OffsetCommit)
}

// reasonForcedSwitch counts the answers refused so (ferry_refusals_total).
const reasonForcedSwitch = "forced_switch"

// forcedAway is the answer to a write sent under a generation a forced
// switch has since left, in place of the old cluster's: that cluster may
// have taken it after the switch stopped the mirror, past the ranges the
// switch reports lost, and it will not be copied. The client sends it
// again, held until the new generation is installed, and written to the
// new active cluster.
func (s *Server) forcedAway(req *request) ([]byte, func()) {
	s.metrics.refused(req.hdr.Key, reasonForcedSwitch)
	return encodeResponse(req, s.unwrittenAnswer(req, "ferry: the active cluster was switched away from by force; send it again"))
}

// unwrittenAnswer is the answer to a write Ferry did not let through (held
// too long, or answered by a cluster a forced switch left): its API's
// retriable error with msg. A produce's batches are noted unwritten, so
// that an idempotent producer's later batches wait for them, which the
// client sends again.
func (s *Server) unwrittenAnswer(req *request, msg string) kmsg.Response {
	if p, ok := req.kr.(*kmsg.ProduceRequest); ok {
		s.remapped.refuseUnwritten(s.routes.Current().Generation, req, p, kerr.OutOfOrderSequenceNumber.Code, func(int, int32) bool { return true })
	}
	return errorResponse(req.kr, upstreamErrorCode(req.kr), msg)
}
