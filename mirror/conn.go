package mirror

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"

	"github.com/ferry-gw/ferry/protocol/clusterauth"
)

// conn is a pipelined connection to one broker, owned by one partition
// writer. kgo's Broker.Request blocks until its response arrives, and
// requests from several goroutines reach the broker in no fixed order; the
// writer needs several Produce requests in flight *in order* (the broker
// serves one connection's requests in the order they were written, and so
// assigns offsets in that order). conn writes requests in the order Send is
// called and matches responses FIFO.
//
// A conn is used by its writer's goroutine only, and has none of its own:
// Wait reads the responses, in order, up to the one waited for (those
// before it are kept in their calls). A goroutine reading each connection
// would cost two goroutine stacks per mirrored partition, for connections
// that are idle most of the time (a long-polling Fetch).
type conn struct {
	nc   net.Conn
	br   *bufio.Reader
	fmt  *kmsg.RequestFormatter
	wbuf []byte // the last request's encoding, reused
	addr string
	sec  *clusterauth.Security
	// renewAt is when the SASL session (KIP-368) nears its end (zero:
	// never): the writer then replaces the connection at its next quiet
	// moment (renew) instead of re-authenticating it in place.
	renewAt time.Time

	corr    int32
	pending []*call    // written, response not read yet, oldest first
	err     error      // set once: the connection is closed
	open    *connCount // decremented when closed (nil: not counted)
}

// call is one request in flight on a conn.
type call struct {
	req  kmsg.Request
	corr int32
	done bool // resp or err is set
	resp kmsg.Response
	err  error
	// pooled: the response's frame is read into a buffer of answerBufs,
	// body, which the caller gives back when it no longer uses the
	// response (the slices of a decoded response alias its frame).
	pooled bool
	body   *bytebufferpool.ByteBuffer
}

// answerBufs are the frames of the copy loop's fetch answers: up to
// fetchBytes each, read, copied to the standby and done with before the
// next fetch. Allocated anew, each was zeroed by the runtime and collected
// (an eighth of the member's CPU in a catch-up at 10,000 partitions).
var answerBufs bytebufferpool.Pool

// errConnClosed is returned for requests on a conn that was closed.
var errConnClosed = errors.New("mirror: broker connection closed")

// readBufferSize is each connection's read buffer. Small: a frame larger
// than the buffer is read straight into its body; the buffer only gathers
// the sizes and small answers (a produce response, an empty fetch), and
// there are two connections per mirrored partition.
const readBufferSize = 512

// keptRequestBuffer is the largest request encoding a connection keeps
// for the next request: fetches and small produces reuse it, a large
// produce's copy is let go.
const keptRequestBuffer = 4 << 10

// maxResponseSize caps one response frame.
const maxResponseSize = 256 << 20

// dialConn connects to a broker: TCP, then TLS and SASL as sec says.
func dialConn(ctx context.Context, addr string, sec *clusterauth.Security) (*conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	nc, sess, err := sec.Dial(ctx, &d, addr)
	if err != nil {
		return nil, err
	}
	return &conn{
		nc:      nc,
		br:      bufio.NewReaderSize(nc, readBufferSize),
		fmt:     kmsg.NewRequestFormatter(kmsg.FormatterClientID("ferry-mirror")),
		addr:    addr,
		sec:     sec,
		renewAt: sess.RenewAt(),
	}, nil
}

// renewing reports whether the connection's session nears its end.
func (c *conn) renewing() bool { return !c.renewAt.IsZero() && time.Now().After(c.renewAt) }

// Send writes req and returns without waiting for the response.
func (c *conn) Send(req kmsg.Request) *call {
	cl := &call{req: req}
	if c.err != nil {
		cl.done, cl.err = true, c.err
		return cl
	}
	c.corr++
	cl.corr = c.corr
	c.pending = append(c.pending, cl)
	_ = c.nc.SetWriteDeadline(time.Now().Add(30 * time.Second))
	var err error
	if bufs, ok := c.produceFrame(req, cl.corr); ok {
		_, err = bufs.WriteTo(c.nc)
	} else {
		// The frame is whole in wbuf: written as it is (a buffered
		// writer would copy it, and cost its buffer per connection).
		c.wbuf = c.fmt.AppendRequest(c.wbuf[:0], req, cl.corr)
		_, err = c.nc.Write(c.wbuf)
	}
	if err != nil {
		c.fail(err)
	}
	if cap(c.wbuf) > keptRequestBuffer {
		c.wbuf = nil // a large request's encoding is not kept for the next fetch
	}
	return cl
}

// writevFrom is the size of a produce's records from which Send writes
// them from where they are (writev) instead of copying them into the
// request's encoding: in a catch-up, a copy of every batch, in a buffer
// allocated for it, was an eighth of the member's CPU.
const writevFrom = 4 << 10

// produceFrame encodes req, if it is a writer's produce (one partition of
// one topic) with records of writevFrom bytes or more, as the frame's head
// and tail in wbuf around the records themselves, and reports whether it
// did. The records are the partition's last field: the request is encoded
// with none (null), and the null's encoding replaced by their length. The
// encoding is checked to end as expected; if it does not, ok is false and
// the request is encoded whole.
func (c *conn) produceFrame(req kmsg.Request, corr int32) (bufs net.Buffers, ok bool) {
	pr, isProduce := req.(*kmsg.ProduceRequest)
	if !isProduce || len(pr.Topics) != 1 || len(pr.Topics[0].Partitions) != 1 {
		return nil, false
	}
	pp := &pr.Topics[0].Partitions[0]
	recs := pp.Records
	if len(recs) < writevFrom {
		return nil, false
	}
	pp.Records = nil
	c.wbuf = c.fmt.AppendRequest(c.wbuf[:0], req, corr)
	pp.Records = recs
	// Null records are -1 as an int32, or as a compact length 0 followed
	// by the partition's, the topic's and the request's tagged fields
	// (none: a zero byte each).
	null, tail := nullBytes, []byte(nil)
	if pr.IsFlexible() {
		null, tail = nullCompactBytes, noTags
	}
	at := len(c.wbuf) - len(tail) - len(null)
	if at < 4 || !bytes.Equal(c.wbuf[at:at+len(null)], null) || !bytes.Equal(c.wbuf[at+len(null):], tail) {
		return nil, false
	}
	head := c.wbuf[:at]
	if pr.IsFlexible() {
		head = binary.AppendUvarint(head, uint64(len(recs))+1)
	} else {
		head = binary.BigEndian.AppendUint32(head, uint32(len(recs)))
	}
	binary.BigEndian.PutUint32(head, uint32(len(head)-4+len(recs)+len(tail)))
	c.wbuf = head
	return net.Buffers{head, recs, tail}, true
}

var (
	nullBytes        = []byte{0xff, 0xff, 0xff, 0xff}
	nullCompactBytes = []byte{0}
	noTags           = []byte{0, 0, 0}
)

// Wait reads responses until cl's, or until ctx ends; on ctx's end the
// connection is closed (the outcome of what was written is unknown).
func (c *conn) Wait(ctx context.Context, cl *call) (kmsg.Response, error) {
	if !cl.done {
		// A deadline in the past unblocks the read when ctx ends.
		stop := context.AfterFunc(ctx, func() { _ = c.nc.SetReadDeadline(time.Unix(1, 0)) })
		for !cl.done {
			c.readOne()
		}
		if !stop() && ctx.Err() != nil {
			c.fail(ctx.Err()) // the read deadline is past now
		}
	}
	if cl.err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return cl.resp, cl.err
}

// readOne reads the next response and hands it to the oldest call in
// flight; an error fails the connection and every call in flight.
func (c *conn) readOne() {
	if c.err != nil {
		c.fail(c.err)
		return
	}
	var sizeBuf [4]byte
	if _, err := io.ReadFull(c.br, sizeBuf[:]); err != nil {
		c.fail(err)
		return
	}
	n := int32(binary.BigEndian.Uint32(sizeBuf[:]))
	if n < 4 || n > maxResponseSize {
		c.fail(fmt.Errorf("mirror: response frame size %d", n))
		return
	}
	if len(c.pending) == 0 {
		c.fail(errors.New("mirror: response with no request in flight"))
		return
	}
	cl := c.pending[0]
	var body []byte
	if cl.pooled {
		cl.body = answerBufs.Get()
		if cap(cl.body.B) < int(n) {
			cl.body.B = make([]byte, n)
		}
		body = cl.body.B[:n]
	} else {
		body = make([]byte, n)
	}
	if _, err := io.ReadFull(c.br, body); err != nil {
		c.fail(err)
		return
	}
	c.pending[0] = nil
	c.pending = c.pending[1:]
	cl.resp, cl.err = decodeResponse(cl.req, cl.corr, body)
	cl.done = true
}

// Do sends req and waits for its response.
func (c *conn) Do(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	return c.Wait(ctx, c.Send(req))
}

// Close closes the connection, failing every call in flight. Safe to call
// more than once.
func (c *conn) Close() { c.fail(errConnClosed) }

// fail closes the connection (once; the first error stays) and fails every
// call in flight with it.
func (c *conn) fail(err error) {
	if c.err == nil {
		c.err = err
		_ = c.nc.Close()
		if c.open != nil {
			c.open.Dec()
		}
	}
	for _, cl := range c.pending {
		cl.done, cl.err = true, c.err
	}
	c.pending = nil
}

func decodeResponse(req kmsg.Request, corr int32, body []byte) (kmsg.Response, error) {
	r := kbin.Reader{Src: body}
	if got := r.Int32(); got != corr {
		return nil, fmt.Errorf("mirror: response correlation ID %d, want %d", got, corr)
	}
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if resp.IsFlexible() && req.Key() != 18 { // ApiVersions keeps header v0
		kmsg.SkipTags(&r)
	}
	if !r.Ok() {
		return nil, fmt.Errorf("mirror: %s response shorter than its header", kmsg.NameForKey(req.Key()))
	}
	if err := resp.ReadFrom(r.Src); err != nil {
		return nil, fmt.Errorf("mirror: decoding %s response: %w", kmsg.NameForKey(req.Key()), err)
	}
	return resp, nil
}

// link is a writer's connection to one partition leader: dialed when first
// needed, and closed while the partition is idle (park), so that an idle
// partition holds no socket and no buffer. The producers' state is the
// writer's, not the connection's: a link redials at will when nothing is in
// flight on it.
type link struct {
	addr string
	sec  *clusterauth.Security
	open *connCount // the mirror's open connections
	c    *conn
}

func newLink(addr string, sec *clusterauth.Security, open *connCount) *link {
	return &link{addr: addr, sec: sec, open: open}
}

// conn returns the link's connection, dialing it if it has none.
func (l *link) conn(ctx context.Context) (*conn, error) {
	if l.c != nil {
		return l.c, nil
	}
	c, err := dialConn(ctx, l.addr, l.sec)
	if err != nil {
		return nil, err
	}
	c.open = l.open
	if c.open != nil {
		c.open.Inc()
	}
	l.c = c
	return c, nil
}

// Do sends req on the link's connection and waits for its response.
func (l *link) Do(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	c, err := l.conn(ctx)
	if err != nil {
		return nil, err
	}
	return c.Do(ctx, req)
}

// DoPooled is Do with the response read into a buffer of answerBufs,
// returned with it: the caller puts it back (answerBufs.Put) once nothing
// of the response is used any more, or leaves it to the collector.
func (l *link) DoPooled(ctx context.Context, req kmsg.Request) (kmsg.Response, *bytebufferpool.ByteBuffer, error) {
	c, err := l.conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	cl := c.Send(req)
	cl.pooled = true
	resp, err := c.Wait(ctx, cl)
	return resp, cl.body, err
}

// renew closes the connection when its SASL session (KIP-368) nears its
// end; the next request dials a new one. Nothing may be in flight.
func (l *link) renew() {
	if l.c != nil && l.c.renewing() {
		l.Close()
	}
}

// Close closes the connection, if any; the link can dial again.
func (l *link) Close() {
	if l.c != nil {
		l.c.Close()
		l.c = nil
	}
}
