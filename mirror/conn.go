package mirror

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol/clusterauth"
)

// conn is a pipelined connection to one broker, owned by one partition
// writer. kgo's Broker.Request blocks until its response arrives, and
// requests from several goroutines reach the broker in no fixed order; the
// writer needs several Produce requests in flight *in order* (the broker
// serves one connection's requests in the order they were written, and so
// assigns offsets in that order). conn writes requests in the order Send is
// called and matches responses FIFO.
type conn struct {
	nc   net.Conn
	fmt  *kmsg.RequestFormatter
	addr string
	sec  *clusterauth.Security
	// renewAt is when the SASL session (KIP-368) nears its end (zero:
	// never): the writer then replaces the connection at its next quiet
	// moment (renew) instead of re-authenticating it in place.
	renewAt time.Time

	mu      sync.Mutex // guards writes, corr, pending and err
	corr    int32
	pending []*call
	err     error

	done chan struct{}
}

// call is one request in flight on a conn.
type call struct {
	req  kmsg.Request
	corr int32
	done chan struct{}
	resp kmsg.Response
	err  error
}

// errConnClosed is returned for requests on a conn that was closed.
var errConnClosed = errors.New("mirror: broker connection closed")

// readBufferSize is each connection's read buffer.
const readBufferSize = 4 << 10

// maxResponseSize caps one response frame.
const maxResponseSize = 256 << 20

// dialConn connects to a broker: TCP, then TLS and SASL as sec says.
func dialConn(ctx context.Context, addr string, sec *clusterauth.Security) (*conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	nc, sess, err := sec.Dial(ctx, &d, addr)
	if err != nil {
		return nil, err
	}
	c := &conn{
		nc:      nc,
		fmt:     kmsg.NewRequestFormatter(kmsg.FormatterClientID("ferry-mirror")),
		addr:    addr,
		sec:     sec,
		renewAt: sess.RenewAt(),
		done:    make(chan struct{}),
	}
	go c.readLoop()
	return c, nil
}

// renewing reports whether the connection's session nears its end.
func (c *conn) renewing() bool { return !c.renewAt.IsZero() && time.Now().After(c.renewAt) }

// renew returns c, or a new connection to the same broker in its place
// when c's session nears its end; c must have nothing in flight.
func (c *conn) renew(ctx context.Context) (*conn, error) {
	if !c.renewing() {
		return c, nil
	}
	n, err := dialConn(ctx, c.addr, c.sec)
	if err != nil {
		return c, err
	}
	c.Close()
	return n, nil
}

// Send writes req and returns without waiting for the response.
func (c *conn) Send(req kmsg.Request) *call {
	cl := &call{req: req, done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		cl.err = c.err
		close(cl.done)
		return cl
	}
	c.corr++
	cl.corr = c.corr
	buf := c.fmt.AppendRequest(nil, req, cl.corr)
	c.pending = append(c.pending, cl)
	_ = c.nc.SetWriteDeadline(time.Now().Add(30 * time.Second))
	// The frame is whole in buf: written as it is (a buffered writer
	// would copy it, and cost 64 KiB a connection, two a partition).
	if _, err := c.nc.Write(buf); err != nil {
		c.failLocked(err)
	}
	return cl
}

// Wait waits for the response of cl, or for ctx; on ctx's end the
// connection is closed (the outcome of what was written is unknown).
func (c *conn) Wait(ctx context.Context, cl *call) (kmsg.Response, error) {
	select {
	case <-cl.done:
		return cl.resp, cl.err
	case <-ctx.Done():
		c.Close()
		<-cl.done
		if cl.err == nil {
			return cl.resp, nil
		}
		return nil, ctx.Err()
	}
}

// Do sends req and waits for its response.
func (c *conn) Do(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	return c.Wait(ctx, c.Send(req))
}

// Close closes the connection, failing every call in flight. Safe to call
// more than once.
func (c *conn) Close() {
	c.mu.Lock()
	c.failLocked(errConnClosed)
	c.mu.Unlock()
	<-c.done
}

func (c *conn) failLocked(err error) {
	if c.err == nil {
		c.err = err
		// A deadline in the past unblocks the reader.
		_ = c.nc.SetDeadline(time.Now().Add(-time.Second))
		_ = c.nc.Close()
	}
}

func (c *conn) readLoop() {
	defer close(c.done)
	// Small: a frame larger than the buffer is read straight into its
	// body; the buffer only gathers the sizes and small answers (a
	// connection per partition and side: its size is paid per partition).
	br := bufio.NewReaderSize(c.nc, readBufferSize)
	var sizeBuf [4]byte
	for {
		_, err := io.ReadFull(br, sizeBuf[:])
		var body []byte
		if err == nil {
			n := int32(binary.BigEndian.Uint32(sizeBuf[:]))
			if n < 4 || n > maxResponseSize {
				err = fmt.Errorf("mirror: response frame size %d", n)
			} else {
				body = make([]byte, n)
				_, err = io.ReadFull(br, body)
			}
		}
		c.mu.Lock()
		if err != nil {
			c.failLocked(err)
			pending := c.pending
			c.pending = nil
			cerr := c.err
			c.mu.Unlock()
			for _, cl := range pending {
				cl.err = cerr
				close(cl.done)
			}
			return
		}
		if len(c.pending) == 0 {
			c.failLocked(errors.New("mirror: response with no request in flight"))
			c.mu.Unlock()
			continue
		}
		cl := c.pending[0]
		c.pending = c.pending[1:]
		c.mu.Unlock()

		cl.resp, cl.err = decodeResponse(cl.req, cl.corr, body)
		close(cl.done)
	}
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
