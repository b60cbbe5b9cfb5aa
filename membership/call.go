package membership

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Handler answers a call of one kind from member from (this member's own
// ID for a call to itself). An error it returns reaches the caller as a
// *RemoteError. Handlers run concurrently and must honour ctx, which ends
// with the caller's deadline or when the fleet closes.
type Handler func(ctx context.Context, from int32, body []byte) ([]byte, error)

// Reply is one member's answer to CallAll.
type Reply struct {
	NodeID int32
	Body   []byte
	Err    error
}

// RemoteError is a call's refusal by the member called: its handler
// returned an error, or it has no handler for the kind.
type RemoteError struct {
	NodeID  int32
	Kind    string
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("member %d refused %s: %s", e.NodeID, e.Kind, e.Message)
}

// ErrBusy is in the error of a call the member called refused at once:
// every handler of the call's lane was running (maxHandlers for the kinds
// set by Handle, maxControlHandlers for those set by HandleControl).
// Nothing ran; the call may be tried again.
var ErrBusy = errors.New("busy")

const maxKindLen = 255

// Handle sets the handler of calls of a kind. Set them before Run, so that
// a member never refuses a call for want of its handler.
func (f *Fleet) Handle(kind string, h Handler) { f.handle(kind, h, false) }

// HandleControl is Handle for a kind that controls a switch (hold,
// install, mirror stop and start): its calls from other members run on
// handler slots of their own, which the other kinds cannot take.
func (f *Fleet) HandleControl(kind string, h Handler) { f.handle(kind, h, true) }

func (f *Fleet) handle(kind string, h Handler, control bool) {
	if kind == "" || len(kind) > maxKindLen {
		panic(fmt.Sprintf("membership: call kind %q must be 1 to %d bytes", kind, maxKindLen))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlers[kind] = h
	f.control[kind] = control
}

func (f *Fleet) handler(kind string) Handler {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.handlers[kind]
}

// isControl reports whether kind was set by HandleControl.
func (f *Fleet) isControl(kind string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.control[kind]
}

// lane is the handler slots a call of kind runs on, and its label: the
// kind when a handler is set for it ("other" otherwise, as a peer names
// it).
func (f *Fleet) lane(kind string) (sem chan struct{}, label string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	label = kind
	if f.handlers[kind] == nil {
		label = "other"
	}
	if f.control[kind] {
		return f.ctlSem, label
	}
	return f.sem, label
}

// Call sends body to member to's handler of kind and returns its answer.
// It goes over memberlist's reliable (TCP) messages, encrypted with the
// gossip key; a call to this member runs the handler directly. A member
// that does not answer ends the call when ctx ends: give ctx a deadline.
//
// A call of a control kind (HandleControl) refused busy is sent again,
// after 25 ms doubling to 1 s, until ctx ends: a switch's step waits for
// room rather than failing at once. Other kinds' callers get ErrBusy.
func (f *Fleet) Call(ctx context.Context, to int32, kind string, body []byte) ([]byte, error) {
	start := time.Now()
	resp, outcome, err := f.call(ctx, to, kind, body)
	for backoff := 25 * time.Millisecond; outcome == outcomeBusy && f.isControl(kind); backoff = min(2*backoff, time.Second) {
		f.metrics.calls.WithLabelValues(kind, outcome).Inc()
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
		resp, outcome, err = f.call(ctx, to, kind, body)
	}
	f.metrics.calls.WithLabelValues(kind, outcome).Inc()
	if outcome == outcomeOK || outcome == outcomeRefused {
		f.metrics.duration.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	}
	return resp, err
}

// ErrNotAlive is in the error of a CallAll reply whose member stopped
// being alive (gossip finds it suspect, dead or gone) before it answered:
// CallAll does not wait for a member that cannot answer.
var ErrNotAlive = errors.New("no longer alive")

// CallAll calls every Alive member (this one included) in parallel and
// returns their replies sorted by node ID. A member that stops being alive
// before it answers is not waited for: its reply's error wraps
// ErrNotAlive.
func (f *Fleet) CallAll(ctx context.Context, kind string, body []byte) []Reply {
	ms := f.Alive()
	out := make([]Reply, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go f.cancelUnlessAlive(cctx, cancel, m.NodeID)
			b, err := f.Call(cctx, m.NodeID, kind, body)
			if err != nil && cctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("call %s to member %d: %w", kind, m.NodeID, ErrNotAlive)
			}
			out[i] = Reply{NodeID: m.NodeID, Body: b, Err: err}
		})
	}
	wg.Wait()
	return out
}

// Split sorts the replies to a CallAll of kind: the answers by node ID,
// the members that failed with why, and those that stopped being alive
// before answering, which it logs on log (unless nil): the caller goes on
// without them.
func Split(log *zap.Logger, kind string, replies []Reply) (answers map[int32][]byte, failed map[int32]error, unreached []int32) {
	answers, failed = map[int32][]byte{}, map[int32]error{}
	for _, r := range replies {
		switch {
		case r.Err == nil:
			answers[r.NodeID] = r.Body
		case errors.Is(r.Err, ErrNotAlive):
			unreached = append(unreached, r.NodeID)
		default:
			failed[r.NodeID] = r.Err
		}
	}
	if len(unreached) > 0 && log != nil {
		log.Warn("members did not answer and are no longer alive; not waiting for them",
			zap.String("call", kind), zap.Int32s("members", unreached))
	}
	return answers, failed, unreached
}

// FirstErr is the failure of the lowest node ID among failed, naming the
// member; nil when there is none.
func FirstErr(failed map[int32]error) error {
	if len(failed) == 0 {
		return nil
	}
	first := int32(math.MaxInt32)
	for id := range failed {
		first = min(first, id)
	}
	return fmt.Errorf("member %d: %w", first, failed[first])
}

// cancelUnlessAlive calls cancel once member id is no longer alive, or
// returns when ctx ends.
func (f *Fleet) cancelUnlessAlive(ctx context.Context, cancel context.CancelFunc, id int32) {
	for {
		ch := f.Changed()
		if !slices.ContainsFunc(f.Alive(), func(m Member) bool { return m.NodeID == id }) {
			cancel()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

type pendingCall struct {
	to int32
	ch chan message
}

func (f *Fleet) call(ctx context.Context, to int32, kind string, body []byte) ([]byte, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, outcomeTimeout, fmt.Errorf("call %s to member %d: %w", kind, to, err)
	}
	if to == f.id {
		return f.callSelf(ctx, kind, body)
	}
	select {
	case <-f.done:
		return nil, outcomeUnreachable, fmt.Errorf("call %s to member %d: this member left the fleet", kind, to)
	default:
	}
	node, ok := f.member(to)
	if !ok {
		return nil, outcomeUnreachable, fmt.Errorf("call %s to member %d: not a live member of the fleet", kind, to)
	}
	id := f.nextID.Add(1)
	ch := make(chan message, 1)
	f.pendMu.Lock()
	f.pending[id] = pendingCall{to: to, ch: ch}
	f.pendMu.Unlock()
	defer func() {
		f.pendMu.Lock()
		delete(f.pending, id)
		f.pendMu.Unlock()
	}()
	req := message{typ: msgRequest, id: id, from: f.id, kind: kind, body: body}
	if dl, ok := ctx.Deadline(); ok {
		req.timeout = max(time.Until(dl).Milliseconds(), 1)
	}
	// SendReliable dials and writes without a context; ctx ends the wait,
	// the TCP timeout the send.
	sent := make(chan error, 1)
	go func() { sent <- f.ml.SendReliable(&node, req.encode()) }()
	changed := f.Changed()
	for {
		select {
		case <-changed:
			// A member that dies or leaves will not answer: say so now
			// rather than at the end of ctx.
			if _, ok := f.member(to); !ok {
				return nil, outcomeUnreachable, fmt.Errorf("member %d died or left during %s", to, kind)
			}
			changed = f.Changed()
		case err := <-sent:
			if err != nil {
				return nil, outcomeUnreachable, fmt.Errorf("call %s to member %d at %s: %v", kind, to, node.Address(), err)
			}
			sent = nil
		case resp := <-ch:
			switch resp.typ {
			case msgExpired:
				return nil, outcomeTimeout, fmt.Errorf("member %d did not answer %s in time: %w (%s)", to, kind, context.DeadlineExceeded, resp.err)
			case msgBusy:
				return nil, outcomeBusy, fmt.Errorf("member %d refused %s, nothing done: %w (%s)", to, kind, ErrBusy, resp.err)
			}
			if resp.err != "" {
				return nil, outcomeRefused, &RemoteError{NodeID: to, Kind: kind, Message: resp.err}
			}
			return resp.body, outcomeOK, nil
		case <-ctx.Done():
			return nil, outcomeTimeout, fmt.Errorf("member %d did not answer %s: %w", to, kind, ctx.Err())
		case <-f.done:
			return nil, outcomeUnreachable, fmt.Errorf("call %s to member %d: this member left the fleet", kind, to)
		}
	}
}

func (f *Fleet) callSelf(ctx context.Context, kind string, body []byte) ([]byte, string, error) {
	resp, err := f.runHandler(ctx, f.id, kind, body)
	if err != nil {
		return nil, outcomeRefused, &RemoteError{NodeID: f.id, Kind: kind, Message: err.Error()}
	}
	return resp, outcomeOK, nil
}

func (f *Fleet) runHandler(ctx context.Context, from int32, kind string, body []byte) (resp []byte, err error) {
	h := f.handler(kind)
	if h == nil {
		return nil, fmt.Errorf("no handler for %q", kind)
	}
	defer func() {
		// A peer's message must not take the process down.
		if r := recover(); r != nil {
			f.log.Error("fleet call handler panicked", zap.String("kind", kind), zap.Int32("from", from),
				zap.Any("panic", r), zap.Stack("stack"))
			resp, err = nil, fmt.Errorf("handler panicked: %v", r)
		}
	}()
	resp, err = h(ctx, from, body)
	if err != nil && err.Error() == "" {
		err = errors.New("error")
	}
	return resp, err
}

// onMessage is memberlist's NotifyMsg: it must not block memberlist, so a
// request is served on its own goroutine, at most as many at once as its
// lane has slots; one beyond is answered busy, never dropped unanswered
// (its caller would wait to its deadline, a switch's hold with writes
// held).
func (f *Fleet) onMessage(b []byte) {
	if !f.up.Load() {
		return
	}
	m, err := decodeMessage(b)
	if err != nil {
		f.log.Debug("dropped an unreadable fleet message", zap.Error(err))
		return
	}
	switch m.typ {
	case msgHeartbeat:
		f.heard(m.from)
	case msgLeaving:
		f.leaving(m.from)
	case msgResponse, msgExpired, msgBusy:
		f.pendMu.Lock()
		p, ok := f.pending[m.id]
		f.pendMu.Unlock()
		if ok && p.to == m.from {
			select {
			case p.ch <- m:
			default:
			}
		}
	case msgRequest:
		sem, label := f.lane(m.kind)
		select {
		case sem <- struct{}{}:
		default:
			f.metrics.busy.WithLabelValues(label).Inc()
			f.log.Debug("too many fleet calls in progress: answered one busy", zap.Int32("from", m.from), zap.String("kind", label))
			busy := message{typ: msgBusy, id: m.id, from: f.id, err: fmt.Sprintf("member %d has %d calls of this lane in progress", f.id, cap(sem))}
			f.goServing(func() { f.answer(m, busy) })
			return
		}
		if !f.goServing(func() { f.serve(m, sem) }) {
			<-sem
		}
	}
}

// goServing runs fn on a goroutine Close waits for, unless the fleet is
// closed (false).
func (f *Fleet) goServing(fn func()) bool {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return false
	}
	f.serving.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.serving.Done()
		fn()
	}()
	return true
}

// answer sends resp to req's caller.
func (f *Fleet) answer(req, resp message) {
	node, ok := f.member(req.from)
	if !ok {
		f.log.Warn("cannot answer a fleet call: the caller is not a live member", zap.Int32("from", req.from), zap.String("kind", req.kind))
		return
	}
	if err := f.ml.SendReliable(&node, resp.encode()); err != nil {
		f.log.Warn("cannot answer a fleet call", zap.Int32("from", req.from), zap.String("kind", req.kind), zap.Error(err))
	}
}

func (f *Fleet) serve(req message, sem chan struct{}) {
	defer func() { <-sem }()
	ctx := f.ctx
	if req.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.timeout)*time.Millisecond)
		defer cancel()
	}
	resp := message{typ: msgResponse, id: req.id, from: f.id}
	body, err := f.runHandler(ctx, req.from, req.kind, req.body)
	if f.ctx.Err() != nil {
		return // this member is leaving: its callers see it go
	}
	if err != nil {
		resp.err = err.Error()
		if ctx.Err() != nil {
			// The caller's deadline ended the handler: to the caller that
			// is a timeout, not a refusal.
			resp.typ = msgExpired
		}
	} else {
		resp.body = body
	}
	f.answer(req, resp)
}

func randomID() uint64 {
	// Request IDs start at random, so that a response to a call made
	// before a restart does not match one made after.
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// message is a request or its response, carried as a memberlist user
// message: version, type, ID, sender, kind, timeout (ms, 0 for none),
// error, then the body to the end.
type message struct {
	typ     byte
	id      uint64
	from    int32
	kind    string
	timeout int64
	err     string
	body    []byte
}

const (
	wireVersion  = 1
	msgRequest   = 1
	msgResponse  = 2
	msgExpired   = 3 // a response: the caller's deadline ended the handler
	msgBusy      = 4 // a response: the call's lane was full, nothing ran
	msgHeartbeat = 5 // not a call: the sender is alive (liveness.go)
	msgLeaving   = 6 // not a call: the sender leaves the fleet on purpose
)

func (m *message) encode() []byte {
	b := make([]byte, 0, 2+3*binary.MaxVarintLen64+2*binary.MaxVarintLen32+len(m.kind)+len(m.err)+len(m.body))
	b = append(b, wireVersion, m.typ)
	b = binary.AppendUvarint(b, m.id)
	b = binary.AppendVarint(b, int64(m.from))
	b = binary.AppendUvarint(b, uint64(len(m.kind)))
	b = append(b, m.kind...)
	b = binary.AppendVarint(b, m.timeout)
	b = binary.AppendUvarint(b, uint64(len(m.err)))
	b = append(b, m.err...)
	return append(b, m.body...)
}

var errShort = errors.New("truncated")

func decodeMessage(b []byte) (message, error) {
	var m message
	if len(b) < 2 {
		return m, errShort
	}
	if b[0] != wireVersion {
		return m, fmt.Errorf("unknown version %d", b[0])
	}
	m.typ = b[1]
	if m.typ < msgRequest || m.typ > msgLeaving {
		return m, fmt.Errorf("unknown type %d", m.typ)
	}
	b = b[2:]
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errShort
		}
		b = b[n:]
		return v, nil
	}
	sv := func() (int64, error) {
		v, n := binary.Varint(b)
		if n <= 0 {
			return 0, errShort
		}
		b = b[n:]
		return v, nil
	}
	str := func(limit uint64) (string, error) {
		n, err := uv()
		if err != nil {
			return "", err
		}
		if n > limit || n > uint64(len(b)) {
			return "", fmt.Errorf("string of %d bytes", n)
		}
		s := string(b[:n])
		b = b[n:]
		return s, nil
	}
	var err error
	var from int64
	if m.id, err = uv(); err != nil {
		return m, err
	}
	if from, err = sv(); err != nil {
		return m, err
	}
	if from < 0 || from > 1<<31-1 {
		return m, fmt.Errorf("sender %d", from)
	}
	m.from = int32(from)
	if m.kind, err = str(maxKindLen); err != nil {
		return m, err
	}
	if m.timeout, err = sv(); err != nil {
		return m, err
	}
	if m.err, err = str(uint64(len(b))); err != nil {
		return m, err
	}
	m.body = append([]byte(nil), b...)
	return m, nil
}
