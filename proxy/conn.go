package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/splice"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// maxPipelined bounds the requests a client may have in flight on one
// connection before Ferry stops reading from it (Kafka clients default to 5).
const maxPipelined = 64

// clientConn is one client connection: a reader goroutine that parses
// requests and sends them upstream in arrival order, and a writer goroutine
// that answers them in the same order.
type clientConn struct {
	s   *Server
	nc  net.Conn
	log *zap.Logger
	ctx context.Context // ends when the connection closes
	end context.CancelFunc

	answers answerQueue       // the answers in order, and who writes them (answers.go)
	mem     *upstream.ConnMem // the bytes it holds, against the budgets

	writeWaits writeWaits // the writer's, for answers to writes (forced_wait.go)

	// upsMu guards ups and fetchUps (upstream_conns.go): the reader checks out and
	// sends under it; the writer and the server's give-back loop return what
	// has nothing in flight.
	upsMu sync.Mutex
	// ups are the checked-out upstream connections of this client, by
	// cluster then broker.
	ups map[upKey]*upstream.Conn
	// fetchUps are extra connections for Fetch only: a fetch answered
	// early leaves its slower parts parked upstream, and the client's next
	// fetch must not queue behind them. Fetches may go out of order.
	fetchUps map[upKey][]*upstream.Conn

	// Only the writer goroutine touches watermarks: the last answered
	// watermarks per partition, for fetch placeholders.
	watermarks map[tp]watermarks

	// lane is the virtual broker this connection reached (-1: any).
	lane int
	// shareTo is where the reader last sent a share request it chose a
	// broker for by partition (78_share_fetch.go).
	shareTo shareTarget

	// What Connz reports (connz.go). stats is nil when connection stats
	// are off. identified and lastUp are the reader goroutine's own;
	// identity and cluster are what it last stored for others to read.
	id          uint64
	remote      string
	connectedAt time.Time
	stats       *connstats.Stats
	identified  bool
	identity    atomic.Pointer[connstats.Identity]
	lastUp      *upstream.Cluster
	cluster     atomic.Pointer[upstream.Cluster]

	// auth is the SASL state (the reader goroutine's); principal who the
	// connection authenticated as, for others to read (auth.go).
	auth      connAuth
	principal atomic.Pointer[string]
	// ident is the identity number of the principal (principals.go),
	// set by the reader when the connection authenticates, before any
	// request it checks out a connection for.
	ident int32
	// ip is the client's source address (remoteIP), which the connection
	// limits and the login limits count by. unauth is set while the
	// connection counts against the bounds on unauthenticated ones, and
	// authTimer closes it if it has not authenticated in time
	// (preauth.go).
	ip        string
	unauth    atomic.Bool
	authTimer *time.Timer

	closeOnce sync.Once
	// Set once by close, read by retire after the connection is done.
	closeReason string
	closeErr    error
	closedAt    time.Time

	// inflight counts requests read and not yet answered; lastActive is
	// when the connection was last busy (UnixNano). See awaitRequest.
	inflight   atomic.Int64
	lastActive atomic.Int64
	// drainAt is when Shutdown closes the connection if it is still idle
	// (Unix nanoseconds; lame duck, server.go).
	drainAt atomic.Int64
}

type upKey struct {
	cluster string
	broker  int32
}

// request is one parsed client request.
type request struct {
	hdr   protocol.RequestHeader
	frame *bytebufferpool.ByteBuffer // the whole request, header included
	body  []byte
	// spliced, when set, holds the frame's large batch bodies in a pipe
	// (produce_splice.go): frame is stale there until fill. fillErr is
	// why they could not be read back.
	spliced *splicedFrame
	fillErr error
	kr      kmsg.Request      // the decoded body, once dispatch decoded it
	state   routing.State     // the routing state it is handled under
	up      *upstream.Cluster // the active cluster of that state
	start   time.Time
	write   bool // counted in Server.writes until answered (hold.go)
	// heldTooLong: it waited in the hold for heldAnswerAfter, and is
	// answered with its API's retriable error (hold.go).
	heldTooLong bool
	// stats, when set, counts the error codes of the answer Ferry encodes
	// (encodeResponse).
	stats *connstats.Stats
	// remaps are the batches of idempotent producers of another
	// generation that a Produce rewrote to a physical ID Ferry allocated
	// (physicalProducerIDs): one answered with an error was not written,
	// and the partition's later batches wait for it (remappedPIDs.gaps).
	remaps []remapBatch
	// physicalIDs: a Produce's batch headers now carry physical producer
	// IDs, written over the client's in place (physicalProducerIDs);
	// clientPID maps them back.
	physicalIDs bool
	// firsts are the batches that went to the broker as their
	// producer's first in a partition (native_firsts.go).
	firsts []firstRef
	// writtenAt are the offsets of batches answered
	// DUPLICATE_SEQUENCE_NUMBER, found written before a switch
	// (writtenBefore).
	writtenAt map[gapPart]int64
}

// clientPID is the producer ID the client sent for a batch of this
// Produce now carrying pid: the batch headers are rewritten in place to
// physical IDs once handled under a generation other than 0.
func (req *request) clientPID(topic string, topicID [16]byte, partition int32, pid int64) int64 {
	if !req.physicalIDs || pid < 0 {
		return pid
	}
	at := gapPart{topic, topicID, partition}
	for _, r := range req.remaps {
		if r.phys == pid && r.key.part() == at {
			return r.key.virt
		}
	}
	return routing.VirtualPID(req.state.Generation, pid)
}

// reply is the answer to one request, produced when the writer asks for it.
// finish blocks until the answer is complete and returns the response frame
// (header and body, no size); release returns its buffers.
type reply struct {
	req    *request
	finish func(ctx context.Context) (out []byte, release func(), err error)
	// stream, when set, is tried first: it may write the whole answer
	// frame to the client itself (handled), returning its size.
	stream func(ctx context.Context, bw *bufio.Writer) (n int64, handled bool, err error)
	// abandon, when set, is called for a reply that will never be
	// written.
	abandon func()
	// direct, when set, is the one broker answer finish needs: once it is
	// in, the goroutine that read it may write the reply (answers.go).
	// ready: it is in (under the answer queue's lock).
	direct *upstream.Pending
	ready  bool
}

func (s *Server) newClientConn(nc net.Conn) *clientConn {
	ctx, cancel := context.WithCancel(s.ctx)
	remote := nc.RemoteAddr().String()
	if s.tls != nil {
		nc = tls.Server(nc, s.tls.Config()) // the handshake runs in serve
	}
	c := &clientConn{
		s:           s,
		nc:          nc,
		log:         s.log.With(zap.String("client", remote)),
		ctx:         ctx,
		end:         cancel,
		answers:     newAnswerQueue(),
		mem:         s.mem.Conn(s.preauthBound()),
		ups:         make(map[upKey]*upstream.Conn),
		fetchUps:    make(map[upKey][]*upstream.Conn),
		watermarks:  make(map[tp]watermarks),
		shareTo:     shareTarget{broker: -1},
		id:          s.connIDs.Add(1),
		remote:      remote,
		connectedAt: time.Now(),
	}
	c.lastActive.Store(c.connectedAt.UnixNano())
	if s.cfg.connStats {
		c.stats = new(connstats.Stats)
	}
	return c
}

// serve runs the connection until either side fails; the first error wins
// and closes both.
func (c *clientConn) serve() {
	c.s.metrics.connsOpen.Inc()
	c.s.metrics.connsTotal.Inc()
	defer c.s.metrics.connsOpen.Dec()
	c.startUnauthenticated()
	defer func() {
		if c.authTimer != nil {
			c.authTimer.Stop()
		}
	}()
	err := c.handshake()
	if err == nil {
		err = c.refuseUnmappedWithoutSASL()
	}
	if err != nil {
		c.close(err)
		c.mem.Close()
		return
	}
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writeLoop()
	}()
	err = c.readLoop()
	c.closeAnswers()
	<-writerDone
	c.releaseUpstreams(err) // after a drain; readLoop did it otherwise
	c.close(err)
	c.mem.Close()
}

func (c *clientConn) close(err error) {
	c.closeOnce.Do(func() {
		c.closeReason, c.closedAt = closeReason(err), time.Now()
		if err != nil && !errors.Is(err, io.EOF) {
			c.closeErr = err
		}
		c.s.connMetrics.closes(c.closeReason).Inc()
		c.end()
		c.nc.Close()
		log := c.logger()
		switch {
		case errors.Is(err, upstream.ErrClientClosed): // an answer was still awaited
			log.Debug("client connection closed", zap.Error(err))
		case err == nil, errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, errIdle), errors.Is(err, ErrServerClosed):
			log.Debug("client connection closed")
		case refusalReason(err) != "", errors.Is(err, errTLSHandshake), errors.Is(err, errAuthFailed), errors.Is(err, errAuthRateLimited), errors.Is(err, errAuthTimeout):
			// Logged, sampled, where it was refused.
			log.Debug("client connection closed", zap.Error(err))
		default:
			log.Info("client connection closed", zap.Error(err))
		}
	})
}

func (c *clientConn) readLoop() (err error) {
	defer func() {
		// Requests still upstream fail at once, their client being gone,
		// unless the server drains: then the writer waits for them.
		if !errors.Is(err, errDraining) {
			c.releaseUpstreams(err)
		}
	}()
	br := bufio.NewReaderSize(c.nc, readBufferSize)
	for {
		if err := c.awaitRequest(br); err != nil {
			return err
		}
		buf := upstream.RequestBufs.Get()
		spliced, err := c.readFrame(br, buf)
		if err != nil {
			upstream.RequestBufs.Put(buf)
			err = c.readErr(err)
			if errors.Is(err, errUnauthFrameTooLarge) {
				return c.refuseUnauthFrame(err)
			}
			if errors.Is(err, protocol.ErrFrameTooLarge) || errors.Is(err, protocol.ErrMalformedFrame) {
				return c.refuseFrame("closing connection: bad frame", err)
			}
			return err
		}
		hdr, err := protocol.ParseRequestHeader(buf.B)
		if err != nil {
			putRequest(&request{frame: buf, spliced: spliced})
			return c.refuseFrame("closing connection: bad request header", err)
		}
		req := &request{hdr: hdr, frame: buf, body: buf.B[hdr.Size:], spliced: spliced, start: time.Now(), stats: c.stats}
		if c.stats != nil {
			c.stats.Request(hdr.Key, len(buf.B)+4)
		}
		if isWrite(hdr.Key) {
			st, err := c.s.passHold(c.ctx, hdr.Key)
			switch {
			case errors.Is(err, errHeldTooLong):
				// Answered with its retriable error, not counted.
				req.state, req.heldTooLong = st, true
			case err != nil:
				putRequest(req)
				return err
			default:
				req.state, req.write = st, true
			}
		} else {
			req.state = c.s.routes.Current()
		}
		req.up = c.s.cluster(req.state.Active)
		if req.up != c.lastUp {
			c.lastUp = req.up
			c.cluster.Store(req.up)
		}
		r, err := c.s.dispatch(c, req)
		if !c.identified {
			c.identify(req)
		}
		if err != nil {
			if c.stats != nil {
				c.stats.Refused() // refused: the connection closes
			}
			c.s.writeDone(req)
			putRequest(req)
			c.s.metrics.observe(hdr.Key, req.start, err)
			c.logRefusal(zapcore.WarnLevel, refusalReason(err), "closing connection", zap.Int16("api_key", hdr.Key), zap.Int16("api_version", hdr.Version), zap.Error(err))
			return err
		}
		if r == nil { // acks=0 produce: no answer
			c.s.writeDone(req)
			c.s.metrics.observe(hdr.Key, req.start, nil)
			putRequest(req)
			continue
		}
		c.inflight.Add(1)
		if !c.push(r) {
			c.s.writeDone(req)
			return c.ctx.Err()
		}
		if err := c.auth.closeAfter; err != nil {
			// Authentication failed: the answer saying so is written,
			// then the connection closes (auth.go).
			return err
		}
	}
}

// Per-connection buffers, what an idle client connection costs beside its
// two goroutines: the reader's, small, gathers frame sizes and small
// pipelined requests (a frame larger than it is read straight into its
// pooled buffer); the writer's is taken from a pool while answers are
// being written and given back once they are flushed, so an idle
// connection holds none.
const (
	readBufferSize  = 4 << 10
	writeBufferSize = 32 << 10
)

var replyWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufferSize) }}

// putReplyWriter gives bw back to the pool, dropping what it still holds.
func putReplyWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	replyWriters.Put(bw)
}

// write writes one reply's frame to bw and returns its size.
func (c *clientConn) write(r *reply, bw *bufio.Writer) (int64, error) {
	if r.stream != nil {
		n, handled, err := r.stream(c.ctx, bw)
		if handled {
			c.s.metrics.observe(r.req.hdr.Key, r.req.start, err)
			return n, err
		}
	}
	// A write a forced switch may refuse waits under its generation's
	// context, which the switch ends (forced_wait.go): refused then,
	// whatever the old cluster answers, or before it does.
	ctx, forceable := c.ctx, r.req.write && refusedAfterForced(r.req.hdr.Key)
	if forceable {
		ctx = c.writeCtx(r.req.state.Generation)
	}
	out, release, err := r.finish(ctx)
	if forceable && c.ctx.Err() == nil && c.s.routes.Current().ForcedFrom(r.req.state.Generation) {
		if release != nil {
			release()
		}
		out, release = c.s.forcedAway(r.req)
		err = nil
	} else if err != nil && c.ctx.Err() == nil && r.req.kr != nil {
		// The upstream failed with the request in flight: its outcome
		// is unknown, as it would be to a client whose broker died, and
		// the client retries on the error the broker's absence means.
		if ur := c.s.upstreamFailed(c, r.req, err); ur != nil {
			out, release, err = ur.finish(c.ctx)
		}
	}
	c.s.metrics.observe(r.req.hdr.Key, r.req.start, err)
	// A first batch whose answer was not the broker's (refused, forced
	// away, failed) was not written (native_firsts.go).
	c.s.settleFirsts(r.req, nil)
	if err != nil {
		return 0, fmt.Errorf("%s v%d: %w", kmsg.NameForKey(r.req.hdr.Key), r.req.hdr.Version, err)
	}
	var size [4]byte
	binary.BigEndian.PutUint32(size[:], uint32(len(out)))
	_, err = bw.Write(size[:])
	if err == nil {
		_, err = bw.Write(out)
	}
	if release != nil {
		release()
	}
	return int64(len(out) + 4), err
}

// sendRaw forwards frame as it is (correlation ID aside) to a broker. A
// write (req.write) is sent only while the member's write lease holds.
func (c *clientConn) sendRaw(req *request, broker int32, frame []byte, expectResponse bool) (*upstream.Pending, error) {
	u := req.up
	var gate func() time.Duration
	if req.write && c.s.cfg.writeLease != nil {
		gate = c.s.cfg.writeLease.Left
		if gate() <= 0 {
			return nil, upstream.ErrLeaseLapsed
		}
	}
	c.upsMu.Lock()
	defer c.upsMu.Unlock()
	// Leasing a connection may wait (the pool at its bound) or dial: the
	// lease is asked again when the frame is about to be written.
	uc, err := c.upConn(u, broker)
	if err != nil {
		return nil, err
	}
	if req.fillErr != nil {
		return nil, req.fillErr
	}
	var p *upstream.Pending
	if sp := req.spliced; sp != nil && uc.Spliceable() {
		if len(frame) == 0 || &frame[0] != &req.frame.B[0] {
			return nil, errSplicedUnfilled
		}
		req.spliced = nil
		p, err = uc.SendSpliced(frame, sp.holes, sp.pipe, expectResponse, gate)
		if err == nil {
			c.s.metrics.splicedToBroker.Add(float64(sp.size()))
		}
		splice.Put(sp.pipe) // closed if the write failed with bytes in it
	} else {
		if err := req.fill(); err != nil { // a TLS broker connection
			return nil, err
		}
		p, err = uc.SendFrame(frame, expectResponse, false, gate)
	}
	if err == nil {
		c.s.metrics.bytesUp.Add(float64(len(frame) + 4))
	}
	return p, err
}

// readFrame reads a client's request frame into buf, charged to the
// connection's budget: a client over budget waits between the frame's size
// and its body. That wait is Ferry's, not the client's: the request read
// timeout starts again after it. Before authentication a frame over the
// pre-authentication bound is refused from its size (preauth.go).
func (c *clientConn) readFrame(r *bufio.Reader, buf *bytebufferpool.ByteBuffer) (*splicedFrame, error) {
	limit, unauth := c.s.cfg.maxRequestSize, !c.s.authenticated(c)
	if unauth {
		limit = min(limit, int32(c.s.auth.Config().PreAuth.MaxReceiveSize))
	}
	n, err := protocol.ReadFrameSize(r, limit)
	if err != nil {
		if unauth && errors.Is(err, protocol.ErrFrameTooLarge) {
			return nil, fmt.Errorf("%w: %w", errUnauthFrameTooLarge, err)
		}
		return nil, err
	}
	// A large frame takes a kept buffer of its size, if there is one,
	// before its charge is counted from the buffer's capacity.
	upstream.RequestBufs.Fit(buf, n)
	// A spliced Produce's buffer is allocated before its bytes arrive
	// (produce_splice.go), once admitted, and charged from the capacity
	// it will have.
	spliced := c.spliceable(r, n, buf, unauth)
	charge := n
	if spliced {
		charge = upstream.GrowCap(buf, n)
	}
	waited, err := c.mem.Admit(c.ctx, buf, charge)
	if err != nil {
		return nil, err
	}
	if waited {
		c.nc.SetReadDeadline(time.Now().Add(c.s.settings.Load().RequestReadTimeout))
	}
	if spliced {
		upstream.RequestBufs.Grow(buf, n)
		return c.readSpliced(r, n, buf)
	}
	return nil, protocol.ReadFrameBody(r, n, buf)
}
