package upstream

// Memory budgets. Every client request frame Ferry reads and every broker
// answer it reads whole is held until the answer is written to the client;
// a client that sends large requests quickly, or does not read its
// answers, would otherwise make Ferry hold as much as it likes. The bytes
// held are counted per client connection and per process (Server), the
// latter like Kafka's queued.max.request.bytes: while either count is at or over its
// budget, Ferry stops reading the client's requests (so none of its further
// requests go upstream) and stops reading upstream answers ahead of what the
// client has taken. Nothing is refused or closed for a budget: the frame
// that crosses a budget is admitted whole (its size is known before its
// bytes are read), so the bytes held may exceed a budget by one frame, and
// a frame larger than a whole budget is read once the budget has any room.
//
// One answer is always read: the one the connection's writer is waiting
// for (pending.want). Its connection's other answers, read ahead, may fill
// the budget while it is slow, and refusing it would leave the writer, and
// so the budget, stuck forever.
//
// A connection that has not authenticated yet, on a listener with SASL, is
// charged to its own count only, never to the process's: it is read while
// it holds less than the pre-authentication frame bound (proxy's preauth.go), so
// anybody who can reach the port cannot take what authenticated clients
// need.
//
// The charge travels with the buffer: admit records which connection a
// frame buffer is charged to, and returning the buffer to its pool
// (framePool.Put) releases it, wherever in the request's life that happens.

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/bytebufferpool"
)

// Default budgets: a max-size request (100 MiB) fits a connection's
// budget, and four of them fit the process's.
const (
	DefaultConnBufferBudget    = 128 << 20
	DefaultProcessBufferBudget = 512 << 20
	// MinBufferBudget is the smallest budget: less would pause clients
	// at every request.
	MinBufferBudget = 64 << 10
)

// memMu guards every budget's counts and the charges of every frame
// buffer; a charge is taken once per frame, so one lock is cheap enough.
var memMu sync.Mutex

// charges maps each buffer that holds budget to what it holds.
var charges = map[*bytebufferpool.ByteBuffer]charge{}

type charge struct {
	cm *ConnMem
	n  int64
	// shared: counted in the process's budget too (not before
	// authentication).
	shared bool
}

// memBudget is one process's (Server's) budget.
type Budget struct {
	limit, connLimit int64
	gauge            prometheus.Gauge   // bytes held
	pauses           prometheus.Counter // reads paused for a budget

	used    int64         // under memMu
	wake    chan struct{} // closed when bytes are released; nil when nobody waits
	waiters atomic.Int32  // goroutines waiting for this budget
}

// newMemBudget is a process's budget of limit bytes, connLimit per
// connection; gauge shows the bytes held, pauses counts the reads paused.
func NewBudget(limit, connLimit int64, gauge prometheus.Gauge, pauses prometheus.Counter) *Budget {
	return &Budget{limit: limit, connLimit: connLimit, gauge: gauge, pauses: pauses}
}

// connMem is one client connection's share of a budget.
type ConnMem struct {
	b      *Budget
	used   int64 // under memMu
	closed bool  // under memMu
	// preauth, while not 0, is the connection's own bound before it
	// authenticates; its charges are not the process's (under memMu).
	preauth int64
	bufs    map[*bytebufferpool.ByteBuffer]struct{}
}

// conn is a new connection's share; preauth is its bound until it
// authenticates (0: it needs no authentication).
func (b *Budget) Conn(preauth int64) *ConnMem {
	return &ConnMem{b: b, preauth: preauth, bufs: map[*bytebufferpool.ByteBuffer]struct{}{}}
}

// authenticated charges the connection's next frames to the process's
// budget too.
func (cm *ConnMem) Authenticated() {
	memMu.Lock()
	cm.preauth = 0
	memMu.Unlock()
}

// roomLocked reports whether the connection and the process are both under
// their budgets; before authentication, whether the connection is under
// its own bound.
func (cm *ConnMem) roomLocked() bool {
	if cm.preauth > 0 {
		return cm.used < cm.preauth
	}
	return cm.used < cm.b.connLimit && cm.b.used < cm.b.limit
}

// chargeLocked charges buf's n bytes to the connection.
func (cm *ConnMem) chargeLocked(buf *bytebufferpool.ByteBuffer, n int64) {
	if old, ok := charges[buf]; ok { // a buffer charged twice: keep one
		old.cm.dropLocked(buf, old)
	}
	c := charge{cm: cm, n: n, shared: cm.preauth == 0}
	charges[buf] = c
	cm.bufs[buf] = struct{}{}
	cm.used += n
	if c.shared {
		cm.b.used += n
		cm.b.gauge.Set(float64(cm.b.used))
	}
}

func (cm *ConnMem) dropLocked(buf *bytebufferpool.ByteBuffer, c charge) {
	delete(charges, buf)
	delete(cm.bufs, buf)
	cm.used -= c.n
	if c.shared {
		cm.b.used -= c.n
		cm.b.gauge.Set(float64(cm.b.used))
	}
	if cm.b.wake != nil {
		close(cm.b.wake)
		cm.b.wake = nil
	}
}

// waitLocked returns a channel closed at the next release; the caller
// counted itself in b.waiters first.
func (b *Budget) waitLocked() <-chan struct{} {
	if b.wake == nil {
		b.wake = make(chan struct{})
	}
	return b.wake
}

// heldCharge is what buf holds once it holds a frame of n bytes: its
// capacity when that is more (a pooled buffer a large frame used before),
// since the charge must count the memory held. The buffer is kept, not
// traded for one of the frame's size: a pool serving small and large
// frames alike would otherwise allocate anew for most of them.
func heldCharge(buf *bytebufferpool.ByteBuffer, n int) int64 {
	return int64(max(n, cap(buf.B)))
}

// admit waits until the connection and the process are under their
// budgets, then charges buf with a request frame of n bytes (heldCharge),
// and reports whether it waited: the reader goroutine calls it between a
// frame's size and its body, so a client over budget is not read.
func (cm *ConnMem) Admit(ctx context.Context, buf *bytebufferpool.ByteBuffer, n int) (waited bool, err error) {
	b := cm.b
	size := heldCharge(buf, n)
	memMu.Lock()
	if cm.admitLocked(buf, size) {
		memMu.Unlock()
		return false, nil
	}
	b.pauses.Inc()
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	for {
		wake := b.waitLocked()
		memMu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return true, ctx.Err()
		}
		memMu.Lock()
		if cm.admitLocked(buf, size) {
			memMu.Unlock()
			return true, nil
		}
	}
}

// admitLocked reports whether Admit's reader may go on now, charging buf
// size bytes when the connection is under its budgets; a closed connection
// goes on uncharged (its reader finds it closed).
func (cm *ConnMem) admitLocked(buf *bytebufferpool.ByteBuffer, size int64) bool {
	switch {
	case cm.closed:
		return true
	case cm.roomLocked():
		cm.chargeLocked(buf, size)
		return true
	}
	return false
}

// admitAnswer waits until an upstream answer of n bytes for p may be read
// into buf, and charges it (heldCharge): when the connection and the
// process are under their budgets, or when the client's writer waits for
// it. It returns false when the answer is not wanted any more (abandoned,
// or its client connection closed: read past it) or dead closes.
func (cm *ConnMem) AdmitAnswer(p *Pending, buf *bytebufferpool.ByteBuffer, n int, dead <-chan struct{}) bool {
	b := cm.b
	size := heldCharge(buf, n)
	// Counted before looking at want and abandon, which are set without
	// the lock (wakeWaiters).
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	memMu.Lock()
	paused := false
	for {
		switch {
		case cm.closed || p.state.Load() == pendingAbandoned:
			memMu.Unlock()
			return false
		case cm.roomLocked() || p.wanted.Load():
			cm.chargeLocked(buf, size)
			memMu.Unlock()
			return true
		}
		if !paused {
			paused = true
			b.pauses.Inc()
		}
		wake := b.waitLocked()
		memMu.Unlock()
		select {
		case <-wake:
		case <-dead:
			return false
		}
		memMu.Lock()
	}
}

// close releases everything the connection still holds; later charges and
// releases of its buffers do nothing. Called once its reader and writer
// have ended.
func (cm *ConnMem) Close() {
	memMu.Lock()
	defer memMu.Unlock()
	for buf := range cm.bufs {
		cm.dropLocked(buf, charges[buf])
	}
	cm.closed = true
	if cm.b.wake != nil { // its answers' readers read past them now
		close(cm.b.wake)
		cm.b.wake = nil
	}
}

// releaseBuf releases what buf holds, if anything.
func ReleaseBuf(buf *bytebufferpool.ByteBuffer) {
	memMu.Lock()
	if c, ok := charges[buf]; ok {
		c.cm.dropLocked(buf, c)
	}
	memMu.Unlock()
}

// want marks p as waited for by the client's writer: its answer is read
// whatever the budgets hold.
func (p *Pending) Want() {
	if p.Mem == nil || p.wanted.Load() {
		return
	}
	p.wanted.Store(true)
	p.Mem.b.wakeWaiters()
}

// abandon says p's answer will never be taken (a fetch part answered
// without it): it is read past rather than held, or, if already read,
// released.
func (p *Pending) Abandon() {
	if p.state.CompareAndSwap(pendingWaiting, pendingAbandoned) {
		if p.Mem != nil {
			p.Mem.b.wakeWaiters()
		}
		return
	}
	if p.state.Load() == pendingDelivered { // nobody will put it back
		ResponseBufs.Put(p.Buf)
	}
}

// wakeWaiters wakes the goroutines waiting for this budget to look again.
// The atomic count spares the lock when nobody waits (the usual case): a
// waiter counts itself before it looks, so it either sees what changed or
// is counted here.
func (b *Budget) wakeWaiters() {
	if b.waiters.Load() == 0 {
		return
	}
	memMu.Lock()
	if b.wake != nil {
		close(b.wake)
		b.wake = nil
	}
	memMu.Unlock()
}

// WrapGauge replaces the gauge that shows the bytes held with f of it:
// tests watch the peak with it.
func (b *Budget) WrapGauge(f func(prometheus.Gauge) prometheus.Gauge) {
	memMu.Lock()
	defer memMu.Unlock()
	b.gauge = f(b.gauge)
}
