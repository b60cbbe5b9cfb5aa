package proxy

// Transactions a switch fences. A planned switch's drain (Mirror.Drain)
// aborts a transaction still open on the old cluster by fencing its
// transactional ID there: the coordinator bumps the epoch. Two things
// follow for the proxy:
//
//   - Only transactions Ferry carries may be fenced: a producer writing to
//     the cluster beside Ferry is none of its business. Every member notes
//     the transactional IDs its clients name (carriedTxns), and the drain
//     asks the members which of the open transactions they carry
//     (SwitchFencing).
//   - The switch can still roll back after the fence (its time runs out
//     waiting for the write leases, or for a drain): the held requests then
//     go to the old cluster under the epoch it fenced, and the broker's
//     INVALID_PRODUCER_EPOCH and PRODUCER_FENCED are fatal to the producer.
//     So every member also remembers which (transactional ID, producer ID,
//     epoch) the drain is about to fence (switchFences), and answers a
//     request still carrying them, under the same generation, as it does a
//     producer ID of an earlier generation (producer_ids.go): Produce,
//     AddPartitionsToTxn and EndTxn(commit) get UNKNOWN_PRODUCER_ID, which
//     Java, franz-go and kafkajs abort on and recover from (a Kafka Streams
//     producer's commit gets INVALID_PRODUCER_EPOCH, its task migration:
//     txnReply, streamsProducer); AddOffsetsToTxn
//     succeeds without being sent and the TxnOffsetCommit after it is
//     refused UNKNOWN_MEMBER_ID (offsetsRefused: abortable everywhere, a
//     task migration for Kafka Streams); EndTxn(abort) succeeds without
//     being sent (the fence aborted it); and the producer's InitProducerId with
//     that ID and epoch (a KIP-360 bump, franz-go's reload) is sent as a
//     fresh init, which the broker answers with the next epoch rather than
//     PRODUCER_FENCED. Any other InitProducerId of the transactional ID
//     (another producer took it) forgets the fence, so a zombie stays
//     fenced.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
)

// reasonSwitchFenced counts requests of a producer a switch's drain fenced,
// answered by Ferry or sent as a fresh init (ferry_refusals_total).
const reasonSwitchFenced = "switch_fenced"

// SwitchFenceCallKind is the kind of the calls HandleSwitchFencing answers.
const SwitchFenceCallKind = "proxy.switch_fence"

// SwitchFence is a transaction a switch's drain is about to fence: its
// transactional ID and the physical producer ID and epoch it holds.
type SwitchFence struct {
	TxnID      string `json:"txn_id"`
	ProducerID int64  `json:"producer_id"`
	Epoch      int16  `json:"epoch"`
}

// carriedFor is how long a transactional ID counts as carried after a
// client last named it: a transaction open now began within its timeout,
// at most Kafka's transaction.max.timeout.ms default (15 min).
const carriedFor = 16 * time.Minute

// maxCarried bounds both sets: past it the least recently noted entry goes
// (a carried ID forgotten is not fenced, and the drain waits for it and
// rolls back; a fence forgotten is PRODUCER_FENCED after a rollback, as
// before).
const maxCarried = 1 << 16

// newCarriedLRU is a set of at most maxCarried transactional IDs; NewLRU
// fails only for a size below 1.
func newCarriedLRU[V any]() *simplelru.LRU[string, V] {
	m, _ := simplelru.NewLRU[string, V](maxCarried, nil)
	return m
}

// carriedTxns is when each transactional ID was last named by a client.
type carriedTxns struct {
	mu sync.Mutex
	m  *simplelru.LRU[string, time.Time]
}

func (c *carriedTxns) note(id string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = newCarriedLRU[time.Time]()
	}
	c.m.Add(id, now)
}

func (c *carriedTxns) carries(id string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		return false
	}
	t, ok := c.m.Peek(id)
	return ok && now.Sub(t) < carriedFor
}

// switchFences are the fences the drain announced, by transactional ID.
type switchFences struct {
	n  atomic.Int32 // m.Len(): read on every transactional produce
	mu sync.Mutex
	m  *simplelru.LRU[string, switchFence]
}

type switchFence struct {
	gen   uint32
	pid   int64 // physical
	epoch int16
}

func (f *switchFences) add(gen uint32, fs []SwitchFence) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = newCarriedLRU[switchFence]()
	}
	for _, x := range fs {
		f.m.Add(x.TxnID, switchFence{gen: gen, pid: x.ProducerID, epoch: x.Epoch})
	}
	f.n.Store(int32(f.m.Len()))
}

// of is the fence the drain announced for txnID under gen, if any.
func (f *switchFences) of(gen uint32, txnID string) (switchFence, bool) {
	if f.n.Load() == 0 {
		return switchFence{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	x, ok := f.m.Peek(txnID)
	return x, ok && x.gen == gen
}

// fenced reports whether the drain fenced txnID at the physical pid and
// epoch under gen.
func (f *switchFences) fenced(gen uint32, txnID string, pid int64, epoch int16) bool {
	x, ok := f.of(gen, txnID)
	return ok && x.pid == pid && x.epoch == epoch
}

// forget drops txnID's fence: another producer initialised it.
func (f *switchFences) forget(txnID string) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m.Remove(txnID)
	f.n.Store(int32(f.m.Len()))
}

// SwitchFencing is told by a switch's drain which transactions it is about
// to fence (txns, open on the active cluster of the generation in force)
// and returns the transactional IDs among them that this member's clients
// named lately.
func (s *Server) SwitchFencing(txns []SwitchFence) []string {
	now := time.Now()
	s.switchFences.add(s.routes.Current().Generation, txns)
	var out []string
	for _, t := range txns {
		if s.carried.carries(t.TxnID, now) {
			out = append(out, t.TxnID)
		}
	}
	return out
}

// HandleSwitchFencing answers another member's SwitchFencing call: body
// and answer are JSON ([]SwitchFence, []string).
func (s *Server) HandleSwitchFencing(_ context.Context, _ int32, body []byte) ([]byte, error) {
	var txns []SwitchFence
	if err := json.Unmarshal(body, &txns); err != nil {
		return nil, fmt.Errorf("decoding the transactions a switch fences: %w", err)
	}
	return json.Marshal(s.SwitchFencing(txns))
}

// noteTxn records that a client named txnID.
func (s *Server) noteTxn(txnID string) {
	s.carried.note(txnID, time.Now())
}

// switchFencedCoordinator answers, or rewrites (rewritten), a transactional
// coordinator request kr (physical IDs already) of a producer the drain
// fenced; nil when it goes on as it is.
func (s *Server) switchFencedCoordinator(req *request, kr kmsg.Request) (r *reply, rewritten bool) {
	gen := req.state.Generation
	if ip, ok := kr.(*kmsg.InitProducerIDRequest); ok {
		if ip.TransactionalID == nil {
			return nil, false
		}
		if !s.switchFences.fenced(gen, *ip.TransactionalID, ip.ProducerID, ip.ProducerEpoch) {
			// A fresh init or another producer's: a zombie of the
			// fenced one must stay fenced.
			s.switchFences.forget(*ip.TransactionalID)
			return nil, false
		}
		s.metrics.refused(req.hdr.Key, reasonSwitchFenced)
		// The broker answers the fenced epoch PRODUCER_FENCED; a fresh
		// init bumps it once more and hands it to this producer. The
		// fence is kept: the init may be answered CONCURRENT_TRANSACTIONS
		// (markers still being written) and sent again, and once it
		// succeeds the producer holds another epoch.
		ip.ProducerID, ip.ProducerEpoch = -1, -1
		return nil, true
	}
	q, ok := staleQuery(gen, req.hdr.Version, kr)
	if !ok || !s.switchFences.fenced(gen, q.TxnID, q.PID, q.Epoch) {
		return nil, false
	}
	s.metrics.refused(req.hdr.Key, reasonSwitchFenced)
	d := txnDecision{Verdict: txnRefuse, Code: kerr.UnknownProducerID.Code, Message: switchFencedMsg, Phys: -1}
	switch kmsg.Key(q.API) {
	case kmsg.AddOffsetsToTxn:
		d = txnDecision{Verdict: txnSuccess, Phys: -1}
	case kmsg.TxnOffsetCommit:
		d.Code, d.Message = offsetsRefused, offsetsRefusedMsg
	case kmsg.EndTxn:
		if !q.Commit {
			d = txnDecision{Verdict: txnSuccess, Phys: -1}
		}
	}
	return s.txnReply(req, kr, d), false
}

const switchFencedMsg = "ferry: a switch that rolled back aborted this transaction; abort it and go on"

// switchFencedProduce is the error code for a transactional produce's
// records under fence, the drain's fence of the request's transactional ID
// (switchFences.of, looked up once per request): 0 unless a batch is of
// the producer ID and epoch it fenced.
func (s *Server) switchFencedProduce(gen uint32, fence switchFence, records []byte) int16 {
	var code int16
	protocol.WalkBatches(records, func(b protocol.Batch) error {
		pid := b.ProducerID()
		if pid < 0 {
			return nil
		}
		phys, ok := routing.PhysicalPID(gen, pid)
		if ok && phys == fence.pid && b.ProducerEpoch() == fence.epoch {
			s.metrics.refused(int16(kmsg.Produce), reasonSwitchFenced)
			code = kerr.UnknownProducerID.Code
			return errStop
		}
		return nil
	})
	return code
}
