package proxy

import (
	"context"
	"errors"
	"sort"

	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"
)

// subCall is the part of a split request that went to one broker.
type subCall struct {
	broker int32
	req    kmsg.Request
	p      *pending
	uc     *upConn // for fetches: the connection it went out on
	err    error
}

// sendSplit sends each broker its part of a request, in broker order so the
// reader goroutine's sends are deterministic. stream asks for a fetch's
// large answer to be left on its connection for the writer to stream.
func (c *clientConn) sendSplit(req *request, parts map[int32]kmsg.Request, expectResponse, stream bool) []*subCall {
	brokers := make([]int32, 0, len(parts))
	for b := range parts {
		brokers = append(brokers, b)
	}
	sort.Slice(brokers, func(i, j int) bool { return brokers[i] < brokers[j] })
	calls := make([]*subCall, 0, len(parts))
	for _, b := range brokers {
		sc := &subCall{broker: b, req: parts[b]}
		buf := encodeRequest(req, sc.req)
		if req.hdr.Key == int16(kmsg.Fetch) {
			c.upsMu.Lock()
			if sc.uc, sc.err = c.fetchConn(req.up, b); sc.err == nil {
				c.s.metrics.bytesUp.Add(float64(len(buf.B) + 4))
				sc.p, sc.err = sc.uc.sendFrame(buf.B, true, stream)
			}
			c.upsMu.Unlock()
		} else {
			sc.p, sc.err = c.sendRaw(req.up, b, buf.B, expectResponse)
		}
		encodedBufs.Put(buf)
		if sc.err != nil {
			c.log.Debug("upstream send failed", zap.Int32("broker", b), zap.Error(sc.err))
		}
		calls = append(calls, sc)
	}
	return calls
}

// gathered is a split request's answers: one decoded response per call
// that succeeded (nil where it failed), and the buffers they alias.
type gathered struct {
	resps []kmsg.Response
	bufs  []*bytebufferpool.ByteBuffer
}

func (g *gathered) release() {
	for _, b := range g.bufs {
		responseBufs.Put(b)
	}
}

// gather waits for every call. A call that failed (send, connection, or
// decode) leaves a nil response, which the caller answers with a retriable
// error for its partitions; the cluster's metadata is refreshed so that the
// client's retry finds the new leader.
func (c *clientConn) gather(ctx context.Context, req *request, calls []*subCall) (*gathered, error) {
	g := &gathered{resps: make([]kmsg.Response, len(calls))}
	failed := false
	for i, sc := range calls {
		if sc.err != nil {
			failed = true
			// As for a request to one leader (upstreamFailed): the
			// partitions of a leader that cannot be reached are
			// answered NOT_LEADER once the cluster moved them.
			if ue := (*unreachableError)(nil); errors.As(sc.err, &ue) && req.kr != nil {
				req.up.waitLeaderMoved(ctx, ue.broker, leaderWait(req.kr))
			}
			continue
		}
		buf, err := sc.p.wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				g.release()
				return nil, ctx.Err()
			}
			if errors.Is(err, errClientClosed) { // nobody to answer
				g.release()
				return nil, err
			}
			failed = true
			continue
		}
		g.bufs = append(g.bufs, buf)
		resp := sc.req.ResponseKind()
		if err := decodeResponse(buf, req.hdr.Key, req.hdr.Version, resp); err != nil {
			c.log.Warn("undecodable upstream response", zap.Int32("broker", sc.broker), zap.Error(err))
			failed = true
			continue
		}
		g.resps[i] = resp
	}
	if failed {
		req.up.refreshSoon()
	}

	return g, nil
}
