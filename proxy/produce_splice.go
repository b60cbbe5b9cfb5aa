package proxy

// Splicing a large Produce. Reading a client's record batches into Ferry
// and writing them to the broker again is most of the produce path's
// CPU (two copies of every byte through read(2) and writev(2)), and no
// check Ferry makes reads a record: they read the request's fields and
// each batch's header (producer ID, epoch, sequence, flags). So the
// reader moves each large batch body from the client's socket into a
// kernel pipe (splice(2)) and reads the rest of the frame into its buffer
// as ever, where it decodes as ever; the buffer's bytes in the holes are
// stale. A request forwarded as it is (one leader, nothing refused) goes
// to the broker with its holes moved out of the pipe, also after a
// switch: each batch's producer ID is then mapped in its header, and its
// CRC patched from the header's change alone (Batch.PatchCRC). Any
// request Ferry re-encodes (split by leader, items refused, policy)
// first reads its holes back (fill).

import (
	"bufio"
	"encoding/binary"
	"errors"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"

	"github.com/ferry-gw/ferry/internal/splice"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/upstream"
)

// produceSpliceMin is the smallest Produce frame whose batches are
// spliced: below it the system calls of splicing cost more than the
// copies they save.
const produceSpliceMin = 64 << 10

// splicedFrame is what a request's frame does not hold: its holes, in
// order, held by pipe.
type splicedFrame struct {
	pipe  *splice.Pipe
	holes []protocol.Hole
	// read back into Ferry (fill), the server's count
	filled prometheus.Counter
}

// size is how many bytes the holes hold.
func (sp *splicedFrame) size() int {
	n := 0
	for _, h := range sp.holes {
		n += h.Len
	}
	return n
}

// errSplicedUnfilled: a bug, a spliced request re-encoded before its
// holes were read back. Sent, its batches would fail the broker's CRC
// check; it is answered in the broker's place instead.
var errSplicedUnfilled = errors.New("a spliced request was re-encoded without its record bytes")

// spliceAllocMax bounds the frame for which a buffer is allocated at
// once (Kafka's default largest request): a larger one is spliced only
// into a kept buffer with room for it.
const spliceAllocMax = 1 << 20

// spliceable reports whether the frame of n bytes about to be read into
// buf is a Produce whose batches may go through a pipe: a plain TCP
// client, authenticated, and a plaintext active cluster. The frame's
// buffer is allocated whole before its bytes arrive (upstream's Grow, with
// room for frames of about its size, so that once kept it serves the next
// ones), not grown with them as ReadFrameBody does, so a client claiming
// a large frame and sending little holds its size: it is charged that
// much against its budgets (Admit) either way, and over spliceAllocMax
// only a kept buffer is used.
func (c *clientConn) spliceable(r *bufio.Reader, n int, buf *bytebufferpool.ByteBuffer, unauth bool) bool {
	if !c.s.cfg.spliceProduces || unauth || n < produceSpliceMin || !isTCP(c.nc) {
		return false
	}
	if cap(buf.B) < n && n > spliceAllocMax {
		return false
	}
	// To a cluster over TLS the bytes are encrypted in Ferry: they
	// would only be read back (sendRaw).
	if up := c.s.cluster(c.s.routes.Current().Active); up == nil || up.Security.TLS() {
		return false
	}
	head, err := r.Peek(2)
	return err == nil && int16(binary.BigEndian.Uint16(head)) == int16(kmsg.Produce)
}

// readSpliced reads a Produce frame of n bytes into buf, its large batch
// bodies into a pipe; nil when nothing went into one.
func (c *clientConn) readSpliced(r *bufio.Reader, n int, buf *bytebufferpool.ByteBuffer) (*splicedFrame, error) {
	pipe, err := splice.Get()
	if err != nil {
		return nil, protocol.ReadFrameBody(r, n, buf)
	}
	rc, err := c.nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		splice.Put(pipe)
		return nil, protocol.ReadFrameBody(r, n, buf)
	}
	buf.B = buf.B[:n] // room made for it before it was charged (readFrame)
	holes, err := protocol.ReadProduceFrame(r, buf.B, spliceMinBytes, func(k int) (int, error) { return pipe.From(rc, k) })
	if err != nil || len(holes) == 0 {
		splice.Put(pipe)
		return nil, err
	}
	return &splicedFrame{pipe: pipe, holes: holes, filled: c.s.metrics.splicedToFerry}, nil
}

// fill reads the request's spliced bytes back into its frame. Once it
// failed (it cannot but through a bug) the request is not sent.
func (req *request) fill() error {
	sp := req.spliced
	if sp == nil {
		return req.fillErr
	}
	req.spliced = nil
	n := 0
	for _, h := range sp.holes {
		if err := sp.pipe.ReadFull(req.frame.B[h.Off : h.Off+h.Len]); err != nil {
			req.fillErr = err
			break
		}
		n += h.Len
	}
	splice.Put(sp.pipe)
	sp.filled.Add(float64(n))
	return req.fillErr
}

// putRequest gives back what a request holds once it is answered or
// dropped: its frame's buffer, and a pipe still holding its batches
// (closed).
func putRequest(req *request) {
	if sp := req.spliced; sp != nil {
		req.spliced = nil
		splice.Put(sp.pipe)
	}
	upstream.RequestBufs.Put(req.frame)
}
