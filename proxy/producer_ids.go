package proxy

// Producer IDs of another generation. A client keeps the producer ID it was
// given across a switch; the clusters both hand out IDs from 0, so that ID's
// physical part names nothing, or another producer, on the cluster active
// now. It is never forwarded. What the client gets instead is what lets it
// carry on (the codes were chosen by reading the Java 4.4, franz-go and
// kafkajs 2.2 producers):
//
//   - Produce, idempotent: the batch is written under a producer ID Ferry
//     allocates on the active cluster for that client ID (remappedPIDs). The
//     Java idempotent producer never asks for a new ID after its first (an
//     epoch bump is local, same ID), so any error would come back forever; a
//     broker accepts any sequence from a producer ID it holds no state for.
//   - InitProducerId with another generation's ID and epoch (a KIP-360 bump,
//     or franz-go reloading its ID): sent as a fresh init (-1, -1); the
//     answer's new ID is taken by every client. Any InitProducerId of a
//     transactional ID also fences, from then on, every ID of another
//     generation that names it (txnRemaps: owned), as the broker fences an
//     older epoch.
//   - The transactional requests (Produce, AddPartitionsToTxn,
//     AddOffsetsToTxn, TxnOffsetCommit, EndTxn) are mapped per transactional
//     ID (txnRemaps, txn_remap.go). The first that carries an ID of another
//     generation is refused as abortable: a transaction begun before the
//     switch was aborted by it (Mirror.Drain fences what is still open) or
//     was never on this cluster, and nothing tells whether the client is in
//     one. From then on that (ID, epoch) stands for an ID and epoch Ferry
//     initialises for the transactional ID on the active cluster (which
//     fences and aborts anything it still had open there): every later
//     request carrying it is forwarded under them, and each partition's
//     sequences are rebased to start at 0 (the broker wants 0 from a new
//     epoch of an ID it holds state for, as after a failback). Clients that
//     learn the new ID (Java and franz-go through EndTxn v5+, librdkafka and
//     Java's KIP-360 bump through InitProducerId) never send the old one
//     again; kafkajs (EndTxn v1, InitProducerId once at connect) sends it
//     for good and is carried on the mapping. Per request:
//   - Produce: UNKNOWN_PRODUCER_ID with log start offset -2 (produceError)
//     unless a transaction was begun under the mapping: -2 is below any
//     offset the Java producer acknowledged, so it neither retries the batch
//     forever (-1: "unknown, retry") nor resets its sequences and retries
//     under the same ID (an offset above the last acknowledged one).
//   - AddPartitionsToTxn: the first is refused UNKNOWN_PRODUCER_ID
//     (abortable in Java, franz-go and kafkajs); later ones begin a
//     transaction under the mapping, unless the client has yet to abort
//     the transaction it held across the switch.
//   - AddOffsetsToTxn: the same, but the first is answered without error
//     and not sent (Kafka Streams takes any error there as fatal to its
//     thread); the TxnOffsetCommit after it refuses.
//   - TxnOffsetCommit outside a transaction begun under the mapping:
//     UNKNOWN_MEMBER_ID (offsetsRefused): abortable in every client, a
//     task migration for Kafka Streams; its transaction cannot commit.
//   - EndTxn(commit) outside such a transaction: UNKNOWN_PRODUCER_ID;
//     INVALID_PRODUCER_EPOCH to a Kafka Streams producer, a task migration
//     there where the other ends its thread (txnReply). (kafkajs
//     does not recover from any EndTxn error: a commit held across the
//     switch, whose transaction the switch aborted, ends that producer.)
//   - EndTxn(abort) outside such a transaction: answered success, nothing
//     sent (the transaction is not on the active cluster); v5+ carries the
//     mapping's ID, which KIP-890 clients take.
//   - An older ID or epoch than the mapping's, or any once the transactional
//     ID was initialised under this generation: INVALID_PRODUCER_EPOCH
//     (fenced), never mapped.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/protocol/kfields"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// reasonOtherGeneration counts requests carrying a producer ID of another
// generation, answered by Ferry or re-initialised (ferry_refusals_total).
const reasonOtherGeneration = "other_generation"

// defaultTxnTimeout is Kafka's transaction.timeout.ms default, for a fresh
// init of a transactional ID whose own InitProducerId Ferry did not see.
const defaultTxnTimeout = 60000

// staleProducerID reports whether any producer ID in the decoded request was
// issued under another generation than gen.
func staleProducerID(gen uint32, kr kmsg.Request) bool {
	stale := false
	kfields.Visit(kr, &kfields.Visitor{ProducerID: func(pid *int64) {
		if _, ok := routing.PhysicalPID(gen, *pid); !ok {
			stale = true
		}
	}})
	return stale
}

// otherGeneration answers a coordinator request that carries a producer ID
// of another generation, or rewrites it (rewritten) so that it can be
// forwarded: InitProducerId as a fresh init, a transactional request onto
// its mapping (txnRemaps, mapped). r is nil when the request goes on.
func (s *Server) otherGeneration(c *clientConn, req *request, kr kmsg.Request) (r *reply, rewritten bool, mapped *mappedTxn) {
	gen := req.state.Generation
	if ip, ok := kr.(*kmsg.InitProducerIDRequest); ok && ip.TransactionalID != nil {
		s.noteTxnTimeout(*ip.TransactionalID, ip.TransactionTimeoutMillis)
		if gen != 0 && !s.ownTxn(gen, *ip.TransactionalID) {
			// Unrecorded, the fence of the IDs of earlier generations
			// would be lost: retried (Java, franz-go, librdkafka).
			s.metrics.refused(req.hdr.Key, reasonTxnMappingsFull)
			return localReply(req, errorResponse(kr, kerr.CoordinatorLoadInProgress.Code, txnMappingsFullMsg)), false, nil
		}
	}
	if !staleProducerID(gen, kr) {
		if q, ok := staleQuery(gen, req.hdr.Version, kr); ok && gen != 0 {
			// A producer of this generation goes on: its fence of the
			// IDs of earlier ones must not be dropped as idle.
			s.txns.touch(gen, q.TxnID)
		}
		return nil, false, nil
	}
	s.metrics.refused(req.hdr.Key, reasonOtherGeneration)
	if ip, ok := kr.(*kmsg.InitProducerIDRequest); ok {
		ip.ProducerID, ip.ProducerEpoch = -1, -1
		return nil, true, nil
	}
	return s.staleTxn(c, req, kr)
}

// remappedPIDs holds, under the current generation, the producer ID Ferry
// allocated on the active cluster for each idempotent producer still
// writing with an ID of another generation. A broker accepts any first
// sequence from an ID it holds no state for. In a fleet one member
// allocates it, the member the client's ID hashes to, and the others ask
// it (txn_fleet.go): a partition's batches move to another member when
// its leader member dies, and a batch retried there must go under the
// same ID for the broker to know it for a retry. Bounded to the most
// recently used maxRemapped: an entry dropped (counted in evicted) is
// allocated again, and only a batch retried across that could then be
// written twice, so the producers still writing keep theirs.
type remappedPIDs struct {
	mu  sync.Mutex
	gen uint32
	m   *simplelru.LRU[int64, *remapped]
	// gaps outlive a generation: a batch refused under one is sent
	// again under the next, and the batches behind it still wait.
	gaps *simplelru.LRU[gapKey, gap]
	// firsts: per partition, the batch the broker met first under the
	// ID allocated in this generation.
	firsts *simplelru.LRU[gapKey, first]
	// conts: per partition, whether a producer's first batches under
	// gen continue where it stopped on the cluster taken over from, and
	// olds what that cluster holds of a partition's producers
	// (producer_continue.go).
	conts *simplelru.LRU[gapKey, continuation]
	olds  *simplelru.LRU[string, *topicProducers]
	// oldsDown: a read of the cluster taken over from failed under gen,
	// at oldsDownAt.
	oldsDown   error
	oldsDownAt time.Time
	// prev is the IDs allocated under prevGen, the generation before
	// gen here: where a producer's first batches of gen look for its
	// last sequence.
	prevGen uint32
	prev    *simplelru.LRU[int64, *remapped]
	evicted prometheus.Counter
	// anyGaps: gaps holds any; read without the lock on the produce
	// path of every idempotent producer.
	anyGaps atomic.Bool
}

// A first is the batch that sets an allocated ID's sequence in a
// partition: the broker takes whatever first sequence it gets from an ID
// it holds no state for. Until that batch is answered the partition's
// later batches are refused NOT_LEADER_OR_FOLLOWER, which every client
// retries with the same sequence (OUT_OF_ORDER_SEQUENCE_NUMBER would make
// the Java producer bump its epoch once the first is acknowledged). Sent
// behind it on the same connection they would reach the broker before
// its answer, and had it failed (the broker refused it, or its connection
// broke), the next one would set the sequence and the failed one be
// written after it, under the client's next epoch.
type first struct {
	phys  int64
	epoch int16
	seq   int32
	done  bool      // answered success: the broker orders what follows
	at    time.Time // sent; a first never answered stops blocking after firstAnswerWait
}

// firstAnswerWait bounds how long a first batch nobody answered (its
// client left with it in flight) blocks its partition's later batches.
// A client that reconnects sends that batch again first, which clears it.
const firstAnswerWait = 30 * time.Second

// A gap is a batch of an idempotent producer of another generation that
// was answered with an error — refused by Ferry unwritten (no physical ID
// could be had, held by a switch too long, the write lease lapsed, the
// leader unreachable) or by the broker — kept until the client sends that
// batch again; or one of a producer of this generation refused by Ferry
// unwritten (nativeGaps: its first batch to a partition would be exposed
// the same way). The first batch the broker
// gets under a freshly allocated ID sets that ID's sequence, whatever it
// is; were a later batch, already in flight behind the refused one,
// written first, the refused one would only ever meet
// OUT_OF_ORDER_SEQUENCE_NUMBER, and be written out of order under the
// next generation's ID. Later batches of the partition are refused as a
// broker refuses a batch after a missing one (blocks), which every client
// retries behind the batch it resends. The gaps are this member's: a
// batch refused here whose successor goes to another member (its
// partition moved between members in between) is not waited for there.
type gapKey struct {
	virt int64
	// The partition as the client names it (by name, or by ID from v13).
	topic     string
	topicID   [16]byte
	partition int32
}

type gap struct {
	epoch int16
	seq   int32
	// later is what the partition's later batches are answered:
	// OUT_OF_ORDER_SEQUENCE_NUMBER, as a broker answers a batch after a
	// missing one, once the refused batch's own answer is on its way; or
	// NOT_LEADER_OR_FOLLOWER while it may not be (unansweredProduce: its
	// answer waits for the leader to move, and a later batch sent on
	// another connection is answered first). librdkafka takes
	// OUT_OF_ORDER_SEQUENCE_NUMBER with no earlier batch failed for a
	// lost sequence and bumps its epoch, and the refused batch, sent
	// again under the new epoch, is written a second time if it had
	// been written.
	later int16
}

// gapPart is a gapKey's partition.
type gapPart struct {
	topic     string
	topicID   [16]byte
	partition int32
}

func (k gapKey) part() gapPart { return gapPart{k.topic, k.topicID, k.partition} }

// remapBatch is a batch written under an ID allocated for its producer.
type remapBatch struct {
	key   gapKey
	phys  int64
	epoch int16
	seq   int32
}

// refuseUnwritten notes as refused unwritten, under gen, every batch of an
// idempotent producer in the partitions of req's Produce in that refused
// names (by topic index and partition): the request, or those partitions
// of it, were answered without being sent, or refused after (a forced
// switch). A producer of this generation too: for an ID the broker holds
// no state for in the partition (its first batch there), the broker would
// take the next batch as the first. The gap is the producer's as the
// client names it, for the client's next batches to meet it: req, when
// the batches were sent, maps back the physical IDs written over the
// client's (req.clientPID); nil when they still carry the client's own
// (refused before being sent: that request may have rewritten other
// partitions, and its mapping would take a stale ID of generation 0 for
// a physical one).
func (r *remappedPIDs) refuseUnwritten(gen uint32, req *request, in *kmsg.ProduceRequest, later int16, refused func(ti int, partition int32) bool) {
	if in.TransactionID != nil || in.Acks == 0 {
		return
	}
	for ti := range in.Topics {
		t := &in.Topics[ti]
		for _, p := range t.Partitions {
			if !refused(ti, p.Partition) {
				continue
			}
			protocol.WalkBatches(p.Records, func(b protocol.Batch) error {
				pid := b.ProducerID()
				if pid < 0 || b.IsTransactional() {
					return nil
				}
				virt := pid
				if req != nil {
					virt = req.clientPID(t.Topic, t.TopicID, p.Partition, pid)
				}
				r.refusedAs(gen, gapKey{virt: virt, topic: t.Topic, topicID: t.TopicID, partition: p.Partition}, b.ProducerEpoch(), b.BaseSequence(), later)
				return nil
			})
		}
	}
}

// reset moves r to gen when it is newer: the IDs allocated under an
// earlier one are dropped (those of the one before kept as prev), the
// gaps kept. It reports whether r serves gen
// (false for an older one: a request decoded before a switch must not
// throw away the mappings of the generation after it). r.mu is held.
func (r *remappedPIDs) reset(gen uint32) bool {
	if r.gaps == nil {
		r.gaps, _ = simplelru.NewLRU[gapKey, gap](maxRemapped, nil)
	}
	if r.m == nil || gen > r.gen {
		if r.m != nil {
			r.prevGen, r.prev = r.gen, r.m
		}
		r.gen = gen
		r.m, _ = simplelru.NewLRU[int64, *remapped](maxRemapped, nil)
		r.firsts, _ = simplelru.NewLRU[gapKey, first](maxRemapped, nil)
		r.conts, _ = simplelru.NewLRU[gapKey, continuation](maxRemapped, nil)
		r.olds, _ = simplelru.NewLRU[string, *topicProducers](maxRemapped, nil)
		r.oldsDown = nil
	}
	return gen == r.gen
}

// refused notes that a batch (epoch, seq) of k.virt to k's partition was
// refused unwritten under gen.
func (r *remappedPIDs) refused(gen uint32, k gapKey, epoch int16, seq int32) {
	r.refusedAs(gen, k, epoch, seq, kerr.OutOfOrderSequenceNumber.Code)
}

// refusedAs is refused, the partition's later batches answered later.
func (r *remappedPIDs) refusedAs(gen uint32, k gapKey, epoch int16, seq int32, later int16) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reset(gen)
	if g, ok := r.gaps.Peek(k); ok && g.epoch == epoch && g.seq <= seq {
		return // an earlier batch is still missing
	}
	if r.gaps.Add(k, gap{epoch, seq, later}) && r.evicted != nil {
		r.evicted.Inc()
	}
	r.anyGaps.Store(true)
}

// blocks returns, when a batch (epoch, seq) of k.virt to k's partition
// comes after one refused unwritten under gen and not sent again since,
// the code it is refused with (gap.later); 0 otherwise. A batch at or
// before the refused one clears it: the client is resending.
func (r *remappedPIDs) blocks(gen uint32, k gapKey, epoch int16, seq int32) int16 {
	if !r.anyGaps.Load() {
		return 0 // the common case, without the lock
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reset(gen)
	g, ok := r.gaps.Peek(k)
	if !ok {
		return 0
	}
	if g.epoch != epoch || seq <= g.seq {
		// Another epoch starts its sequences afresh.
		r.gaps.Remove(k)
		if r.gaps.Len() == 0 {
			r.anyGaps.Store(false)
		}
		return 0
	}
	return g.later
}

// nativeGaps answers the gap's code (gap.later) for a partition's
// records when a batch of an idempotent producer of gen in them comes
// after one of its batches refused unwritten (refuseUnwritten); 0
// otherwise. Producers of other generations are checked as their IDs are
// mapped (physicalProducerIDs). Nothing is walked while no gap is noted
// (blocks checks that too, for each batch).
func (r *remappedPIDs) nativeGaps(gen uint32, t *kmsg.ProduceRequestTopic, partition int32, records []byte) int16 {
	if !r.anyGaps.Load() {
		return 0
	}
	var code int16
	protocol.WalkBatches(records, func(b protocol.Batch) error {
		pid := b.ProducerID()
		if pid < 0 || b.IsTransactional() {
			return nil
		}
		if _, ok := routing.PhysicalPID(gen, pid); gen != 0 && !ok {
			return nil // of another generation: checked as mapped
		}
		if code = r.blocks(gen, gapKey{virt: pid, topic: t.Topic, topicID: t.TopicID, partition: partition}, b.ProducerEpoch(), b.BaseSequence()); code != 0 {
			return errStop
		}
		return nil
	})
	return code
}

// claim reports whether a batch (epoch, seq) of k.virt may go to the
// broker under phys, allocated under gen: not while the partition's first
// batch under phys is unanswered and this one comes after it. The first
// batch met becomes the partition's first.
func (r *remappedPIDs) claim(gen uint32, k gapKey, phys int64, epoch int16, seq int32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.reset(gen) {
		return false
	}
	f, ok := r.firsts.Peek(k)
	switch {
	case !ok || f.phys != phys || f.epoch != epoch || time.Since(f.at) > firstAnswerWait:
	case f.done:
		return true // the broker orders what follows
	case seq > f.seq:
		return false
	}
	if r.firsts.Add(k, first{phys: phys, epoch: epoch, seq: seq, at: time.Now()}) && r.evicted != nil {
		r.evicted.Inc()
	}
	return true
}

// answered notes the broker's answer to a batch written under an
// allocated ID: an error leaves a gap its successors wait behind, success
// makes it the partition's first if it was the one awaited.
func (r *remappedPIDs) answered(gen uint32, b remapBatch, failed bool) {
	if failed {
		r.refused(gen, b.key, b.epoch, b.seq)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.reset(gen) {
		return
	}
	f, ok := r.firsts.Peek(b.key)
	if !ok || f.phys != b.phys || f.epoch != b.epoch || f.done || f.seq != b.seq {
		return
	}
	if failed {
		r.firsts.Remove(b.key)
		return
	}
	f.done = true
	r.firsts.Add(b.key, f)
}

type remapped struct {
	ready chan struct{}
	phys  int64
	err   error
}

const maxRemapped = 1 << 16

// physicalBy returns the physical producer ID standing for virt, another
// generation's ID, under gen: got by alloc once (concurrent callers wait
// for the same allocation), again after a failure.
func (r *remappedPIDs) physicalBy(ctx context.Context, gen uint32, virt int64, alloc func(context.Context) (int64, error)) (int64, error) {
	r.mu.Lock()
	if !r.reset(gen) {
		r.mu.Unlock()
		return -1, fmt.Errorf("%w (%d, asked under %d)", errOtherGeneration, r.gen, gen)
	}
	e, _ := r.m.Get(virt)
	if e != nil {
		r.mu.Unlock()
		select {
		case <-e.ready:
			return e.phys, e.err
		case <-ctx.Done():
			return -1, ctx.Err()
		}
	}
	e = &remapped{ready: make(chan struct{})}
	if r.m.Add(virt, e) && r.evicted != nil {
		r.evicted.Inc()
	}
	r.mu.Unlock()

	e.phys, e.err = alloc(ctx)
	close(e.ready)
	if e.err != nil {
		r.mu.Lock()
		if cur, _ := r.m.Peek(virt); cur == e {
			r.m.Remove(virt)
		}
		r.mu.Unlock()
	}
	return e.phys, e.err
}

// held is the physical ID virt writes under in gen, if allocated and
// ready here; -1 otherwise. It never waits for an allocation.
func (r *remappedPIDs) held(gen uint32, virt int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || r.gen != gen {
		return -1
	}
	phys, _ := readyIn(r.m, virt)
	return phys
}

// readyIn is the physical ID m holds for virt, allocated and ready; ok is
// false (and the ID -1) otherwise.
func readyIn(m *simplelru.LRU[int64, *remapped], virt int64) (phys int64, ok bool) {
	e, found := m.Peek(virt)
	if !found {
		return -1, false
	}
	select {
	case <-e.ready:
		if e.err == nil {
			return e.phys, true
		}
	default:
	}
	return -1, false
}

// allocatePID asks the cluster for an idempotent producer ID.
func allocatePID(ctx context.Context, u *upstream.Cluster) (int64, error) {
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.TransactionTimeoutMillis = math.MaxInt32
	resp, err := ip.RequestWith(ctx, u.Client)
	if err != nil {
		return -1, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return -1, err
	}
	if resp.ProducerID < 0 {
		return -1, errors.New("InitProducerId answered no producer ID")
	}
	return resp.ProducerID, nil
}
