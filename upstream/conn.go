package upstream

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/internal/splice"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
)

// errUpstreamClosed fails requests in flight on an upstream connection that
// closed; their outcome is unknown.
var ErrClosed = errors.New("upstream connection closed")

// errLeaseLapsed fails a write whose member's write lease lapsed after the
// write passed the hold (hold.go) and before it was sent: between the two
// the member may have looked up metadata or opened a connection, or been
// paused, and a switch may have flipped meanwhile. The client gets its
// API's retriable error and sends the write again, through the hold.
var ErrLeaseLapsed = errors.New("the member's write lease lapsed before the write was sent")

// errClientClosed fails requests in flight on an upstream connection that
// Ferry closed because their client's connection ended (the client closed
// it, or Ferry did after a bad request) while they waited upstream, such
// as a JoinGroup parked in a rebalance: nobody is left to answer, and the
// broker did nothing wrong.
var ErrClientClosed = errors.New("client connection closed while the request waited upstream")

// brokerPool bounds and reuses the raw connections to one physical broker.
// Client connections check them out while they have requests in flight
// (proxy/upstream_conns.go); given back, a healthy quiet connection waits
// idle for the next checkout.
type brokerPool struct {
	u      *Cluster
	broker int32
	addr   string
	// sec is how its connections authenticate: the cluster's service
	// identity, or a mapped principal's credentials (package proxy's principals.go).
	sec       *clusterauth.Security
	principal string // the mapped principal, "" for the service identity

	mu       sync.Mutex
	idle     []idleConn // oldest first
	open     int
	retiring []*Conn // past their session's deadline with requests in flight: closed once quiet (retire)
	closed   bool
	freed    chan struct{} // closed and replaced when a connection is given back
	failedAt time.Time     // last dial failure, for backoff
	backoff  time.Duration
}

type idleConn struct {
	c     *Conn
	since time.Time
}

func newBrokerPool(u *Cluster, broker int32, addr string, ident int32) *brokerPool {
	p := &brokerPool{u: u, broker: broker, addr: addr, sec: u.Security, freed: make(chan struct{})}
	if ident > 0 {
		p.sec = u.Idents[ident]
		if u.Names != nil {
			p.principal = u.Names[ident]
		}
	}
	return p
}

// unreachableError is a broker that could not be connected to: refused,
// timed out, or in backoff after either.
type UnreachableError struct {
	Broker int32
	addr   string
	err    error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("broker %d (%s): %v", e.Broker, e.addr, e.err)
}

func (e *UnreachableError) Unwrap() error { return e.err }

// errPoolFull is returned when every connection to a broker that the
// configuration allows is checked out and none came back in time.
var errPoolFull = errors.New("upstream connections at the configured maximum")

// get checks out a connection: an idle one, or a new one within the bound. At
// the bound it waits up to poolWait for one to come back. The answers it
// reads for the lessee are charged to mem.
func (p *brokerPool) Get(ctx context.Context, mem *ConnMem) (*Conn, error) {
	var timeout <-chan time.Time
	for {
		p.mu.Lock()
		for len(p.idle) > 0 {
			c := p.idle[len(p.idle)-1].c
			p.idle = p.idle[:len(p.idle)-1]
			if c.Alive() && !c.Renewing() {
				p.mu.Unlock()
				c.mem.Store(mem)
				return c, nil
			}
			c.Close(ErrClosed)
			p.open--
		}
		switch {
		case p.closed:
			p.mu.Unlock()
			return nil, ErrClosed
		case !p.failedAt.IsZero() && time.Since(p.failedAt) < p.backoff:
			p.mu.Unlock()
			return nil, &UnreachableError{p.broker, p.addr, errors.New("unreachable, retrying after backoff")}
		case p.open < p.u.opts.MaxConnsPerBroker:
			p.open++
			p.mu.Unlock()
			c, err := p.dial(ctx)
			if err == nil {
				c.mem.Store(mem)
			}
			return c, err
		}
		freed := p.freed
		p.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(poolWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-freed:
		case <-timeout:
			return nil, fmt.Errorf("broker %d: %w (%d)", p.broker, errPoolFull, p.u.opts.MaxConnsPerBroker)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// poolWait is how long a request waits for an upstream connection at the
// bound before it is answered with a retriable error.
const poolWait = 2 * time.Second

// dial opens a connection counted in p.open already: TCP, then TLS and
// SASL when the cluster has them (clusterauth). A connection that
// authenticated for a limited session (KIP-368) is replaced before the
// session ends (upConn.renewing).
func (p *brokerPool) dial(ctx context.Context) (*Conn, error) {
	d := net.Dialer{Timeout: p.u.opts.DialTimeout, KeepAlive: 30 * time.Second}
	nc, sess, err := p.sec.Dial(ctx, &d, p.addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.open--
		p.failedAt = time.Now()
		p.backoff = min(max(2*p.backoff, 100*time.Millisecond), 5*time.Second)
		p.wake()
		if clusterauth.AuthFailed(err) {
			p.u.authFails.note(p.u.Name, p.principal, p.broker, err)
			// Each failure is logged: the backoff bounds how often.
			if p.principal != "" {
				p.u.log.Error("upstream authentication failed", zap.Int32("broker", p.broker), zap.String("as_principal", p.principal), zap.Error(err))
			} else {
				p.u.log.Error("upstream authentication failed", zap.Int32("broker", p.broker), zap.Error(err))
			}
		}
		return nil, &UnreachableError{p.broker, p.addr, err}
	}
	if !p.failedAt.IsZero() {
		p.u.authFails.note(p.u.Name, p.principal, p.broker, nil)
	}
	p.failedAt, p.backoff = time.Time{}, 0
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := newUpConn(p, nc)
	c.renewAt, c.deadline = sess.RenewAt(), sess.Deadline()
	return c, nil
}

// retire takes a checked-out connection past its session's deadline out of use
// while requests are still in flight on it: it is closed once they are
// answered (reapIdle), and its client checks out another.
func (p *brokerPool) Retire(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.wake()
	if c.Quiet() || !c.Alive() || p.closed {
		p.open--
		c.Close(ErrClosed)
		return
	}
	p.retiring = append(p.retiring, c)
}

// wake tells waiters a connection may be had; p.mu is held.
func (p *brokerPool) wake() {
	close(p.freed)
	p.freed = make(chan struct{})
}

// put gives a checked-out connection back: kept idle if healthy and quiet,
// closed otherwise.
func (p *brokerPool) Put(c *Conn) { p.Release(c, ErrClosed) }

// release is put, failing what is still in flight on a connection it
// closes with why.
func (p *brokerPool) Release(c *Conn, why error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.wake()
	if !p.closed && c.Alive() && c.Quiet() && !c.Renewing() {
		p.idle = append(p.idle, idleConn{c, time.Now()})
		return
	}
	p.open--
	c.Close(why)
}

// reapIdle closes idle connections given back before cutoff, keeping the
// configured number warm, and returns how many are in use and idle.
func (p *brokerPool) reapIdle(cutoff time.Time) (inUse, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for n < len(p.idle)-p.u.opts.IdleConnsPerBroker && p.idle[n].since.Before(cutoff) {
		p.idle[n].c.Close(ErrClosed)
		n++
	}
	if n > 0 {
		p.open -= n
		p.idle = append(p.idle[:0], p.idle[n:]...)
	}
	// Sessions about to expire: idle ones are closed, retired ones once
	// their requests are answered.
	keep := p.idle[:0]
	for _, ic := range p.idle {
		if ic.c.Renewing() {
			ic.c.Close(ErrClosed)
			p.open--
			continue
		}
		keep = append(keep, ic)
	}
	p.idle = keep
	still := p.retiring[:0]
	for _, c := range p.retiring {
		if c.Quiet() || !c.Alive() {
			c.Close(ErrClosed)
			p.open--
			continue
		}
		still = append(still, c)
	}
	p.retiring = still
	return p.open - len(p.idle), len(p.idle)
}

func (p *brokerPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, ic := range p.idle {
		ic.c.Close(ErrClosed)
	}
	p.idle = nil
	for _, c := range p.retiring {
		c.Close(ErrClosed)
	}
	p.retiring = nil
	p.wake()
}

// upConn is one raw connection to a broker. Requests are written in the order
// send is called; responses are matched to them in order (Kafka answers each
// connection in order) and checked by correlation ID.
type Conn struct {
	Pool    *brokerPool
	NetConn net.Conn
	// br is what the reader reads answers through: a small answer (a
	// Produce's) and the size of the next arrive in one read(2). What it
	// read ahead of a streamed answer goes to the streamer (streamed.Prefix).
	br *bufio.Reader

	wmu  sync.Mutex // serialises writes and the queue order
	corr int32

	InFlight  chan *Pending
	streaming atomic.Bool             // a response is being streamed by its waiter
	answering atomic.Bool             // the reader holds an answer's request, perhaps waiting for budget
	mem       atomic.Pointer[ConnMem] // the lessee's budget, for the answers read
	// renewAt and deadline (zero: never) come from the SASL session's
	// lifetime (KIP-368): from renewAt the connection is not checked out again
	// and is closed once quiet, rather than re-authenticated in place;
	// after deadline its lessee sends nothing more on it (the broker
	// would close it at the first request past the session's end).
	renewAt, deadline time.Time
	dead              chan struct{}
	errOnce           sync.Once
	err               error
}

// pending is one request awaiting its response.
type Pending struct {
	corr int32
	Done chan struct{}
	Buf  *bytebufferpool.ByteBuffer // the response frame, header included
	Err  error
	// stream asks for a large response to be left on the connection
	// (st) for the waiter to stream to its client instead of read into buf.
	Stream   bool
	Streamed *streamed
	// mem is the budget the answer is charged to (nil: none); wanted says
	// the client's writer waits for it, state whether it was delivered or
	// abandoned (budget.go).
	Mem    *ConnMem
	wanted atomic.Bool
	state  atomic.Int32
	// notify is the function OnDone registered (notified once done).
	notify atomic.Pointer[func()]
}

// notified marks a Pending whose OnDone function has run, or whose
// completion came before any was registered.
var notified = new(func())

// OnDone registers f to run once p is answered or has failed, in the
// goroutine that completes it: the connection's reader, which reads
// nothing more until f returns, or the one failing the connection. It
// returns false, and f never runs, if p was done before.
func (p *Pending) OnDone(f func()) bool {
	return p.notify.CompareAndSwap(nil, &f)
}

// finished closes Done, then runs what OnDone registered.
func (p *Pending) finished() {
	close(p.Done)
	if f := p.notify.Swap(notified); f != nil && f != notified {
		(*f)()
	}
}

// pending.state values.
const (
	pendingWaiting int32 = iota
	pendingDelivered
	pendingAbandoned
)

// streamed is a response left on its connection after its correlation ID:
// the waiter reads its size bytes from the socket itself (splicing the
// records), then calls finish. Until then the connection reads nothing
// more.
type streamed struct {
	Conn *Conn
	Size int64
	// Prefix is the answer's first bytes after its correlation ID, read
	// ahead by the reader's buffer (fewer than answerReadAhead): the
	// streamer takes them before it reads the socket.
	Prefix []byte
	done   chan struct{}
}

// finish hands the connection back to its reader: after err, the
// response was not read to its end and the connection is closed.
func (st *streamed) Finish(err error) {
	if err != nil {
		st.Conn.Close(fmt.Errorf("broker %d: streaming a response: %w", st.Conn.Pool.broker, err))
	}
	close(st.done)
}

// streamMinBytes is the response size from which a streamable response is
// streamed: below it, reading it whole costs less than the extra system
// calls of streaming.
const StreamMinBytes = 128 << 10

// answerReadAhead is the reader's buffer: a Produce's answer whole, the
// heads of larger ones.
const answerReadAhead = 4 << 10

func newUpConn(p *brokerPool, nc net.Conn) *Conn {
	c := &Conn{Pool: p, NetConn: nc, br: bufio.NewReaderSize(nc, answerReadAhead), InFlight: make(chan *Pending, 256), dead: make(chan struct{})}
	go c.readLoop()
	return c
}

// renewing reports whether the connection's session is near its end: it
// is not checked out again, and takes no new request once quiet.
func (c *Conn) Renewing() bool { return !c.renewAt.IsZero() && time.Now().After(c.renewAt) }

// expired reports whether no request may be sent on it any more.
func (c *Conn) Expired() bool { return !c.deadline.IsZero() && time.Now().After(c.deadline) }

func (c *Conn) Alive() bool {
	select {
	case <-c.dead:
		return false
	default:
		return true
	}
}

// quiet reports whether nothing is in flight: no request waiting for its
// answer, none being answered (an answer may wait for its client's budget
// after its request left inflight), none being streamed.
func (c *Conn) Quiet() bool {
	return len(c.InFlight) == 0 && !c.answering.Load() && !c.streaming.Load()
}

// sendFrame writes one request frame (without its size prefix; its
// correlation ID is overwritten with this connection's own). With
// expectResponse false (a Produce with acks=0) nothing is awaited and the
// returned pending is nil. With stream, a large response is left on the
// connection for the waiter to stream (pending.st). A frame sent under a
// gate (a write under the member's write lease) goes only if the gate is
// open at the last moment it can still be held back: once its pending
// answer is queued it must be written. Until then it may wait (for the
// connection's lock, for room in flight), and the gate is asked again
// after each wait. The gate says how long the lease has left, and the
// frame's write gets no longer: a member paused (SIGSTOP) between the last
// check and the write, past the lease, and woken after a switch flipped
// meanwhile must not write to the old cluster then (the fleet test with a
// paused member: a produce written there after the flip, the mirror of the
// new direction halted diverged). The write fails, the connection closes,
// and the client gets a retriable error. What remains is a pause inside
// the write system call's own few instructions.
func (c *Conn) SendFrame(frame []byte, expectResponse, stream bool, gate func() time.Duration) (*Pending, error) {
	return c.send(frame, nil, nil, expectResponse, stream, gate)
}

// Spliceable reports whether SendSpliced can move bytes to this
// connection's socket (plain TCP, not TLS).
func (c *Conn) Spliceable() bool {
	_, ok := c.NetConn.(*net.TCPConn)
	return ok
}

// SendSpliced is SendFrame for a frame whose holes are held by pipe, in
// order: the frame's bytes around them are written from frame, theirs
// moved from the pipe (splice(2)). The connection must be Spliceable.
// The pipe is empty after a write that did not fail.
func (c *Conn) SendSpliced(frame []byte, holes []protocol.Hole, pipe *splice.Pipe, expectResponse bool, gate func() time.Duration) (*Pending, error) {
	return c.send(frame, holes, pipe, expectResponse, false, gate)
}

func (c *Conn) send(frame []byte, holes []protocol.Hole, pipe *splice.Pipe, expectResponse, stream bool, gate func() time.Duration) (*Pending, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.Alive() {
		return nil, c.err
	}
	var p *Pending
	left := upstreamWriteTimeout // without a gate
	if expectResponse {
		p = &Pending{corr: c.corr + 1, Done: make(chan struct{}), Stream: stream, Mem: c.mem.Load()}
		var err error
		if left, err = c.queue(p, gate); err != nil {
			return nil, err
		}
	} else if gate != nil {
		if left = gate(); left <= 0 {
			return nil, ErrLeaseLapsed
		}
	}
	c.corr++
	protocol.SetCorrelationID(frame, c.corr)
	var size [4]byte
	binary.BigEndian.PutUint32(size[:], uint32(len(frame)))
	bufs := net.Buffers{size[:], frame}
	c.NetConn.SetWriteDeadline(time.Now().Add(min(left, upstreamWriteTimeout)))
	if TestHookBeforeWrite != nil {
		TestHookBeforeWrite(gate != nil)
	}
	var err error
	if pipe == nil {
		_, err = bufs.WriteTo(c.NetConn)
	} else {
		err = writeSpliced(c.NetConn.(*net.TCPConn), size[:], frame, holes, pipe)
	}
	if err != nil {
		c.Close(fmt.Errorf("broker %d: write: %w", c.Pool.broker, err))
		return nil, c.err
	}
	return p, nil
}

// writeSpliced writes the size prefix and the frame with each hole of the
// frame moved from pipe. (Marking each piece as followed by more, MSG_MORE
// and SPLICE_F_MORE, measured no different on loopback: not done.)
func writeSpliced(nc *net.TCPConn, size, frame []byte, holes []protocol.Hole, pipe *splice.Pipe) error {
	rc, err := nc.SyscallConn()
	if err != nil {
		return err
	}
	at := 0
	for _, h := range holes {
		bufs := net.Buffers{size, frame[at:h.Off]}
		if _, err := bufs.WriteTo(nc); err != nil {
			return err
		}
		if _, err := pipe.To(rc, h.Len); err != nil {
			return err
		}
		size, at = nil, h.Off+h.Len
	}
	bufs := net.Buffers{size, frame[at:]}
	_, err = bufs.WriteTo(nc)
	return err
}

// gatePoll is how often a gated frame waiting for room in flight asks its
// gate again.
const gatePoll = time.Millisecond

// upstreamWriteTimeout bounds the write of one frame upstream.
const upstreamWriteTimeout = 30 * time.Second

// testHookBeforeUpstreamWrite, if set, runs just before a frame is written
// upstream, told whether it is a write under the lease (tests pause the
// member there).
var TestHookBeforeWrite func(gated bool)

// queue puts p among the answers awaited. Under a gate, only while the gate
// is open when p goes in (it returns what the gate said was left then,
// upstreamWriteTimeout without one): a full queue is waited on gatePoll at
// a time, asking the gate again before each try.
func (c *Conn) queue(p *Pending, gate func() time.Duration) (time.Duration, error) {
	if gate == nil {
		select {
		case c.InFlight <- p:
			return upstreamWriteTimeout, nil
		case <-c.dead:
			return 0, c.err
		}
	}
	for {
		left := gate()
		if left <= 0 {
			return 0, ErrLeaseLapsed
		}
		select {
		case c.InFlight <- p:
			return left, nil
		case <-c.dead:
			return 0, c.err
		default:
		}
		select {
		case <-c.dead:
			return 0, c.err
		case <-time.After(gatePoll):
		}
	}
}

func (c *Conn) readLoop() {
	max := c.Pool.u.opts.MaxResponseSize
	var head [8]byte // size, correlation ID
	for {
		_, err := io.ReadFull(c.br, head[:])
		size := int32(binary.BigEndian.Uint32(head[:]))
		switch {
		case err != nil:
		case size < 4:
			err = fmt.Errorf("%w: response of %d bytes", protocol.ErrMalformedFrame, size)
		case size > max:
			err = fmt.Errorf("%w: %d > %d bytes", protocol.ErrFrameTooLarge, size, max)
		}
		if err != nil {
			c.Close(fmt.Errorf("broker %d: read: %w", c.Pool.broker, err))
			return
		}
		// Before its request leaves inflight: the connection is never
		// seen quiet while an answer is being read (quiet).
		c.answering.Store(true)
		var p *Pending
		select {
		case p = <-c.InFlight:
		default:
			c.Close(fmt.Errorf("broker %d: response with no request in flight", c.Pool.broker))
			return
		}
		if got := int32(binary.BigEndian.Uint32(head[4:])); got != p.corr {
			c.fail(p, nil)
			c.Close(fmt.Errorf("broker %d: response correlation ID %d, expected %d", c.Pool.broker, got, p.corr))
			return
		}
		if p.Stream && size >= StreamMinBytes {
			// What the buffer holds is this answer's: it is larger.
			prefix, _ := c.br.Peek(c.br.Buffered())
			st := &streamed{Conn: c, Size: int64(size) - 4, Prefix: prefix, done: make(chan struct{})}
			c.streaming.Store(true)
			c.answering.Store(false)
			p.Streamed = st
			p.finished()
			select {
			case <-st.done:
				c.br.Discard(len(prefix))
				c.streaming.Store(false)
				continue
			case <-c.dead:
				return
			}
		}
		// Held until its client takes it: not read ahead of a client
		// over its budget (budget.go), but for what the reader's buffer
		// holds (answerReadAhead a connection, not charged).
		buf := ResponseBufs.Get()
		ResponseBufs.Fit(buf, int(size))
		if p.Mem != nil && !p.Mem.AdmitAnswer(p, buf, int(size), c.dead) {
			ResponseBufs.Put(buf)
			if !c.Alive() {
				c.fail(p, nil)
				return
			}
			// Nobody takes this answer: read past it.
			if err := c.skip(int64(size) - 4); err != nil {
				c.fail(p, nil)
				c.Close(fmt.Errorf("broker %d: read: %w", c.Pool.broker, err))
				return
			}
			c.fail(p, ErrClosed)
			c.answering.Store(false)
			continue
		}
		if cap(buf.B) < int(size) {
			buf.B = make([]byte, size) // exactly: large buffers are not pooled
		}
		buf.B = buf.B[:size]
		copy(buf.B, head[4:])
		if _, err := io.ReadFull(c.br, buf.B[4:]); err != nil {
			ResponseBufs.Put(buf)
			c.fail(p, nil)
			c.Close(fmt.Errorf("broker %d: read: %w", c.Pool.broker, err))
			return
		}
		p.Buf = buf
		if !p.state.CompareAndSwap(pendingWaiting, pendingDelivered) {
			ResponseBufs.Put(buf) // abandoned while it was read
			p.Buf = nil
		}
		// Not quiet until what OnDone registered returns: it may write
		// to a slow client, and the connection must not be given back
		// and checked out to another client meanwhile, whose answers it
		// would not read.
		p.finished()
		c.answering.Store(false)
	}
}

// skip reads past the next n bytes of the connection.
func (c *Conn) skip(n int64) error {
	buffered := min(int64(c.br.Buffered()), n)
	c.br.Discard(int(buffered))
	_, err := io.CopyN(io.Discard, c.NetConn, n-buffered)
	return err
}

func (c *Conn) fail(p *Pending, err error) {
	if err == nil {
		err = ErrClosed
		if !c.Alive() { // closed by Ferry: say why
			err = c.err
		}
	}
	p.Err = err
	p.finished()
}

// close marks the connection dead, closes the socket and fails every request
// in flight. Safe to call more than once.
func (c *Conn) Close(err error) {
	c.errOnce.Do(func() {
		c.err = err
		close(c.dead)
		c.NetConn.Close()
		if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrClientClosed) {
			c.Pool.u.log.Info("upstream connection closed", zap.Int32("broker", c.Pool.broker), zap.Error(err))
		}
		go func() {
			// The reader may still be delivering; take what it left.
			c.wmu.Lock()
			defer c.wmu.Unlock()
			for {
				select {
				case p := <-c.InFlight:
					c.fail(p, err)
				default:
					return
				}
			}
		}()
	})
}

// wait blocks until the response arrives or ctx ends.
func (p *Pending) Wait(ctx context.Context) (*bytebufferpool.ByteBuffer, error) {
	p.Want()
	select {
	case <-p.Done:
		return p.Buf, p.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
