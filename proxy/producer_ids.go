package proxy

// Producer IDs of another generation. A client keeps the producer ID it was
// given across a switch; the clusters both hand out IDs from 0, so that ID's
// physical part names nothing, or another producer, on the cluster active
// now. It is never forwarded. What the client gets instead is what lets it
// carry on (the codes were chosen by reading the Java 4.4 and franz-go
// producers):
//
//   - Produce, idempotent: the batch is written under a producer ID Ferry
//     allocates on the active cluster for that client ID (remappedPIDs). The
//     Java idempotent producer never asks for a new ID after its first (an
//     epoch bump is local, same ID), so any error would come back forever; a
//     broker accepts any sequence from a producer ID it holds no state for.
//   - Produce, transactional: UNKNOWN_PRODUCER_ID with log start offset -2
//     (produceError): the transaction is abortable, and -2 is below any
//     offset the Java producer acknowledged, so it neither retries the batch
//     forever (-1: "unknown, retry") nor resets its sequences and retries
//     under the same ID (an offset above the last acknowledged one).
//   - InitProducerId with another generation's ID and epoch (a KIP-360 bump,
//     or franz-go reloading its ID): sent as a fresh init (-1, -1); the
//     answer's new ID is taken by every client.
//   - AddPartitionsToTxn, AddOffsetsToTxn, EndTxn(commit): UNKNOWN_PRODUCER_ID,
//     abortable in Java (with an epoch bump where the coordinator supports
//     it) and franz-go. TxnOffsetCommit: answered without error and not
//     sent (Java fails the producer on UNKNOWN_PRODUCER_ID there); its
//     transaction cannot commit, since its EndTxn carries the same ID.
//   - EndTxn(abort): the transaction was on the other cluster (or under the
//     other generation, and Ferry's switch aborts it there). Ferry
//     initialises the transactional ID afresh on the active cluster, which
//     fences and aborts anything it still had open, and answers success with
//     the new ID (EndTxn v5+ carries it: KIP-890 clients take it; older ones
//     bump through InitProducerId next, which is again a fresh init).

import (
	"context"
	"errors"
	"math"
	"reflect"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
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
	walkFields(reflect.ValueOf(kr), func(name string, f reflect.Value) {
		if name == "ProducerID" && f.Kind() == reflect.Int64 {
			if _, ok := routing.PhysicalPID(gen, f.Int()); !ok {
				stale = true
			}
		}
	})
	return stale
}

// otherGeneration answers a coordinator request that carries a producer ID
// of another generation, or rewrites it (InitProducerId: rewritten) so that
// it can be forwarded; handled is false when the request goes on.
func (s *Server) otherGeneration(c *clientConn, req *request, kr kmsg.Request) (r *reply, handled, rewritten bool) {
	gen := req.state.Generation
	if ip, ok := kr.(*kmsg.InitProducerIDRequest); ok && ip.TransactionalID != nil {
		s.txnTimeouts.Store(*ip.TransactionalID, ip.TransactionTimeoutMillis)
	}
	if !staleProducerID(gen, kr) {
		return nil, false, false
	}
	s.metrics.refused(req.hdr.Key, reasonOtherGeneration)
	switch r := kr.(type) {
	case *kmsg.InitProducerIDRequest:
		r.ProducerID, r.ProducerEpoch = -1, -1
		return nil, false, true
	case *kmsg.EndTxnRequest:
		if !r.Commit {
			return s.abortElsewhere(c, req, r), true, false
		}
	case *kmsg.TxnOffsetCommitRequest:
		return localReply(req, errorResponse(kr, 0, "")), true, false
	}
	resp := errorResponse(kr, kerr.UnknownProducerID.Code, "ferry: the producer ID was issued before the last switch; abort the transaction")
	if e, ok := resp.(*kmsg.EndTxnResponse); ok {
		e.ProducerID, e.ProducerEpoch = -1, -1
	}
	return localReply(req, resp), true, false
}

// abortElsewhere answers an EndTxn(abort) whose producer ID is of another
// generation: it initialises the transactional ID on the active cluster and
// answers with the new ID. A coordinator still busy (aborting what the
// fresh init fenced) is answered CONCURRENT_TRANSACTIONS: every client
// retries its abort on it.
func (s *Server) abortElsewhere(c *clientConn, req *request, in *kmsg.EndTxnRequest) *reply {
	timeout := int32(defaultTxnTimeout)
	if t, ok := s.txnTimeouts.Load(in.TransactionalID); ok {
		timeout = t.(int32)
	}
	gen := req.state.Generation
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		resp := kmsg.NewPtrEndTxnResponse()
		resp.ProducerID, resp.ProducerEpoch = -1, -1
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ip := kmsg.NewPtrInitProducerIDRequest()
		ip.TransactionalID = &in.TransactionalID
		ip.TransactionTimeoutMillis = timeout
		for {
			got, err := ip.RequestWith(ctx, req.up.cl)
			code := kerr.CoordinatorNotAvailable.Code
			if err == nil {
				code = got.ErrorCode
			}
			if code == 0 {
				resp.ProducerID, resp.ProducerEpoch = routing.VirtualPID(gen, got.ProducerID), got.ProducerEpoch
				return resp, nil, nil
			}
			if e := kerr.ErrorForCode(code); code != kerr.ConcurrentTransactions.Code && !kerr.IsRetriable(e) {
				resp.ErrorCode = code
				return resp, nil, nil
			}
			select {
			case <-ctx.Done():
				resp.ErrorCode = kerr.ConcurrentTransactions.Code
				return resp, nil, nil
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// remappedPIDs holds, under the current generation, the producer ID Ferry
// allocated on the active cluster for each idempotent producer still
// writing with an ID of another generation. Per member: a partition's
// batches all reach it through the member that leads it, and a broker
// accepts any first sequence from an ID it holds no state for. An entry
// dropped (the map is bounded) is allocated again: only a batch retried
// across that could then be written twice.
type remappedPIDs struct {
	mu  sync.Mutex
	gen uint32
	m   map[int64]*remapped
}

type remapped struct {
	ready chan struct{}
	phys  int64
	err   error
}

const maxRemapped = 1 << 16

// physical returns the physical producer ID standing for virt, another
// generation's ID, under gen: allocated once (concurrent callers wait for
// the same allocation), again after a failure.
func (r *remappedPIDs) physical(ctx context.Context, u *upstream, gen uint32, virt int64) (int64, error) {
	r.mu.Lock()
	if r.m == nil || r.gen != gen {
		r.gen, r.m = gen, map[int64]*remapped{}
	}
	e := r.m[virt]
	if e != nil {
		r.mu.Unlock()
		select {
		case <-e.ready:
			return e.phys, e.err
		case <-ctx.Done():
			return -1, ctx.Err()
		}
	}
	if len(r.m) >= maxRemapped {
		for k := range r.m {
			delete(r.m, k)
			break
		}
	}
	e = &remapped{ready: make(chan struct{})}
	r.m[virt] = e
	r.mu.Unlock()

	e.phys, e.err = allocatePID(ctx, u)
	close(e.ready)
	if e.err != nil {
		r.mu.Lock()
		if r.m[virt] == e {
			delete(r.m, virt)
		}
		r.mu.Unlock()
	}
	return e.phys, e.err
}

// allocatePID asks the cluster for an idempotent producer ID.
func allocatePID(ctx context.Context, u *upstream) (int64, error) {
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.TransactionTimeoutMillis = math.MaxInt32
	resp, err := ip.RequestWith(ctx, u.cl)
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
