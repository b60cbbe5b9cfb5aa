package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// A transactional ID's mapping onto the active cluster (txn_remap.go) is
// state: whether the client's transaction under it is open, the ID and epoch
// Ferry initialised, each partition's sequence base. In a fleet the requests
// that read and change it reach different members: the coordinator requests
// go to the member the transactional ID hashes to, TxnOffsetCommit to the
// group's, each Produce to its partitions' leaders. So one member keeps it,
// the transactional ID's coordinator member (the one FindCoordinator names),
// and the others ask it in a call between members. Only producers still
// writing under an ID of the generation before a switch take this path
// (kafkajs for good, the others until their next EndTxn or InitProducerId);
// it costs them one call per request, or per partition of a Produce.

// The same holds for an idempotent producer writing under an ID of the
// generation before a switch (the Java producer never asks for a new one):
// the member its ID hashes to allocates the physical ID it writes under,
// for every member (idempotentPID), once.

// Peers reach the other members of the fleet.
type Peers interface {
	// Self is this member's node ID.
	Self() int32
	// Call sends body to member to's handler of kind and returns its
	// answer (membership.Fleet.Call).
	Call(ctx context.Context, to int32, kind string, body []byte) ([]byte, error)
	// Unreachable is the members this one knows of but cannot ask now:
	// suspected, or taken for dead, and not gone on purpose. Cut off
	// from the others, a member sees all of them so.
	Unreachable() []int32
}

// TxnCallKind is the kind of the calls HandleTxnCall answers.
const TxnCallKind = "proxy.txn"

// txnCall is one call to the member keeping a transactional ID's mapping.
type txnCall struct {
	Op    string   `json:"op"` // "decide", "answered", "produce", "own", "pid", "pidheld", "pidprev"
	Query txnQuery `json:"query"`
	// Answered: "answered"'s broker answer.
	Answered txnAnswered `json:"answered"`
	// Part and Seq: "produce"'s partition and batch base sequence.
	Part string `json:"part,omitempty"`
	Seq  int32  `json:"seq,omitempty"`
}

// txnProduced is "produce"'s answer: txnRemaps.produce's results.
type txnProduced struct {
	Phys      int64 `json:"phys"`
	PhysEpoch int16 `json:"phys_epoch"`
	PhysSeq   int32 `json:"phys_seq"`
	Code      int16 `json:"code"`
}

// txnCallTimeout bounds a call that does not initialise a transactional ID.
const txnCallTimeout = 5 * time.Second

var errOtherGeneration = errors.New("this member serves another generation")

// txnOwner is the member keeping txnID's mapping: its coordinator member.
func (s *Server) txnOwner(txnID string) (owner int32, remote bool) {
	return s.peerOwner("coordinator\x00" + txnID)
}

// peerOwner is the member rendezvous hashing gives key; remote is false
// when it is this one (or there is no fleet).
func (s *Server) peerOwner(key string) (owner int32, remote bool) {
	if s.cfg.peers == nil {
		return -1, false
	}
	owner = s.brokers.Owner(key)
	return owner, owner >= 0 && owner != s.cfg.peers.Self()
}

func (s *Server) callTxnOwner(ctx context.Context, owner int32, call txnCall, out any) error {
	body, err := json.Marshal(call)
	if err != nil {
		return err
	}
	resp, err := s.cfg.peers.Call(ctx, owner, TxnCallKind, body)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(resp, out)
}

// askTxnOwner is decideStaleTxn on the owner, and how to tell it the
// broker's answer. A call that fails is answered with a code every client
// retries on: the owner is dying, or serves another generation for a moment.
func (s *Server) askTxnOwner(ctx context.Context, owner int32, q txnQuery) (txnDecision, func(txnAnswered)) {
	var d txnDecision
	if err := s.callTxnOwner(ctx, owner, txnCall{Op: "decide", Query: q}, &d); err != nil {
		s.log.Debug("the member keeping a transactional ID's mapping did not answer", fmtOwner(owner, q.TxnID, err)...)
		return txnDecision{Verdict: txnRefuse, Code: kerr.CoordinatorNotAvailable.Code, Message: "ferry: " + clientErrorText(err), Phys: -1, PhysEpoch: -1}, nil
	}
	return d, func(a txnAnswered) {
		// Before the client has its answer: its next request, at any
		// member, must find the transaction open.
		ctx, cancel := context.WithTimeout(s.ctx, txnCallTimeout)
		defer cancel()
		if err := s.callTxnOwner(ctx, owner, txnCall{Op: "answered", Query: q, Answered: a}, nil); err != nil {
			s.log.Warn("a transactional ID's mapping was not told the broker's answer; the client's next request may be refused as abortable",
				fmtOwner(owner, q.TxnID, err)...)
		}
	}
}

// txnProduce is txnRemaps.produce where the transactional ID's mapping is
// kept.
func (s *Server) txnProduce(ctx context.Context, gen uint32, txnID string, virt int64, epoch int16, part string, seq int32) (phys int64, physEpoch int16, physSeq int32, code int16) {
	owner, remote := s.txnOwner(txnID)
	if !remote {
		return s.txns.produce(gen, txnID, virt, epoch, part, seq)
	}
	ctx, cancel := context.WithTimeout(ctx, txnCallTimeout)
	defer cancel()
	var p txnProduced
	call := txnCall{Op: "produce", Query: txnQuery{Gen: gen, TxnID: txnID, PID: virt, Epoch: epoch}, Part: part, Seq: seq}
	if err := s.callTxnOwner(ctx, owner, call, &p); err != nil {
		s.log.Debug("the member keeping a transactional ID's mapping did not answer", fmtOwner(owner, txnID, err)...)
		return -1, -1, -1, kerr.NotLeaderForPartition.Code
	}
	return p.Phys, p.PhysEpoch, p.PhysSeq, p.Code
}

// ownTxn is txnRemaps.own where the transactional ID's mapping is kept. An
// InitProducerId reaches another member only while the client's view of
// the coordinator is stale; the owner is told in the background. false:
// this member keeps the mapping and has no room for it.
func (s *Server) ownTxn(gen uint32, txnID string) bool {
	owner, remote := s.txnOwner(txnID)
	if !remote {
		return s.txns.own(gen, txnID)
	}
	s.goTracked(func() {
		ctx, cancel := context.WithTimeout(s.ctx, txnCallTimeout)
		defer cancel()
		if err := s.callTxnOwner(ctx, owner, txnCall{Op: "own", Query: txnQuery{Gen: gen, TxnID: txnID}}, nil); err != nil {
			s.log.Debug("the member keeping a transactional ID's mapping was not told of its InitProducerId", fmtOwner(owner, txnID, err)...)
		}
	})
	return true
}

// idempotentPID is remappedPIDs.physicalBy where the client's ID is kept:
// the member its virtual ID hashes to allocates the physical one, and
// this member keeps the answer.
func (s *Server) idempotentPID(ctx context.Context, u *upstream.Cluster, gen uint32, virt int64) (int64, error) {
	owner, remote := s.peerOwner("pid\x00" + strconv.FormatInt(virt, 10))
	alloc := func(ctx context.Context) (int64, error) { return s.ownerPID(ctx, u, gen, virt) }
	if remote {
		alloc = func(ctx context.Context) (int64, error) {
			var p txnProduced
			call := txnCall{Op: "pid", Query: txnQuery{Gen: gen, PID: virt}}
			if err := s.callTxnOwner(ctx, owner, call, &p); err != nil {
				return -1, fmt.Errorf("member %d allocating the producer ID: %w", owner, err)
			}
			return p.Phys, nil
		}
	}
	return s.remapped.physicalBy(ctx, gen, virt, func(ctx context.Context) (int64, error) {
		phys, err := alloc(ctx)
		if err == nil {
			s.log.Debug("a producer of another generation writes under a producer ID allocated for it",
				zap.Uint32("generation", gen), zap.Int64("producer_id", virt), zap.Int64("physical_producer_id", phys), zap.Int32("allocated_by", owner))
		}
		return phys, err
	})
}

// ownerPID allocates, on the member virt hashes to, the physical ID virt
// writes under in gen — unless another member already writes it under
// one: this member took over the ID from one that died, or restarted and
// lost what it allocated. Two IDs for one producer in one generation
// would let a batch retried through another member be written twice, or
// out of order (the broker takes any first sequence from a fresh ID): a
// member that does not answer fails the allocation (the client retries)
// rather than count as holding none.
func (s *Server) ownerPID(ctx context.Context, u *upstream.Cluster, gen uint32, virt int64) (int64, error) {
	if s.cfg.peers != nil {
		phys, err := s.heldByPeers(ctx, txnCall{Op: "pidheld", Query: txnQuery{Gen: gen, PID: virt}})
		if err != nil {
			return -1, err
		}
		if phys >= 0 {
			s.log.Debug("a producer of another generation goes on under the producer ID another member holds for it",
				zap.Uint32("generation", gen), zap.Int64("producer_id", virt), zap.Int64("physical_producer_id", phys))
			return phys, nil
		}
	}
	return allocatePID(ctx, u)
}

// pidHeldWait bounds the question to the other members in heldByPeers.
const pidHeldWait = time.Second

// heldByPeers asks every other live member for the physical ID a producer
// writes under (call: "pidheld" in this generation, "pidprev" in the one
// before): the first found, or -1 when every member answered it holds
// none. A member that did not answer (in time, or under the same
// generation) is an error, not a "none": it may hold one. So is a member
// this one cannot ask at all (Peers.Unreachable): a member cut off from
// the fleet sees no other live member, and took "nobody answered" for
// "nobody holds one" — the 30-minute chaos run on dfeb31b wrote a
// producer's later batch first under a fresh ID through such a member
// ("4/43588 holds 212324 after 212838").
func (s *Server) heldByPeers(ctx context.Context, call txnCall) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, pidHeldWait)
	defer cancel()
	self := s.cfg.peers.Self()
	var unreachable error
	if ids := slices.DeleteFunc(s.cfg.peers.Unreachable(), func(id int32) bool { return id == self }); len(ids) > 0 {
		unreachable = fmt.Errorf("members %v cannot be asked whether they hold an ID for producer %d (suspected or taken for dead)", ids, call.Query.PID)
	}
	type answer struct {
		member int32
		phys   int64
		err    error
	}
	found := make(chan answer)
	n := 0
	for _, b := range s.brokers.Brokers() {
		if b.NodeID == self {
			continue
		}
		n++
		go func(to int32) {
			p := txnProduced{Phys: -1}
			err := s.callTxnOwner(ctx, to, call, &p)
			select {
			case found <- answer{to, p.Phys, err}:
			case <-ctx.Done():
			}
		}(b.NodeID)
	}
	var unanswered error
	for range n {
		select {
		case a := <-found:
			switch {
			case a.err != nil:
				unanswered = fmt.Errorf("member %d did not say whether it holds an ID for producer %d: %w", a.member, call.Query.PID, a.err)
			case a.phys >= 0:
				return a.phys, nil
			}
		case <-ctx.Done():
			return -1, fmt.Errorf("asking the members whether they hold an ID for producer %d: %w", call.Query.PID, ctx.Err())
		}
	}
	if unanswered == nil {
		unanswered = unreachable
	}
	return -1, unanswered
}

// HandleTxnCall answers another member's call about a transactional ID's
// mapping kept here (register it for TxnCallKind). A call made under
// another generation than this member serves is refused: the mapping is
// per generation, and the caller answers its client with a retriable code.
func (s *Server) HandleTxnCall(ctx context.Context, _ int32, body []byte) ([]byte, error) {
	var call txnCall
	if err := json.Unmarshal(body, &call); err != nil {
		return nil, fmt.Errorf("decoding a transactional ID call: %w", err)
	}
	q := call.Query
	st := s.routes.Current()
	if q.Gen != st.Generation {
		return nil, fmt.Errorf("%w (%d, asked under %d)", errOtherGeneration, st.Generation, q.Gen)
	}
	switch call.Op {
	case "decide":
		u := s.cluster(st.Active)
		if u == nil {
			return nil, fmt.Errorf("no upstream for the active cluster %q", st.Active)
		}
		d, _ := s.decideStaleTxn(ctx, u, q)
		return json.Marshal(d)
	case "answered":
		s.txns.answeredFor(q.Gen, q.TxnID, q.PID, q.Epoch, call.Answered)
		return nil, nil
	case "produce":
		var p txnProduced
		p.Phys, p.PhysEpoch, p.PhysSeq, p.Code = s.txns.produce(q.Gen, q.TxnID, q.PID, q.Epoch, call.Part, call.Seq)
		return json.Marshal(p)
	case "own":
		if !s.txns.own(q.Gen, q.TxnID) {
			s.metrics.refused(int16(kmsg.InitProducerID), reasonTxnMappingsFull)
			return nil, errors.New(txnMappingsFullMsg)
		}
		return nil, nil
	case "pid":
		u := s.cluster(st.Active)
		if u == nil {
			return nil, fmt.Errorf("no upstream for the active cluster %q", st.Active)
		}
		phys, err := s.remapped.physicalBy(ctx, q.Gen, q.PID, func(ctx context.Context) (int64, error) { return s.ownerPID(ctx, u, q.Gen, q.PID) })
		if err != nil {
			return nil, err
		}
		return json.Marshal(txnProduced{Phys: phys})
	case "pidheld":
		// Never waits: the caller may be the member this one waits on.
		return json.Marshal(txnProduced{Phys: s.remapped.held(q.Gen, q.PID)})
	case "pidprev":
		phys, _ := s.remapped.prevHeld(q.PrevGen, q.PID)
		return json.Marshal(txnProduced{Phys: phys})
	}
	return nil, fmt.Errorf("unknown transactional ID call %q", call.Op)
}

func fmtOwner(owner int32, txnID string, err error) []zap.Field {
	return []zap.Field{zap.Int32("member", owner), zap.String("transactional_id", txnID), zap.Error(err)}
}
