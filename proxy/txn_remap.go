package proxy

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/routing"
)

// txnRemaps holds, under the current generation, per transactional ID, the
// producer ID and epoch Ferry initialised on the active cluster for a
// transactional client still writing with an ID of another generation
// (producer_ids.go says why and what each request gets). Per member: a
// transactional ID's coordinator requests and its partitions' produce
// requests all reach this member while the fleet is one member. Bounded: a
// mapping dropped is made again, at the cost of one more abortable error.
type txnRemaps struct {
	mu  sync.Mutex
	gen uint32
	m   map[string]*txnRemap
}

type txnRemap struct {
	// virt and epoch are the client's producer ID (of another
	// generation) and epoch the mapping stands for.
	virt  int64
	epoch int16
	// owned: a client initialised the transactional ID under this
	// generation; every ID of another generation naming it is fenced.
	owned bool

	// phys and physEpoch, once inited: what Ferry's InitProducerId of the
	// transactional ID got on the active cluster. initing is closed when
	// the init in flight ends.
	inited    bool
	phys      int64
	physEpoch int16
	initing   chan struct{}

	// open: partitions or offsets were added under the mapping and the
	// transaction has not ended. dead: the client still has to abort the
	// transaction it began before the mapping (only while not open).
	open, dead bool
	// seqBase is, per partition, the client's first sequence under the
	// mapping: it is sent as 0, the sequence a broker wants from a new
	// epoch of a producer ID it holds state for.
	seqBase map[string]int32
}

const maxTxnRemaps = 1 << 16

// txnInitTimeout bounds Ferry's InitProducerId of a transactional ID: the
// coordinator answers CONCURRENT_TRANSACTIONS while it aborts what the init
// fenced.
const txnInitTimeout = 10 * time.Second

type remapVerdict uint8

const (
	remapNew    remapVerdict = iota // not mapped before: refused as abortable
	remapFound                      // the mapping of this ID and epoch
	remapFenced                     // older than the mapping's, or the ID is owned
)

var errRemapGone = errors.New("the mapping was replaced")

func (r *txnRemaps) resetLocked(gen uint32) {
	if r.m == nil || r.gen != gen {
		r.gen, r.m = gen, map[string]*txnRemap{}
	}
}

func (r *txnRemaps) putLocked(txnID string, e *txnRemap) {
	if _, ok := r.m[txnID]; !ok && len(r.m) >= maxTxnRemaps {
		for k := range r.m {
			delete(r.m, k)
			break
		}
	}
	r.m[txnID] = e
}

// own records that a client initialised txnID under gen.
func (r *txnRemaps) own(gen uint32, txnID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetLocked(gen)
	r.putLocked(txnID, &txnRemap{owned: true})
}

// lookup finds the mapping of the client's ID and epoch for txnID under
// gen, making it when there is none (or the client's is newer: another
// producer of the transactional ID), and calls fn with it under the lock.
func (r *txnRemaps) lookup(gen uint32, txnID string, virt int64, epoch int16, fn func(*txnRemap, remapVerdict)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetLocked(gen)
	e := r.m[txnID]
	v := remapFound
	switch {
	case e == nil:
		v = remapNew
	case e.owned:
		v = remapFenced
	case virt == e.virt && epoch == e.epoch:
	case virt < e.virt || virt == e.virt && epoch < e.epoch:
		// Virtual IDs order by generation, then by allocation.
		v = remapFenced
	default:
		v = remapNew
	}
	if v == remapNew {
		e = &txnRemap{virt: virt, epoch: epoch, seqBase: map[string]int32{}}
		r.putLocked(txnID, e)
	}
	fn(e, v)
}

// resolve returns e's physical ID and epoch, initialising txnID on u the
// first time (concurrent callers wait for the same init; a failed one is
// tried again by the next caller).
func (r *txnRemaps) resolve(ctx context.Context, u *upstream, txnID string, e *txnRemap, timeout int32) (int64, int16, error) {
	for {
		r.mu.Lock()
		if r.m[txnID] != e {
			r.mu.Unlock()
			return -1, -1, errRemapGone
		}
		if e.inited {
			defer r.mu.Unlock()
			return e.phys, e.physEpoch, nil
		}
		if ch := e.initing; ch != nil {
			r.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return -1, -1, ctx.Err()
			}
		}
		ch := make(chan struct{})
		e.initing = ch
		r.mu.Unlock()

		phys, epoch, err := initTxnID(ctx, u, txnID, timeout)
		r.mu.Lock()
		e.initing = nil
		if err == nil {
			e.inited, e.phys, e.physEpoch = true, phys, epoch
		}
		r.mu.Unlock()
		close(ch)
		return phys, epoch, err
	}
}

// answered notes what the broker answered to a request forwarded under e:
// a transaction begun or ended, a new ID or epoch (EndTxn v5+).
func (r *txnRemaps) answered(txnID string, e *txnRemap, resp kmsg.Response) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[txnID] != e {
		return
	}
	switch resp := resp.(type) {
	case *kmsg.AddPartitionsToTxnResponse:
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				// All or none: the others are OPERATION_NOT_ATTEMPTED.
				e.open = e.open || p.ErrorCode == 0
			}
		}
	case *kmsg.AddOffsetsToTxnResponse:
		e.open = e.open || resp.ErrorCode == 0
	case *kmsg.EndTxnResponse:
		if resp.ErrorCode == 0 {
			e.open = false
			if resp.ProducerID >= 0 {
				e.phys, e.physEpoch = resp.ProducerID, resp.ProducerEpoch
			}
		}
	}
	if e.open {
		e.dead = false
	}
}

// produce maps one transactional batch's producer ID, epoch and sequence
// for partition part; code is what the partition is answered instead.
func (r *txnRemaps) produce(gen uint32, txnID string, virt int64, epoch int16, part string, seq int32) (phys int64, physEpoch int16, physSeq int32, code int16) {
	r.lookup(gen, txnID, virt, epoch, func(e *txnRemap, v remapVerdict) {
		switch {
		case v == remapFenced:
			code = kerr.InvalidProducerEpoch.Code
		case !e.open || !e.inited:
			// Its partition was added before the mapping: the
			// transaction was begun before the switch.
			e.dead = true
			code = kerr.UnknownProducerID.Code
		default:
			base, ok := e.seqBase[part]
			if !ok {
				base = seq
				e.seqBase[part] = seq
			}
			phys, physEpoch, physSeq = e.phys, e.physEpoch, rebaseSeq(seq, base)
		}
	})
	return phys, physEpoch, physSeq, code
}

// rebaseSeq is seq counted from base, wrapping as sequences do (after
// MaxInt32 comes 0).
func rebaseSeq(seq, base int32) int32 {
	if seq < 0 {
		return seq
	}
	return int32((int64(seq) - int64(base)) & math.MaxInt32)
}

// mappedTxn is a coordinator request going on under a mapping: set writes
// the physical ID and epoch into it once the rest is translated (they are
// physical already), answered sees the broker's answer before it is made
// virtual.
type mappedTxn struct {
	set      func()
	answered func(kmsg.Response)
}

// staleTxn answers, or maps onto txnRemaps, a transactional coordinator
// request carrying a producer ID of another generation.
func (s *Server) staleTxn(c *clientConn, req *request, kr kmsg.Request) (*reply, bool, *mappedTxn) {
	gen := req.state.Generation
	refuse := func(code int16, msg string) *reply {
		resp := errorResponse(kr, code, msg)
		if e, ok := resp.(*kmsg.EndTxnResponse); ok {
			e.ProducerID, e.ProducerEpoch = -1, -1
		}
		return localReply(req, resp)
	}
	const abortMsg = "ferry: the producer ID was issued before the last switch; abort the transaction"
	var (
		txnID string
		pid   int64
		epoch int16
	)
	switch r := kr.(type) {
	case *kmsg.AddPartitionsToTxnRequest:
		if r.Version >= 4 { // brokers' batched form
			return refuse(kerr.UnknownProducerID.Code, abortMsg), false, nil
		}
		txnID, pid, epoch = r.TransactionalID, r.ProducerID, r.ProducerEpoch
	case *kmsg.AddOffsetsToTxnRequest:
		txnID, pid, epoch = r.TransactionalID, r.ProducerID, r.ProducerEpoch
	case *kmsg.TxnOffsetCommitRequest:
		txnID, pid, epoch = r.TransactionalID, r.ProducerID, r.ProducerEpoch
	case *kmsg.EndTxnRequest:
		txnID, pid, epoch = r.TransactionalID, r.ProducerID, r.ProducerEpoch
	default:
		return refuse(kerr.UnknownProducerID.Code, abortMsg), false, nil
	}

	var (
		e       *txnRemap
		verdict remapVerdict
		forward bool // under the mapping
		success bool // answered by Ferry without error, not sent
	)
	s.txns.lookup(gen, txnID, pid, epoch, func(m *txnRemap, v remapVerdict) {
		e, verdict = m, v
		if v == remapFenced {
			return
		}
		switch r := kr.(type) {
		case *kmsg.EndTxnRequest:
			switch {
			case m.open:
				forward = true
			case !r.Commit:
				// Nothing of the transaction it ends is on the
				// active cluster.
				m.dead, success = false, true
			default:
				// Its transaction was begun before the switch,
				// which aborted it.
				m.dead = true
			}
		case *kmsg.AddPartitionsToTxnRequest, *kmsg.AddOffsetsToTxnRequest:
			// The first is refused: a transaction begun before the
			// switch may be going on.
			forward = v == remapFound && !m.dead
		case *kmsg.TxnOffsetCommitRequest:
			// Java fails the producer on an error here; its
			// transaction's EndTxn(commit) is refused instead.
			forward, success = m.open, !m.open
			m.dead = m.dead || !m.open
		}
	})
	timeout := s.txnTimeout(txnID)
	switch {
	case verdict == remapFenced:
		return refuse(kerr.InvalidProducerEpoch.Code, "ferry: a newer producer of this transactional ID fenced this one"), false, nil
	case success:
		end, ok := kr.(*kmsg.EndTxnRequest)
		if !ok || end.Version < 5 {
			resp := errorResponse(kr, 0, "")
			if e, ok := resp.(*kmsg.EndTxnResponse); ok {
				e.ProducerID, e.ProducerEpoch = -1, -1
			}
			return localReply(req, resp), false, nil
		}
		// KIP-890 clients take the ID the answer carries.
		return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
			resp := kmsg.NewPtrEndTxnResponse()
			resp.ProducerID, resp.ProducerEpoch = -1, -1
			ctx, cancel := context.WithTimeout(ctx, txnInitTimeout)
			defer cancel()
			phys, physEpoch, err := s.txns.resolve(ctx, req.up, txnID, e, timeout)
			if err != nil {
				// Every client retries its abort on it.
				resp.ErrorCode = initErrorCode(err)
				return resp, nil, nil
			}
			resp.ProducerID, resp.ProducerEpoch = routing.VirtualPID(gen, phys), physEpoch
			return resp, nil, nil
		}), false, nil
	case !forward:
		return refuse(kerr.UnknownProducerID.Code, abortMsg), false, nil
	}

	ctx, cancel := context.WithTimeout(c.ctx, txnInitTimeout)
	phys, physEpoch, err := s.txns.resolve(ctx, req.up, txnID, e, timeout)
	cancel()
	if err != nil {
		c.log.Debug("no producer ID for a transactional producer of another generation", zap.String("transactional_id", txnID), zap.Error(err))
		return refuse(initErrorCode(err), "ferry: initialising the transactional ID on the active cluster"), false, nil
	}
	set := func() {
		switch r := kr.(type) {
		case *kmsg.AddPartitionsToTxnRequest:
			r.ProducerID, r.ProducerEpoch = phys, physEpoch
		case *kmsg.AddOffsetsToTxnRequest:
			r.ProducerID, r.ProducerEpoch = phys, physEpoch
		case *kmsg.TxnOffsetCommitRequest:
			r.ProducerID, r.ProducerEpoch = phys, physEpoch
		case *kmsg.EndTxnRequest:
			r.ProducerID, r.ProducerEpoch = phys, physEpoch
		}
	}
	return nil, true, &mappedTxn{set: set, answered: func(resp kmsg.Response) { s.txns.answered(txnID, e, resp) }}
}

// initErrorCode is what a request waiting on a failed init is answered: a
// code every client retries on (the init is tried again then), unless the
// coordinator refused the init for good.
func initErrorCode(err error) int16 {
	var ke *kerr.Error
	if errors.As(err, &ke) && !kerr.IsRetriable(ke) && ke.Code != kerr.ConcurrentTransactions.Code {
		return ke.Code
	}
	return kerr.ConcurrentTransactions.Code
}

// txnTimeout is the transaction timeout txnID last initialised with
// through Ferry, or Kafka's default.
func (s *Server) txnTimeout(txnID string) int32 {
	if t, ok := s.txnTimeouts.Load(txnID); ok {
		return t.(int32)
	}
	return defaultTxnTimeout
}

// initTxnID initialises txnID afresh on u, which fences and aborts anything
// it still had open there.
func initTxnID(ctx context.Context, u *upstream, txnID string, timeout int32) (int64, int16, error) {
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.TransactionalID = &txnID
	ip.TransactionTimeoutMillis = timeout
	for {
		got, err := ip.RequestWith(ctx, u.cl)
		code := kerr.CoordinatorNotAvailable.Code
		if err == nil {
			code = got.ErrorCode
		}
		if code == 0 {
			if got.ProducerID < 0 {
				return -1, -1, errors.New("InitProducerId answered no producer ID")
			}
			return got.ProducerID, got.ProducerEpoch, nil
		}
		if e := kerr.ErrorForCode(code); code != kerr.ConcurrentTransactions.Code && !kerr.IsRetriable(e) {
			return -1, -1, e
		}
		select {
		case <-ctx.Done():
			return -1, -1, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
