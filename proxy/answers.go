package proxy

// The order a connection's answers are written in, and who writes them.
//
// A client reads its answers in the order it sent the requests. The
// connection's writer goroutine writes them, waiting for each in turn. A
// Produce whose answer is one broker's (every partition led by one broker,
// the common case with lanes) is written instead by the goroutine that
// read that answer from the broker, when it is next in line: handed to the
// writer, each produce answer woke a second goroutine, usually on a second
// thread, and that wake-up cost about as much CPU as the rest of Ferry's
// work on the request (a relay that copies bytes makes none). Measured in
// the README ("Measured", the produce path's cost).
//
// One goroutine at a time holds the write role: the writer, or a broker
// connection's reader writing answers that came in order. The holder
// writes every answer it may take, flushes, and lets the role go only when
// the next answer is not its to write; so no answer overtakes another, and
// nothing written by one holder is still buffered when the next writes.
// When the role is free, the answer next in line is always one still
// awaited from its broker (its arrival takes the role), or there is none.
//
// A broker connection's reader that writes to a slow client waits as the
// writer would have (the write timeout); meanwhile that connection reads
// no further answers, all of them this client's: a connection in use is
// checked out to one client (upstream_conns.go).

import (
	"bufio"
	"sync"
	"time"
)

type answerQueue struct {
	mu     sync.Mutex
	q      []*reply // queued, oldest first
	base   []*reply // q's first backing array, which q starts over in once empty
	held   bool     // the write role is held
	closed bool     // the reader stopped: the writer takes whatever is next
	failed bool     // a write failed: queued answers are dropped
	// wake gives the writer goroutine the role (at most one is pending:
	// only a goroutine taking the free role sends).
	wake chan struct{}
	// space is signalled when an answer leaves the queue, for a reader
	// waiting on a full one.
	space chan struct{}
}

func newAnswerQueue() answerQueue {
	return answerQueue{wake: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

// push queues r, waiting while maxPipelined answers are queued; false if
// the connection closed first. A Produce answered by one broker (direct)
// is then watched for: its arrival may write it.
func (c *clientConn) push(r *reply) bool {
	a := &c.answers
	a.mu.Lock()
	for len(a.q) >= maxPipelined && !a.failed {
		a.mu.Unlock()
		select {
		case <-a.space:
		case <-c.ctx.Done():
			return false
		}
		a.mu.Lock()
	}
	if a.failed {
		a.mu.Unlock()
		c.dropReply(r)
		return true
	}
	if a.base == nil {
		a.base = make([]*reply, 0, 8)
		a.q = a.base
	}
	a.q = append(a.q, r)
	give := !a.held && c.writerTakes(a.q[0])
	if give {
		a.held = true
	}
	a.mu.Unlock()
	if give {
		a.wake <- struct{}{}
	}
	if p := r.direct; p != nil {
		// Read whatever the budgets hold, as the writer's wait for it
		// would: the answer frees what the request holds.
		p.Want()
		if !p.OnDone(func() { c.arrived(r, true) }) {
			c.arrived(r, false)
		}
	}
	return true
}

// closeAnswers says no more answers will be queued: the writer writes what
// is left, waiting for each, and then returns.
func (c *clientConn) closeAnswers() {
	a := &c.answers
	a.mu.Lock()
	a.closed = true
	give := !a.held
	a.held = true
	a.mu.Unlock()
	if give {
		a.wake <- struct{}{}
	}
}

// writerTakes says whether the writer goroutine may write h now.
// Called with the queue's lock held.
func (c *clientConn) writerTakes(h *reply) bool {
	return h.direct == nil || h.ready || c.answers.closed || c.forcedAway(h.req.state.Generation)
}

// readerTakes says whether the goroutine that read h's answer from its
// broker may write it. Called with the queue's lock held.
func (c *clientConn) readerTakes(h *reply) bool {
	return h.direct != nil && h.ready && h.direct.Err == nil && !c.answers.closed
}

// holderTakes says whether the role's holder may write h now: a broker
// connection's reader (inReader) or the writer. Called with the queue's
// lock held.
func (c *clientConn) holderTakes(h *reply, inReader bool) bool {
	if inReader {
		return c.readerTakes(h)
	}
	return c.writerTakes(h)
}

// arrived is called once r's broker answer is in (or failed): inReader,
// in the goroutine that read it. If r is next in line and the role is
// free, that goroutine writes it (and whatever follows it in order), or
// the writer is woken for it.
func (c *clientConn) arrived(r *reply, inReader bool) {
	a := &c.answers
	a.mu.Lock()
	r.ready = true
	if a.held || len(a.q) == 0 || a.q[0] != r {
		a.mu.Unlock()
		return
	}
	a.held = true
	direct := inReader && c.readerTakes(r)
	a.mu.Unlock()
	if !direct {
		a.wake <- struct{}{}
		return
	}
	c.writeHeld(true)
}

// kickAnswers wakes the writer for an answer next in line that it may now
// write without waiting (its write's generation was left by a forced
// switch, forced_wait.go).
func (c *clientConn) kickAnswers() {
	a := &c.answers
	a.mu.Lock()
	give := !a.held && len(a.q) > 0 && c.writerTakes(a.q[0])
	if give {
		a.held = true
	}
	a.mu.Unlock()
	if give {
		a.wake <- struct{}{}
	}
}

// take returns the next answer the role's holder may write (inReader: a
// broker connection's reader), or nil.
func (c *clientConn) take(inReader bool) *reply {
	a := &c.answers
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.q) == 0 {
		return nil
	}
	h := a.q[0]
	if !c.holderTakes(h, inReader) {
		return nil
	}
	a.q[0] = nil
	a.q = a.q[1:]
	if len(a.q) == 0 {
		a.q = a.base[:0]
	}
	select {
	case a.space <- struct{}{}:
	default:
	}
	return h
}

// release lets the role go once take found nothing, unless something
// became the holder's to write meanwhile (false: take again). A reader
// passes the role to the writer when the next answer is the writer's, or
// the queue closed (the writer returns once it has the role then).
func (c *clientConn) release(inReader bool) bool {
	a := &c.answers
	a.mu.Lock()
	if len(a.q) > 0 && c.holderTakes(a.q[0], inReader) {
		a.mu.Unlock()
		return false
	}
	pass := inReader && (a.closed || len(a.q) > 0 && c.writerTakes(a.q[0]))
	a.held = pass
	a.mu.Unlock()
	if pass {
		a.wake <- struct{}{}
	}
	return true
}

// writeHeld writes answers while this goroutine holds the role, flushing
// before it lets the role go.
func (c *clientConn) writeHeld(inReader bool) {
	var bw *bufio.Writer // nil while nothing is being written
	for {
		r := c.take(inReader)
		if r == nil {
			if bw != nil {
				err := bw.Flush()
				putReplyWriter(bw)
				bw = nil
				if err != nil {
					c.writeFailed(err)
				} else {
					c.releaseQuiet()
				}
				continue // more may have become ours while flushing
			}
			if c.release(inReader) {
				return
			}
			continue
		}
		if bw == nil {
			bw = replyWriters.Get().(*bufio.Writer)
			bw.Reset(c.nc)
		}
		c.nc.SetWriteDeadline(time.Now().Add(c.s.settings.Load().WriteTimeout))
		n, err := c.write(r, bw)
		if c.stats != nil && n > 0 {
			c.stats.Answer(n, time.Since(r.req.start))
		}
		c.s.writeDone(r.req)
		c.replied()
		putRequest(r.req)
		c.s.metrics.bytesOut.Add(float64(n))
		if err != nil {
			putReplyWriter(bw)
			bw = nil
			c.writeFailed(err)
		}
	}
}

// writeFailed closes the connection after a failed write and drops what
// is queued, and whatever the reader still queues, so the reader never
// waits on a dead connection.
func (c *clientConn) writeFailed(err error) {
	c.close(err)
	a := &c.answers
	a.mu.Lock()
	a.failed = true
	q := a.q
	a.q = nil
	a.mu.Unlock()
	select {
	case a.space <- struct{}{}:
	default:
	}
	for _, r := range q {
		c.dropReply(r)
	}
}

// dropReply lets go of an answer that will never be written.
func (c *clientConn) dropReply(r *reply) {
	if r.abandon != nil {
		r.abandon()
	}
	c.s.settleFirsts(r.req, nil)
	c.s.writeDone(r.req)
	putRequest(r.req)
}

// writeLoop is the writer goroutine: it writes whenever it is given the
// role, until the queue closed and is empty.
func (c *clientConn) writeLoop() {
	a := &c.answers
	for range a.wake {
		c.writeHeld(false)
		a.mu.Lock()
		done := a.closed && !a.held && len(a.q) == 0
		a.mu.Unlock()
		if done {
			return
		}
	}
}
