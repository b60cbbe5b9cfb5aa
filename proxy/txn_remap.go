package proxy

import (
	"context"
	"errors"
	"math"
	"regexp"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// txnRemaps holds, under the current generation, per transactional ID, the
// producer ID and epoch Ferry initialised on the active cluster for a
// transactional client still writing with an ID of another generation
// (producer_ids.go says why and what each request gets). In a fleet a
// transactional ID's mapping is kept only by its coordinator member; the
// other members ask it (txn_fleet.go).
//
// Bounded (maxTxnRemaps), without dropping what fences a live producer:
// an entry, owned or a mapping, fences every older ID of its transactional
// ID, and one dropped would let a zombie of an earlier generation be
// mapped, re-initialise the transactional ID and fence the producer that
// took it over. An entry is used by every request of its mapping and, for
// an owned one, by its producer's transactional coordinator requests
// (touch). When full, only the least recently used entry is dropped, and
// only once it has been idle past txnRemapIdle (Kafka's
// transaction.max.timeout.ms default: the broker has aborted whatever it
// had open); otherwise the request that would add one is refused with a
// retriable error (remapFull) and counted.
type txnRemaps struct {
	mu  sync.Mutex
	gen uint32
	m   *simplelru.LRU[string, *txnRemap]
	// now is the clock of idleness (tests set it); evicted counts the
	// entries dropped idle.
	now     func() time.Time
	evicted prometheus.Counter
	// full counts a request of API key refused for want of room.
	full func(key int16)
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

	// used is when the entry was last looked up or changed.
	used time.Time
}

const maxTxnRemaps = 1 << 16

// txnRemapIdle is how long an entry must go unused before it may be
// dropped for another: Kafka's transaction.max.timeout.ms default (15
// minutes), past which no transaction begun under it is still open.
const txnRemapIdle = 15 * time.Minute

// txnInitTimeout bounds Ferry's InitProducerId of a transactional ID: the
// coordinator answers CONCURRENT_TRANSACTIONS while it aborts what the init
// fenced.
const txnInitTimeout = 10 * time.Second

type remapVerdict uint8

const (
	remapNew    remapVerdict = iota // not mapped before: refused as abortable
	remapFound                      // the mapping of this ID and epoch
	remapFenced                     // older than the mapping's, or the ID is owned
	remapFull                       // not mapped, and no room: refused, retriable
)

// reasonTxnMappingsFull counts the requests refused because maxTxnRemaps
// entries were held, none idle (ferry_refusals_total).
const reasonTxnMappingsFull = "txn_mappings_full"

// txnMappingsFullMsg is what such a request is answered with.
const txnMappingsFullMsg = "ferry: too many transactional IDs in use since the last switch; retry"

var errRemapGone = errors.New("the mapping was replaced")

func (r *txnRemaps) resetLocked(gen uint32) {
	if r.m == nil || r.gen != gen {
		// Never evicts by itself: putLocked makes room first.
		r.m, _ = simplelru.NewLRU[string, *txnRemap](maxTxnRemaps+1, nil)
		r.gen = gen
	}
}

func (r *txnRemaps) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

// getLocked is txnID's entry, marked used.
func (r *txnRemaps) getLocked(txnID string) *txnRemap {
	e, ok := r.m.Get(txnID)
	if !ok {
		return nil
	}
	e.used = r.clock()
	return e
}

// peekLocked is txnID's entry, not marked used.
func (r *txnRemaps) peekLocked(txnID string) *txnRemap {
	e, _ := r.m.Peek(txnID)
	return e
}

// putLocked sets txnID's entry, dropping the least recently used one when
// full if it has been idle past txnRemapIdle; false when there is no room.
func (r *txnRemaps) putLocked(txnID string, e *txnRemap) bool {
	now := r.clock()
	if !r.m.Contains(txnID) && r.m.Len() >= maxTxnRemaps {
		_, oldest, _ := r.m.GetOldest()
		if now.Sub(oldest.used) <= txnRemapIdle {
			return false
		}
		r.m.RemoveOldest()
		if r.evicted != nil {
			r.evicted.Inc()
		}
	}
	e.used = now
	r.m.Add(txnID, e)
	return true
}

// own records that a client initialised txnID under gen; false when there
// is no room to (the InitProducerId is refused, retriable).
func (r *txnRemaps) own(gen uint32, txnID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetLocked(gen)
	return r.putLocked(txnID, &txnRemap{owned: true})
}

// touch marks txnID's entry under gen used, if this member holds one: its
// producer (of gen) is still transacting.
func (r *txnRemaps) touch(gen uint32, txnID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m != nil && r.gen == gen {
		r.getLocked(txnID)
	}
}

// lookup finds the mapping of the client's ID and epoch for txnID under
// gen, making it when there is none (or the client's is newer: another
// producer of the transactional ID), and calls fn with it under the lock.
func (r *txnRemaps) lookup(gen uint32, txnID string, virt int64, epoch int16, fn func(*txnRemap, remapVerdict)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetLocked(gen)
	e := r.getLocked(txnID)
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
		if !r.putLocked(txnID, e) {
			e, v = nil, remapFull
		}
	}
	fn(e, v)
}

// resolve returns e's physical ID and epoch, initialising txnID on u the
// first time (concurrent callers wait for the same init; a failed one is
// tried again by the next caller).
func (r *txnRemaps) resolve(ctx context.Context, u *upstream.Cluster, txnID string, e *txnRemap, timeout int32) (int64, int16, error) {
	for {
		r.mu.Lock()
		if r.peekLocked(txnID) != e {
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

// txnAnswered is what a broker answered to a coordinator request forwarded
// under a mapping, as far as the mapping cares: the request's API, whether
// it succeeded (for AddPartitionsToTxn: any partition added), and the new
// ID and epoch an EndTxn v5+ answer carries (-1 otherwise).
type txnAnswered struct {
	API   int16 `json:"api"`
	OK    bool  `json:"ok"`
	PID   int64 `json:"pid"`
	Epoch int16 `json:"epoch"`
}

// answerOf sums up resp for the mapping.
func answerOf(resp kmsg.Response) txnAnswered {
	a := txnAnswered{API: resp.Key(), PID: -1, Epoch: -1}
	switch resp := resp.(type) {
	case *kmsg.AddPartitionsToTxnResponse:
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				// All or none: the others are OPERATION_NOT_ATTEMPTED.
				a.OK = a.OK || p.ErrorCode == 0
			}
		}
	case *kmsg.AddOffsetsToTxnResponse:
		a.OK = resp.ErrorCode == 0
	case *kmsg.EndTxnResponse:
		a.OK = resp.ErrorCode == 0
		a.PID, a.Epoch = resp.ProducerID, resp.ProducerEpoch
	}
	return a
}

// answered notes what the broker answered to a request forwarded under e:
// a transaction begun or ended, a new ID or epoch (EndTxn v5+).
func (r *txnRemaps) answered(txnID string, e *txnRemap, a txnAnswered) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || r.getLocked(txnID) != e {
		return
	}
	switch kmsg.Key(a.API) {
	case kmsg.AddPartitionsToTxn, kmsg.AddOffsetsToTxn:
		e.open = e.open || a.OK
	case kmsg.EndTxn:
		if a.OK {
			e.open = false
			if a.PID >= 0 {
				e.phys, e.physEpoch = a.PID, a.Epoch
			}
		}
	}
	if e.open {
		e.dead = false
	}
}

// answeredFor is answered for the mapping of the client's ID and epoch
// under gen, told by another member (txn_fleet.go); a mapping replaced
// since is left alone.
func (r *txnRemaps) answeredFor(gen uint32, txnID string, virt int64, epoch int16, a txnAnswered) {
	r.mu.Lock()
	var e *txnRemap
	if r.m != nil {
		e = r.peekLocked(txnID)
	}
	if r.gen != gen || e == nil || e.owned || e.virt != virt || e.epoch != epoch {
		e = nil
	}
	r.mu.Unlock()
	if e != nil {
		r.answered(txnID, e, a)
	}
}

// produce maps one transactional batch's producer ID, epoch and sequence
// for partition part; code is what the partition is answered instead.
func (r *txnRemaps) produce(gen uint32, txnID string, virt int64, epoch int16, part string, seq int32) (phys int64, physEpoch int16, physSeq int32, code int16) {
	r.lookup(gen, txnID, virt, epoch, func(e *txnRemap, v remapVerdict) {
		switch {
		case v == remapFull:
			// Retried by every producer, after a metadata refresh.
			code = kerr.NotLeaderForPartition.Code
			if r.full != nil {
				r.full(int16(kmsg.Produce))
			}
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

// txnQuery is a transactional coordinator request carrying a producer ID of
// another generation, as the member keeping its transactional ID's mapping
// needs it (txn_fleet.go sends it to that member).
type txnQuery struct {
	Gen     uint32 `json:"gen"`
	TxnID   string `json:"txn_id"`
	PID     int64  `json:"pid"`
	Epoch   int16  `json:"epoch"`
	API     int16  `json:"api"`
	Version int16  `json:"version"`
	// Commit: an EndTxn that commits.
	Commit bool `json:"commit,omitempty"`
	// PrevGen: the generation a "pidprev" call asks about.
	PrevGen uint32 `json:"prev_gen,omitempty"`
}

// txnVerdict is what becomes of a txnQuery's request.
type txnVerdict uint8

const (
	txnRefuse  txnVerdict = iota // answered with Code and Message
	txnSuccess                   // answered by Ferry, not sent: Code 0 but for a failed init (EndTxn v5+)
	txnForward                   // sent under Phys and PhysEpoch
)

// txnDecision is the mapping's answer to a txnQuery. Phys and PhysEpoch are
// also the ID and epoch an EndTxn v5+ answered by Ferry carries (-1: none).
type txnDecision struct {
	Verdict   txnVerdict `json:"verdict"`
	Code      int16      `json:"code"`
	Message   string     `json:"message,omitempty"`
	Phys      int64      `json:"phys"`
	PhysEpoch int16      `json:"phys_epoch"`
}

const abortMsg = "ferry: the producer ID was issued before the last switch; abort the transaction"

// The commit of a transaction a switch aborted (begun before it, or fenced
// by its drain) is refused UNKNOWN_PRODUCER_ID, which Java, librdkafka,
// franz-go and kafkajs take as abortable: the application aborts and goes
// on. Kafka Streams does not: its commit path takes any error but a fenced
// producer, an invalid epoch, a failed group commit or an invalid producer
// ID mapping as fatal to the stream thread, while the Java producer takes
// each of those at EndTxn as fatal to the producer. A Streams thread
// recovers from a fenced producer (a task migration: its tasks closed
// dirty, a new producer, the group rejoined, processing again from the
// committed offsets, which the aborted transaction never moved), so its
// producer, known by the client ID Streams gives it
// (<client.id>-StreamThread-<n>-producer), is answered
// INVALID_PRODUCER_EPOCH instead. A Streams transaction whose offsets Ferry
// refuses meets offsetsRefused first, also a task migration.
var streamsProducerID = regexp.MustCompile(`-StreamThread-[0-9]+-producer$`)

func streamsProducer(clientID string) bool { return streamsProducerID.MatchString(clientID) }

const streamsAbortedMsg = "ferry: a switch aborted this transaction; Kafka Streams: a task migration (the producer is replaced and the tasks resume from their committed offsets)"

// offsetsRefused is the answer to a TxnOffsetCommit of a transaction that
// cannot commit (begun before the switch that aborted it, or fenced by a
// switch's drain): UNKNOWN_MEMBER_ID, the group's "your generation is
// gone", which every client takes as abortable (Java's CommitFailedException,
// librdkafka, franz-go, kafkajs) and Kafka Streams as a task migration, not
// as fatal to its thread, as it does UNKNOWN_PRODUCER_ID there and at the
// commit. (Before, the offsets were answered success, not sent, and the
// commit refused.)
var offsetsRefused = kerr.UnknownMemberID.Code

const offsetsRefusedMsg = "ferry: the transaction was begun before the last switch, which aborted it; its offsets cannot commit: abort it"

// staleQuery is kr as a txnQuery; false for a request that is refused
// whatever the mapping (AddPartitionsToTxn v4+, the brokers' batched form).
func staleQuery(gen uint32, version int16, kr kmsg.Request) (txnQuery, bool) {
	q := txnQuery{Gen: gen, API: kr.Key(), Version: version}
	switch r := kr.(type) {
	case *kmsg.AddPartitionsToTxnRequest:
		if r.Version >= 4 {
			return q, false
		}
		q.TxnID, q.PID, q.Epoch = r.TransactionalID, r.ProducerID, r.ProducerEpoch
	case *kmsg.AddOffsetsToTxnRequest:
		q.TxnID, q.PID, q.Epoch = r.TransactionalID, r.ProducerID, r.ProducerEpoch
	case *kmsg.TxnOffsetCommitRequest:
		q.TxnID, q.PID, q.Epoch = r.TransactionalID, r.ProducerID, r.ProducerEpoch
	case *kmsg.EndTxnRequest:
		q.TxnID, q.PID, q.Epoch, q.Commit = r.TransactionalID, r.ProducerID, r.ProducerEpoch, r.Commit
	default:
		return q, false
	}
	return q, true
}

// staleTxn answers, or maps onto the transactional ID's mapping, a
// transactional coordinator request carrying a producer ID of another
// generation. The mapping is kept by one member of a fleet
// (txn_fleet.go); this one asks it when it is another.
func (s *Server) staleTxn(c *clientConn, req *request, kr kmsg.Request) (*reply, bool, *mappedTxn) {
	gen := req.state.Generation
	q, ok := staleQuery(gen, req.hdr.Version, kr)
	if !ok {
		return s.txnReply(req, kr, txnDecision{Verdict: txnRefuse, Code: kerr.UnknownProducerID.Code, Message: abortMsg}), false, nil
	}
	ctx, cancel := context.WithTimeout(c.ctx, txnInitTimeout)
	defer cancel()
	var (
		d        txnDecision
		answered func(txnAnswered)
	)
	if owner, remote := s.txnOwner(q.TxnID); remote {
		d, answered = s.askTxnOwner(ctx, owner, q)
	} else {
		var e *txnRemap
		d, e = s.decideStaleTxn(ctx, req.up, q)
		answered = func(a txnAnswered) { s.txns.answered(q.TxnID, e, a) }
	}
	if d.Verdict != txnForward {
		return s.txnReply(req, kr, d), false, nil
	}
	phys, physEpoch := d.Phys, d.PhysEpoch
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
	return nil, true, &mappedTxn{set: set, answered: func(resp kmsg.Response) { answered(answerOf(resp)) }}
}

// txnReply is Ferry's own answer to kr as d decided it.
func (s *Server) txnReply(req *request, kr kmsg.Request, d txnDecision) *reply {
	if end, ok := kr.(*kmsg.EndTxnRequest); ok && end.Commit && d.Code == kerr.UnknownProducerID.Code && streamsProducer(req.hdr.ClientID) {
		d.Code, d.Message = kerr.InvalidProducerEpoch.Code, streamsAbortedMsg
	}
	resp := errorResponse(kr, d.Code, d.Message)
	if e, ok := resp.(*kmsg.EndTxnResponse); ok {
		e.ProducerID, e.ProducerEpoch = -1, -1
		if d.Verdict == txnSuccess && d.Code == 0 && e.Version >= 5 && d.Phys >= 0 {
			// KIP-890 clients take the ID the answer carries.
			e.ProducerID, e.ProducerEpoch = routing.VirtualPID(req.state.Generation, d.Phys), d.PhysEpoch
		}
	}
	return localReply(req, resp)
}

// decideStaleTxn is this member's mapping's answer to q, initialising the
// transactional ID on u when the request goes on under the mapping or is an
// EndTxn v5+ answered by Ferry. e is the mapping a forwarded request's
// answer is noted on.
func (s *Server) decideStaleTxn(ctx context.Context, u *upstream.Cluster, q txnQuery) (d txnDecision, e *txnRemap) {
	var (
		verdict remapVerdict
		forward bool // under the mapping
		success bool // answered by Ferry without error, not sent
		// refused: the code a request neither forwarded nor answered
		// success gets.
		refused = kerr.UnknownProducerID.Code
		msg     = abortMsg
	)
	s.txns.lookup(q.Gen, q.TxnID, q.PID, q.Epoch, func(m *txnRemap, v remapVerdict) {
		e, verdict = m, v
		if v == remapFenced || v == remapFull {
			return
		}
		switch kmsg.Key(q.API) {
		case kmsg.EndTxn:
			switch {
			case m.open:
				forward = true
			case !q.Commit:
				// Nothing of the transaction it ends is on the
				// active cluster.
				m.dead, success = false, true
			default:
				// Its transaction was begun before the switch,
				// which aborted it.
				m.dead = true
			}
		case kmsg.AddPartitionsToTxn:
			// The first is refused: a transaction begun before the
			// switch may be going on.
			forward = v == remapFound && !m.dead
		case kmsg.AddOffsetsToTxn:
			// Likewise, but answered success, not sent: the refusal
			// comes at the TxnOffsetCommit that follows, as the
			// group's (offsetsRefused). An error here is one Kafka
			// Streams takes as fatal to its thread.
			forward = v == remapFound && !m.dead
			if !forward {
				success, m.dead = true, true
			}
		case kmsg.TxnOffsetCommit:
			forward = m.open
			if !forward {
				m.dead = true
				refused, msg = offsetsRefused, offsetsRefusedMsg
			}
		}
	})
	d = txnDecision{Verdict: txnRefuse, Phys: -1, PhysEpoch: -1}
	switch {
	case verdict == remapFull:
		// Every client retries its request on it.
		s.metrics.refused(q.API, reasonTxnMappingsFull)
		d.Code, d.Message = kerr.CoordinatorLoadInProgress.Code, txnMappingsFullMsg
		return d, nil
	case verdict == remapFenced:
		d.Code, d.Message = kerr.InvalidProducerEpoch.Code, "ferry: a newer producer of this transactional ID fenced this one"
		return d, nil
	case !forward && !success:
		d.Code, d.Message = refused, msg
		return d, nil
	case success:
		d.Verdict = txnSuccess
		if kmsg.Key(q.API) != kmsg.EndTxn || q.Version < 5 {
			return d, nil
		}
	}
	phys, physEpoch, err := s.txns.resolve(ctx, u, q.TxnID, e, s.txnTimeout(q.TxnID))
	if err != nil {
		// Every client retries its abort on it.
		d.Code = initErrorCode(err)
		if d.Verdict == txnRefuse {
			d.Message = "ferry: initialising the transactional ID on the active cluster: " + clientErrorText(err)
		}
		return d, nil
	}
	if d.Verdict == txnRefuse {
		d.Verdict = txnForward
	}
	d.Phys, d.PhysEpoch = phys, physEpoch
	return d, e
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

// maxTxnTimeouts bounds the transaction timeouts remembered: the most
// recently initialised transactional IDs'. One forgotten costs only
// Kafka's default timeout for Ferry's init of it after a switch.
const maxTxnTimeouts = 1 << 16

// noteTxnTimeout remembers the transaction timeout txnID initialises with
// through Ferry, for an init Ferry makes of it after a switch.
func (s *Server) noteTxnTimeout(txnID string, timeout int32) {
	if s.txnTimeouts.Add(txnID, timeout) {
		s.metrics.evicted(stateTxnTimeouts)
	}
}

// txnTimeout is the transaction timeout txnID last initialised with
// through Ferry, or Kafka's default.
func (s *Server) txnTimeout(txnID string) int32 {
	if t, ok := s.txnTimeouts.Get(txnID); ok {
		return t
	}
	return defaultTxnTimeout
}

// initTxnID initialises txnID afresh on u, which fences and aborts anything
// it still had open there.
func initTxnID(ctx context.Context, u *upstream.Cluster, txnID string, timeout int32) (int64, int16, error) {
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.TransactionalID = &txnID
	ip.TransactionTimeoutMillis = timeout
	for {
		got, err := ip.RequestWith(ctx, u.Client)
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
