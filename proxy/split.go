package proxy

import (
	"context"
	"errors"
	"sort"

	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"
)

// subCall is the part of a split request that went to one broker.
type subCall struct {
	broker int32
	req    kmsg.Request
	p      *upstream.Pending
	uc     *upstream.Conn // for fetches: the connection it went out on
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
				sc.p, sc.err = sc.uc.SendFrame(buf.B, true, stream, nil) // fetches are not writes
			}
			c.upsMu.Unlock()
		} else {
			sc.p, sc.err = c.sendRaw(req, b, buf.B, expectResponse)
		}
		upstream.EncodedBufs.Put(buf)
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
		upstream.ResponseBufs.Put(b)
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
			if ue := (*upstream.UnreachableError)(nil); errors.As(sc.err, &ue) && req.kr != nil {
				req.up.WaitLeaderMoved(ctx, ue.Broker, upstream.LeaderWait(req.kr))
			}
			continue
		}
		buf, err := sc.p.Wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				g.release()
				return nil, ctx.Err()
			}
			if errors.Is(err, upstream.ErrClientClosed) { // nobody to answer
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
		req.up.RefreshSoon()
	}

	return g, nil
}

// leaderSplit is a Produce or Fetch request's partitions grouped by
// upstream leader, its topics resolved: for each broker, the request's
// topics (by index) with the partitions that broker leads. Partitions
// Ferry answers itself are in local, by topic index then partition.
type leaderSplit[P any] struct {
	names   []string   // topic names, by request index
	physIDs [][16]byte // physical topic IDs, by request index (v13+)
	local   map[int]map[int32]int16
	brokers map[int32][]splitTopic[P]
}

// splitTopic is one topic of a broker's part: the topic's index in the
// client's request and the partitions the broker leads.
type splitTopic[P any] struct {
	ti    int
	parts []P
}

func (sp *leaderSplit[P]) fail(ti int, p int32, code int16) {
	if sp.local == nil {
		sp.local = map[int]map[int32]int16{}
	}
	if sp.local[ti] == nil {
		sp.local[ti] = map[int32]int16{}
	}
	sp.local[ti][p] = code
}

// splitTopics resolves each topic of a Produce or Fetch request — by name,
// or from v13 by virtual topic ID — and groups its partitions by upstream
// leader. topic gives a request topic's name, ID and partitions, partition
// a partition's number. check, called with each routable partition (a
// copy, which is what goes upstream), its topic's name and its leader,
// returns the error code Ferry answers it with instead, or 0.
func splitTopics[T, P any](c *clientConn, req *request, topics []T, topic func(*T) (string, [16]byte, []P), partition func(*P) int32,
	check func(ti int, name string, p *P, leader int32) int16) *leaderSplit[P] {
	sp := &leaderSplit[P]{
		names:   make([]string, len(topics)),
		physIDs: make([][16]byte, len(topics)),
		brokers: map[int32][]splitTopic[P]{},
	}
	byID := req.hdr.Version >= 13
	internal := false
	p := new(P) // the copy checked, one for all: check's argument escapes
	for ti := range topics {
		name, id, parts := topic(&topics[ti])
		if byID {
			info := req.up.TopicByVID(c.ctx, id)
			if info == nil {
				for pi := range parts {
					sp.fail(ti, partition(&parts[pi]), kerr.UnknownTopicID.Code)
				}
				continue
			}
			name, id = info.Name, info.ID
		}
		if c.s.internal.has(name) {
			// Ferry's own (internal_topics.go): never forwarded.
			for pi := range parts {
				sp.fail(ti, partition(&parts[pi]), topicAuthFailed)
			}
			internal = true
			continue
		}
		sp.names[ti], sp.physIDs[ti] = name, id
		for pi := range parts {
			*p = parts[pi]
			pn := partition(p)
			pinfo, ok := req.up.Partition(c.ctx, name, pn)
			switch {
			case !ok:
				sp.fail(ti, pn, kerr.UnknownTopicOrPartition.Code)
				continue
			case pinfo.Leader < 0:
				sp.fail(ti, pn, kerr.NotLeaderForPartition.Code)
				continue
			}
			if code := check(ti, name, p, pinfo.Leader); code != 0 {
				sp.fail(ti, pn, code)
				continue
			}
			ts := sp.brokers[pinfo.Leader]
			if n := len(ts); n > 0 && ts[n-1].ti == ti {
				ts[n-1].parts = append(ts[n-1].parts, *p)
			} else {
				// Room for the topic's other partitions: nearly always
				// with the same leader (lanes).
				ts = append(ts, splitTopic[P]{ti: ti, parts: append(make([]P, 0, len(parts)-pi), *p)})
			}
			sp.brokers[pinfo.Leader] = ts
		}
	}
	if internal {
		c.s.internalRefused(c, req)
	}
	return sp
}

// requests builds each broker's part of the request with build, which
// makes a request of the client's request-level fields and the given
// topics.
func (sp *leaderSplit[P]) requests(build func(topics []splitTopic[P]) kmsg.Request) map[int32]kmsg.Request {
	parts := make(map[int32]kmsg.Request, len(sp.brokers))
	for b, ts := range sp.brokers {
		parts[b] = build(ts)
	}
	return parts
}
