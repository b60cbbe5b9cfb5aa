package proxy

// An idempotent producer's first batch in a partition goes to the broker
// alone.
//
// A Kafka broker before 4.5 takes any sequence as the first of a producer
// it holds no state for in a partition, even one whose log never held a
// record (KAFKA-15591). When a producer's first batch there is refused
// unwritten — NOT_LEADER_OR_FOLLOWER from a broker that has not yet taken
// the leadership the cluster's metadata already gives it, NOT_ENOUGH_REPLICAS
// while the ISR is short — and a later batch, sent behind it on the same
// connection, reaches the broker after that refusal, the later one is
// written as the producer's first. The refused batch then only ever meets
// OUT_OF_ORDER_SEQUENCE_NUMBER; librdkafka, seeing a later batch
// acknowledged, counts the earlier ones as written ("implicitly acked",
// without an offset) and loses them silently. TestBrokerDeathProducers
// found it: three records of a producer started while a broker was dead,
// acknowledged without an offset and never written, the partition's first
// record a later one of the same producer. Ferry makes the race likelier
// than a direct connection does: it answers for a dead leader once the
// cluster has moved the partition (dispatch.go, upstreamFailed), and the
// client's retries then arrive together, just as the new leader takes over.
//
// So until this member has seen a batch of a producer written in a
// partition, one batch at a time goes to the broker: a later one waits for
// the first's answer (nativeFirstWait at most) and goes on if it was
// written; if it was not, the later one is refused NOT_LEADER_OR_FOLLOWER,
// unwritten, and so is every later one until the client sends the first
// again (a gap, producer_ids.go). The wait is a round trip, once per
// producer and partition (the most recent maxRemapped are remembered), at a
// producer's start; it holds the client connection's later requests too,
// as they are read in order. Transactional batches are not held: the
// broker checks a transactional producer's partitions itself (KIP-890).

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
)

// nativeFirstWait bounds how long a batch waits for its producer's first
// batch in the partition to be answered. Past it the batch is refused
// NOT_LEADER_OR_FOLLOWER (the client retries it), and a first never
// answered (its client left with it in flight) stops holding the
// partition's later batches.
const nativeFirstWait = 5 * time.Second

// nativeFirsts is, per producer and partition (as the client names them),
// the first batch this member sent to the broker, and whether it was
// written.
type nativeFirsts struct {
	mu sync.Mutex
	m  *simplelru.LRU[gapKey, *nativeFirst]
}

type nativeFirst struct {
	epoch int16
	seq   int32
	at    time.Time
	once  sync.Once
	done  chan struct{} // closed once answered
	ok    bool          // written (set before done closes)
}

// firstRef is a first batch a Produce carries: its partition (the topic by
// index in the request) and what waits on its answer.
type firstRef struct {
	ti        int
	partition int32
	key       gapKey
	f         *nativeFirst
}

func (f *nativeFirst) answered() (done, ok bool) {
	select {
	case <-f.done:
		return true, f.ok
	default:
		return false, false
	}
}

// alone returns 0 when a partition's records may go to the broker, or the
// code they are refused with (NOT_LEADER_OR_FOLLOWER): their producer's
// first batch in the partition was not written, or was not answered within
// nativeFirstWait. A batch that is its producer's first here is noted in
// req.firsts; settleFirsts records its answer. Called for acknowledged,
// non-transactional Produces only.
func (s *Server) alone(ctx context.Context, req *request, ti int, t *kmsg.ProduceRequestTopic, partition int32, records []byte) int16 {
	gen := req.state.Generation
	var b protocol.Batch
	protocol.WalkBatches(records, func(x protocol.Batch) error {
		if x.ProducerID() >= 0 && !x.IsTransactional() {
			b = x
		}
		return errStop // a partition's batches are appended together: the first stands for them
	})
	if b == nil {
		return 0
	}
	pid, epoch, seq := b.ProducerID(), b.ProducerEpoch(), b.BaseSequence()
	if _, ok := routing.PhysicalPID(gen, pid); gen != 0 && !ok {
		return 0 // of another generation: its own first (remappedPIDs.claim)
	}
	k := gapKey{virt: pid, topic: t.Topic, topicID: t.TopicID, partition: partition}
	nf := &s.nativeFirsts
	nf.mu.Lock()
	if nf.m == nil {
		nf.m, _ = simplelru.NewLRU[gapKey, *nativeFirst](maxRemapped, nil)
	}
	f, known := nf.m.Get(k)
	var done, ok bool
	if known {
		done, ok = f.answered()
	}
	switch {
	case known && done && ok:
		nf.mu.Unlock()
		return 0 // the broker holds the producer's state: it orders the rest
	case known && done && !ok && epoch == f.epoch && seq > f.seq:
		// Behind a first that was not written: refused, as the gap its
		// answer left refuses it (nativeGaps may have looked before).
		nf.mu.Unlock()
		return kerr.NotLeaderForPartition.Code
	case known && !done && epoch == f.epoch && seq > f.seq && time.Since(f.at) < nativeFirstWait:
		nf.mu.Unlock()
	default:
		// The first here, or the first again (resent, or a new epoch's),
		// or after one never answered.
		f = &nativeFirst{epoch: epoch, seq: seq, at: time.Now(), done: make(chan struct{})}
		nf.m.Add(k, f)
		nf.mu.Unlock()
		req.firsts = append(req.firsts, firstRef{ti: ti, partition: partition, key: k, f: f})
		return 0
	}
	wait := time.NewTimer(nativeFirstWait - time.Since(f.at))
	defer wait.Stop()
	select {
	case <-f.done:
		if f.ok {
			return 0
		}
	case <-wait.C:
	case <-ctx.Done():
	}
	return kerr.NotLeaderForPartition.Code
}

// settleFirsts records the answers to the first batches req carried:
// written when written(ti, partition) says so. One not written leaves a
// gap (producer_ids.go): the partition's later batches are refused
// NOT_LEADER_OR_FOLLOWER until the client sends it again. Only the first
// call for a batch counts; written nil settles every one as not written
// (an answer that failed, or was never written to the client).
func (s *Server) settleFirsts(req *request, written func(ti int, partition int32) bool) {
	for _, r := range req.firsts {
		ok := written != nil && written(r.ti, r.partition)
		r.f.once.Do(func() {
			if !ok {
				// Before the first is seen answered: a later batch
				// that looks then meets the gap.
				s.remapped.refusedAs(req.state.Generation, r.key, r.f.epoch, r.f.seq, kerr.NotLeaderForPartition.Code)
			}
			r.f.ok = ok
			close(r.f.done)
		})
	}
}
