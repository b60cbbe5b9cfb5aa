package proxy

// An idempotent producer continued across a switch. Under a new generation
// a producer of an earlier one writes under an ID Ferry allocates on the
// new active cluster (remappedPIDs), and a broker takes any first sequence
// from an ID it holds no state for. Were the first batch it meets there one
// sent after a batch still outstanding elsewhere (on a member cut off from
// the fleet through the switch, or paused), that earlier batch would meet
// OUT_OF_ORDER_SEQUENCE_NUMBER when it came, and the Java producer would
// bump its epoch and write it after its successors (the 30-minute chaos
// run: "2/53258 holds 305788 after 306303").
//
// The cluster a planned switch took over from still holds each producer's
// last written sequence per partition (DescribeProducers, KIP-664): it took
// no write after the flip (the write lease), and the drain copied all it
// had. So the first batch of a (producer, partition) under a generation
// must continue it, whichever member it comes through:
//   - the same epoch and the next sequence: written (it becomes the
//     partition's first, remappedPIDs.claim);
//   - the same epoch and a sequence at or below the last: written before the
//     switch, its answer lost — if that cluster holds it (writtenBefore).
//     DUPLICATE_SEQUENCE_NUMBER at its offset, which the Java producer,
//     franz-go and librdkafka take for success; writing it again would
//     write it twice. Not there, it is written;
//   - the same epoch and beyond the next: NOT_LEADER_OR_FOLLOWER (retried
//     in place, no epoch bump) until the missing batch comes — unless the
//     active cluster already holds the allocated ID's state in the
//     partition (another member wrote the missing batch, and the broker
//     orders what follows), or continueWait has passed (the client gave
//     that batch up: a new epoch would start afresh anyway);
//   - an older epoch: sent before the client bumped its epoch and kept
//     since by a member paused or cut off (the 30-minute chaos run: a batch
//     of epoch 45 written after the producer's epoch-47 batches);
//     NOT_LEADER_OR_FOLLOWER, so a client still waiting for it sends it
//     again under its current epoch;
//   - a newer epoch: as the same one with nothing written yet (a client
//     bumping its epoch starts every partition's sequence at 0): sequence
//     0 is written, a later one waits for it as above;
//   - nothing known of the producer there: written.
//
// Only a planned switch's state names the cluster taken over from
// (routing.State.Previous): after a forced switch (the old cluster may be
// gone), a rolled-back one, or for a producer idle through a whole
// generation, the first batch is written as before.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// continueWait bounds how long a producer's partition waits for the batch
// after the last one written on the cluster taken over from: beyond the
// Java producer's request timeout (30 s), after which it sends the
// outstanding batch again.
const continueWait = 45 * time.Second

// prodState is a producer's last written batch in a partition.
type prodState struct {
	epoch int16
	last  int32 // its last sequence
}

// topicProducers is what the cluster taken over from holds of a topic's
// producers, by partition: read once per generation, in one request for
// the whole topic (a producer writes most of a topic's partitions, and one
// request per partition would cost a round trip each on the client's
// connection); concurrent callers wait for the same read.
type topicProducers struct {
	ready chan struct{}
	parts map[int32]map[int64]prodState
	err   error // the whole read's
}

// prevReadWait bounds a read of the cluster taken over from. Once one
// fails as a whole (the cluster unreachable, or slow), none is tried again
// for prevReadRetry: every first batch waiting on it would stall its
// client's connection. They are refused, retriable, meanwhile
// (unknownYet).
const (
	prevReadWait  = 2 * time.Second
	prevReadRetry = 5 * time.Second
)

// continuation is where the first batches of a (producer, partition)
// under a generation stand.
type continuation struct {
	passed bool      // continued, or nothing to continue: checked
	since  time.Time // first refused, waiting for the batch after the last written
}

// continues checks an idempotent producer's batch (epoch, seq), of another
// generation and written under phys, against where the producer stopped in
// that partition on the cluster the current generation took over from. It
// answers 0 to write it, or the code to answer it with.
func (s *Server) continues(ctx context.Context, c *clientConn, req *request, k gapKey, topic string, phys int64, epoch int16, seq int32) int16 {
	gen := req.state.Generation
	if s.remapped.passed(gen, k) {
		return 0
	}
	pass := func() int16 { s.remapped.pass(gen, k); return 0 }
	prevGen, from, ok := req.state.Previous()
	u := s.cluster(from)
	if !ok || u == nil {
		return pass()
	}
	old, err := s.previousPID(ctx, gen, prevGen, k.virt)
	if err != nil {
		return s.unknownYet(c, gen, k, topic, err)
	}
	if old < 0 {
		return pass() // it wrote nothing then
	}
	parts, err := s.remapped.producersOf(ctx, gen, topic, func(ctx context.Context) (map[int32]map[int64]prodState, error) {
		ctx, cancel := context.WithTimeout(ctx, prevReadWait)
		defer cancel()
		// Every partition either cluster knows (the mirror keeps the
		// counts alike).
		n := max(u.Snapshot().Topics[topic].PartitionCount(), req.up.Snapshot().Topics[topic].PartitionCount(), k.partition+1)
		all := make([]int32, n)
		for i := range all {
			all[i] = int32(i)
		}
		return describeProducers(ctx, u, topic, all)
	})
	if err != nil {
		return s.unknownYet(c, gen, k, topic, fmt.Errorf("reading the producers of cluster %s: %w", from, err))
	}
	st, found := parts[k.partition][old]
	switch {
	case !found:
		return pass() // nothing to continue
	case st.epoch > epoch:
		// Sent before the client bumped its epoch, and kept since by a
		// member paused or cut off: the client has moved the batch to
		// its new epoch (the broker, holding the ID's state, would
		// refuse it). Retriable: a client still waiting for it sends it
		// again under its current epoch.
		return kerr.NotLeaderForPartition.Code
	}
	next := st.last + 1
	switch {
	case st.epoch < epoch:
		next = 0 // a new epoch starts its sequences afresh, in every partition
	case st.last == math.MaxInt32:
		next = 0 // sequences wrap
	}
	switch {
	case seq == next:
		return pass()
	case st.epoch == epoch && seq <= st.last:
		return s.writtenBefore(ctx, c, req, k, topic, u, prevGen, old, epoch, seq)
	}
	// Beyond the next: the batches between are outstanding, unless
	// another member wrote them already. Asked at each of the client's
	// retries, so that it goes on as soon as they are written; only while
	// a batch is outstanding elsewhere, for continueWait at most.
	if now, err := describeProducers(ctx, req.up, topic, []int32{k.partition}); err == nil {
		if _, ok := now[k.partition][phys]; ok {
			return pass()
		}
	}
	if waited := s.remapped.waiting(gen, k); waited > continueWait {
		c.log.Warn("a producer of another generation never sent the batch after its last one on the cluster taken over from: its later batch is written",
			zap.Int64("producer_id", k.virt), zap.String("topic", topic), zap.Int32("partition", k.partition),
			zap.Int32("last_sequence", st.last), zap.Int32("sequence", seq), zap.Duration("waited", waited))
		return pass()
	}
	return kerr.NotLeaderForPartition.Code
}

// unknownYet answers a producer's first batch under gen while where it
// stopped on the cluster taken over from cannot be learnt (that cluster,
// or a member holding the ID it wrote under there, did not answer):
// NOT_LEADER_OR_FOLLOWER, retried in place, for continueWait; then it is
// written unchecked. Written at once, a later batch could become the
// partition's first under the allocated ID while an earlier one is still
// outstanding, and the earlier one land after it.
func (s *Server) unknownYet(c *clientConn, gen uint32, k gapKey, topic string, err error) int16 {
	if waited := s.remapped.waiting(gen, k); waited > continueWait {
		c.log.Warn("where a producer of another generation stopped stayed unknown: its batch is written unchecked",
			zap.Int64("producer_id", k.virt), zap.String("topic", topic), zap.Int32("partition", k.partition),
			zap.Duration("waited", waited), zap.Error(err))
		s.remapped.pass(gen, k)
		return 0
	}
	c.log.Debug("where a producer of another generation stopped is unknown yet: refused, retriable",
		zap.Int64("producer_id", k.virt), zap.String("topic", topic), zap.Int32("partition", k.partition), zap.Error(err))
	return kerr.NotLeaderForPartition.Code
}

// previousPID is the physical ID virt wrote under in prevGen: its own, if
// issued then, or the one allocated for it then (kept here, or asked of
// the other members); -1 when none was. An error: a member that may hold
// it did not answer, and nothing is known.
func (s *Server) previousPID(ctx context.Context, gen, prevGen uint32, virt int64) (int64, error) {
	if phys, ok := routing.PhysicalPID(prevGen, virt); ok {
		return phys, nil
	}
	if phys, known := s.remapped.prevHeld(prevGen, virt); known {
		return phys, nil
	}
	phys := int64(-1)
	if s.cfg.peers != nil {
		var err error
		if phys, err = s.heldByPeers(ctx, txnCall{Op: "pidprev", Query: txnQuery{Gen: gen, PID: virt, PrevGen: prevGen}}); err != nil {
			return -1, err
		}
	}
	s.remapped.notePrev(prevGen, virt, phys)
	return phys, nil
}

// describeProducers reads what the cluster behind u holds of the producers
// of partitions of topic, by partition: the epoch and last sequence of
// each. A partition or topic answered with an error (the topic missing
// there, say) is left out, and its first batches are written unchecked;
// an error is the cluster's (unreachable).
func describeProducers(ctx context.Context, u *upstream.Cluster, topic string, partitions []int32) (map[int32]map[int64]prodState, error) {
	req := kmsg.NewPtrDescribeProducersRequest()
	rt := kmsg.NewDescribeProducersRequestTopic()
	rt.Topic, rt.Partitions = topic, partitions
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, u.Client) // split by leader, answers merged (kgo)
	var ke *kerr.Error
	if errors.As(err, &ke) {
		// The cluster answered, for the topic (unknown there, not
		// authorized): no partition of it is known.
		return map[int32]map[int64]prodState{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[int32]map[int64]prodState{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if t.Topic != topic || p.ErrorCode != 0 {
				continue
			}
			by := make(map[int64]prodState, len(p.ActiveProducers))
			for _, ap := range p.ActiveProducers {
				by[ap.ProducerID] = prodState{epoch: int16(ap.ProducerEpoch), last: ap.LastSequence}
			}
			out[p.Partition] = by
		}
	}
	return out, nil
}

// passed reports whether the first batches of k under gen were checked.
func (r *remappedPIDs) passed(gen uint32, k gapKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.reset(gen) {
		return false
	}
	c, _ := r.conts.Peek(k)
	return c.passed
}

// pass notes that k's batches under gen go on unchecked.
func (r *remappedPIDs) pass(gen uint32, k gapKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reset(gen) && r.conts.Add(k, continuation{passed: true}) && r.evicted != nil {
		r.evicted.Inc()
	}
}

// waiting is how long k's batches under gen have waited for the one after
// the last written on the cluster taken over from, counted from now at the
// first call.
func (r *remappedPIDs) waiting(gen uint32, k gapKey) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.reset(gen) {
		return 0
	}
	c, _ := r.conts.Peek(k)
	if c.since.IsZero() {
		c.since = time.Now()
		if r.conts.Add(k, c) && r.evicted != nil {
			r.evicted.Inc()
		}
	}
	return time.Since(c.since)
}

// producersOf is what the cluster taken over from holds of topic's
// producers, read by read once under gen; nothing is read for
// prevReadRetry after a read failed as a whole.
func (r *remappedPIDs) producersOf(ctx context.Context, gen uint32, topic string, read func(context.Context) (map[int32]map[int64]prodState, error)) (map[int32]map[int64]prodState, error) {
	r.mu.Lock()
	if !r.reset(gen) {
		r.mu.Unlock()
		return nil, errOtherGeneration
	}
	if r.oldsDown != nil && time.Since(r.oldsDownAt) < prevReadRetry {
		err := r.oldsDown
		r.mu.Unlock()
		return nil, err
	}
	e, _ := r.olds.Get(topic)
	if e != nil {
		r.mu.Unlock()
		select {
		case <-e.ready:
			return e.parts, e.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	e = &topicProducers{ready: make(chan struct{})}
	if r.olds.Add(topic, e) && r.evicted != nil {
		r.evicted.Inc()
	}
	r.mu.Unlock()
	e.parts, e.err = read(ctx)
	close(e.ready)
	if e.err != nil {
		r.mu.Lock()
		if r.gen == gen {
			r.oldsDown, r.oldsDownAt = fmt.Errorf("reading the producers of %s: %w", topic, e.err), time.Now()
			if cur, _ := r.olds.Peek(topic); cur == e {
				r.olds.Remove(topic) // read again after prevReadRetry
			}
		}
		r.mu.Unlock()
	}
	return e.parts, e.err
}

// prevHeld is the physical ID virt wrote under in prevGen, allocated by or
// learned on this member (-1: known to be none); known is false when this
// member does not know.
func (r *remappedPIDs) prevHeld(prevGen uint32, virt int64) (phys int64, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var m *simplelru.LRU[int64, *remapped]
	switch {
	case r.m != nil && r.gen == prevGen:
		m = r.m
	case r.prev != nil && r.prevGen == prevGen:
		m = r.prev
	default:
		return -1, false
	}
	return readyIn(m, virt)
}

// notePrev keeps what the other members said virt wrote under in prevGen.
func (r *remappedPIDs) notePrev(prevGen uint32, virt, phys int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.prev == nil || r.prevGen != prevGen {
		if r.gen == prevGen {
			return // not moved past it yet
		}
		r.prevGen = prevGen
		r.prev, _ = simplelru.NewLRU[int64, *remapped](maxRemapped, nil)
	}
	e := &remapped{ready: make(chan struct{}), phys: phys}
	close(e.ready)
	if r.prev.Add(virt, e) && r.evicted != nil {
		r.evicted.Inc()
	}
}

// writtenBefore answers a batch (epoch, seq) of k's producer at or below
// the last sequence old, its ID under prevGen, wrote in the partition on
// the cluster u taken over from. The producer's state there says only that
// the batches from old's first in the partition up to that last one were
// written: the broker takes any first sequence from an ID it holds no
// state for, so a batch sent after this one may have been written first
// under old (its first batch there let through unchecked: a member that
// died, a producer idle through a generation), and this one never. Taken
// for written, it was lost (the chaos run in CI on 2026-12-03: ten records
// answered DUPLICATE_SEQUENCE_NUMBER, on neither cluster). So the batch is
// looked for in that cluster's log, between where prevGen began there and
// where the switch stopped the mirror: found, it is on the new cluster at
// the same offset, and the answer is DUPLICATE_SEQUENCE_NUMBER at that
// offset; not there (or only past where the mirror stopped), it is
// written. A look that cannot finish (the cluster slow, the range too long
// to read) is answered retriable, for continueWait at most; past that the
// batch is written (a duplicate, were it written long before, rather than
// a loss).
func (s *Server) writtenBefore(ctx context.Context, c *clientConn, req *request, k gapKey, topic string, u *upstream.Cluster, prevGen uint32, old int64, epoch int16, seq int32) int16 {
	hi, ok := req.state.FenceEnd(prevGen, topic, k.partition)
	if !ok {
		hi = -1
	}
	lo, _ := req.state.FenceBefore(prevGen, topic, k.partition) // 0 if unknown
	at, found, err := findBatch(ctx, u, topic, k.partition, lo, hi, old, epoch, seq)
	gen := req.state.Generation
	switch {
	case err != nil:
		if waited := s.remapped.waiting(gen, k); waited <= continueWait {
			c.log.Debug("looking for a batch on the cluster taken over from failed: refused, retriable",
				zap.String("topic", topic), zap.Int32("partition", k.partition), zap.Int64("producer_id", k.virt), zap.Int32("sequence", seq), zap.Error(err))
			return kerr.NotLeaderForPartition.Code
		}
		c.log.Warn("a batch below the producer's last sequence on the cluster taken over from could not be looked for there: written, perhaps twice",
			zap.String("topic", topic), zap.Int32("partition", k.partition), zap.Int64("producer_id", k.virt), zap.Int32("sequence", seq), zap.Error(err))
	case found:
		if req.writtenAt == nil {
			req.writtenAt = map[gapPart]int64{}
		}
		req.writtenAt[gapPart{k.topic, k.topicID, k.partition}] = at
		return kerr.DuplicateSequenceNumber.Code
	default:
		c.log.Warn("a batch below the producer's last sequence on the cluster taken over from is not there: written",
			zap.String("topic", topic), zap.Int32("partition", k.partition), zap.Int64("producer_id", k.virt),
			zap.Int16("epoch", epoch), zap.Int32("sequence", seq))
	}
	s.remapped.pass(gen, k)
	return 0
}

// findBatchBytes bounds what findBatch reads.
const findBatchBytes = 64 << 20

// findBatch looks in topic's partition on u, from hi (its high watermark
// when negative) back to lo, for the batch of producer pid holding (epoch,
// seq), and answers the offset of that sequence's record. The broker keeps
// a producer's batches in sequence order, so the walk back ends at the
// first batch of pid below seq, or of an older epoch. It reads only batch
// headers.
func findBatch(ctx context.Context, u *upstream.Cluster, topic string, partition int32, lo, hi, pid int64, epoch int16, seq int32) (int64, bool, error) {
	// The partition's leader and the topic's ID there, asked (the
	// metadata this member keeps of a cluster it no longer routes to may
	// be stale), and the log's bounds.
	adm := kadm.NewClient(u.Client)
	meta, err := adm.Metadata(ctx, topic)
	if err != nil {
		return 0, false, err
	}
	td := meta.Topics[topic]
	pd, ok := td.Partitions[partition]
	if td.Err != nil || !ok || pd.Err != nil || pd.Leader < 0 {
		return 0, false, fmt.Errorf("no leader known for %s[%d]", topic, partition)
	}
	bound := func(list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
		listed, err := list(ctx, topic)
		if err != nil {
			return 0, err
		}
		o, ok := listed.Lookup(topic, partition)
		if !ok {
			return 0, fmt.Errorf("%s[%d] not listed", topic, partition)
		}
		return o.Offset, o.Err
	}
	start, err := bound(adm.ListStartOffsets)
	if err != nil {
		return 0, false, err
	}
	end, err := bound(adm.ListEndOffsets)
	if err != nil {
		return 0, false, err
	}
	if hi < 0 || hi > end {
		hi = end
	}
	lo = max(lo, start)
	br, id := u.Client.Broker(int(pd.Leader)), [16]byte(td.ID)
	fetch := func(at int64) (*kmsg.FetchResponseTopicPartition, error) {
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxWaitMillis = 0
		req.MaxBytes = 1 << 20
		req.SessionEpoch = -1 // no fetch session
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = topic, id // by name to v12, by ID from v13
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset = partition, at
		rp.CurrentLeaderEpoch, rp.LastFetchedEpoch, rp.LogStartOffset = -1, -1, -1
		rp.PartitionMaxBytes = 1 << 20
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, br)
		if err != nil {
			return nil, err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return nil, err
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return nil, errors.New("the Fetch answer does not name the partition")
		}
		p := &resp.Topics[0].Partitions[0]
		if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
			return nil, fmt.Errorf("Fetch of %s[%d] at %d: %w", topic, partition, at, err)
		}
		return p, nil
	}
	read := 0
	for step := int64(1024); hi > lo; step = min(step*2, 1<<16) {
		from := max(lo, hi-step)
		var (
			at     = int64(-1)
			absent bool
		)
		for next := from; next < hi; {
			p, err := fetch(next)
			if err != nil {
				return 0, false, err
			}
			read += len(p.RecordBatches)
			if read > findBatchBytes {
				return 0, false, fmt.Errorf("not found in the last %d bytes of %s[%d]", findBatchBytes, topic, partition)
			}
			moved := false
			err = protocol.WalkBatches(p.RecordBatches, func(b protocol.Batch) error {
				if b.BaseOffset() >= hi {
					return errStop
				}
				if b.NextOffset() > next {
					next, moved = b.NextOffset(), true
				}
				if b.ProducerID() != pid || b.IsControl() {
					return nil
				}
				last := b.BaseSequence() + b.LastOffsetDelta()
				switch {
				case b.ProducerEpoch() == epoch && b.BaseSequence() <= seq && seq <= last:
					at = b.BaseOffset() + int64(seq-b.BaseSequence())
				case b.ProducerEpoch() < epoch || b.ProducerEpoch() == epoch && last < seq:
					absent = true
				}
				return nil
			})
			if err != nil && !errors.Is(err, errStop) {
				return 0, false, err
			}
			if !moved || errors.Is(err, errStop) {
				break
			}
		}
		if at >= 0 {
			return at, true, nil
		}
		if absent {
			return 0, false, nil
		}
		hi = from
	}
	return 0, false, nil
}
