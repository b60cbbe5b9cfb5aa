package proxy

// Fetch (key 1), v4-v18 (Kafka 4.x's floor is v4).
//
// Split by upstream partition leader and merged; each part keeps the
// client's MaxWait and MinBytes, so the answer comes when every leader has
// answered. KIP-227 fetch sessions are per broker and cannot survive a
// switch, so Ferry does not open any: every upstream fetch is a full,
// sessionless one (session ID 0, epoch -1), and the client is answered with
// session ID 0, which makes it keep sending full fetches.
//
// Record bytes are not decoded. Under a generation other than 0 the
// partition leader epoch in each batch header (outside the CRC) is made
// virtual; from a cluster the mirror may have written into, its filler
// batches are emptied (protocol.RewriteRecords). Leader epochs in the request are mapped back to physical ones; an
// epoch of another generation is answered FENCED_LEADER_EPOCH (or
// UNKNOWN_LEADER_EPOCH if newer) so the client refreshes its metadata.
// v13+ addresses topics by ID. Preferred read replicas are never offered:
// a client reads through Ferry only.
//
// A fetch spread over several brokers is answered as soon as one part
// brings records (or errors), with whatever other parts have already
// answered: waiting for every part would hold ready records for up to
// MaxWait behind an idle broker. Parts still parked upstream are answered
// as empty (with the partition's last known watermarks) and their late
// answers dropped; the client fetches those offsets again. Fetches use
// their own upstream connections so that the next fetch does not queue
// behind a parked one.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"reflect"
	"time"

	"go.uber.org/zap"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

func handleFetch(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.FetchRequest)
	gen := req.state.Generation
	sp := splitTopics(c, req, in.Topics,
		func(t *kmsg.FetchRequestTopic) (string, [16]byte, []kmsg.FetchRequestTopicPartition) {
			return t.Topic, t.TopicID, t.Partitions
		},
		func(p *kmsg.FetchRequestTopicPartition) int32 { return p.Partition },
		func(_ int, _ string, p *kmsg.FetchRequestTopicPartition, _ int32) int16 {
			return physicalEpochs(gen, &p.CurrentLeaderEpoch, &p.LastFetchedEpoch)
		})
	parts := sp.requests(func(ts []splitTopic[kmsg.FetchRequestTopicPartition]) kmsg.Request {
		sub := &kmsg.FetchRequest{Version: in.Version, ReplicaID: -1, MaxWaitMillis: in.MaxWaitMillis, MinBytes: in.MinBytes, MaxBytes: in.MaxBytes, IsolationLevel: in.IsolationLevel, SessionID: 0, SessionEpoch: -1}
		sub.ReplicaState.ID = -1
		sub.ReplicaState.Epoch = -1
		for _, t := range ts {
			sub.Topics = append(sub.Topics, kmsg.FetchRequestTopic{Topic: sp.names[t.ti], TopicID: sp.physIDs[t.ti], Partitions: t.parts})
		}
		return sub
	})
	names, local := sp.names, sp.local
	// A fetch from one broker may be streamed, under any generation: what
	// its record batches need (batchRewrite) is done to their headers as
	// they pass.
	stream := s.cfg.spliceFetches && len(parts) == 1 && len(local) == 0 && isTCP(c.nc)
	calls := c.sendSplit(req, parts, true, stream)
	if len(calls) == 1 && len(local) == 0 && calls[0].err == nil {
		return s.fetchInPlace(c, req, in, names, calls[0]), nil
	}
	maxWait := time.Duration(in.MaxWaitMillis) * time.Millisecond
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		if len(calls) == 0 && len(local) == 0 && maxWait > 0 {
			// Nothing to fetch: answer after MaxWait, as a broker would.
			t := time.NewTimer(maxWait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, nil, ctx.Err()
			}
		}
		g, finished, err := c.gatherFetch(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		return s.mergeFetch(c, req, in, names, local, calls, g, finished), g.release, nil
	}), nil
}

// mergeFetch builds the client's answer from the answers of the brokers a
// fetch was split over, and Ferry's own answers (local) for the partitions
// it could not route.
func (s *Server) mergeFetch(c *clientConn, req *request, in *kmsg.FetchRequest, names []string, local map[int]map[int32]int16, calls []*subCall, g *gathered, finished []bool) *kmsg.FetchResponse {
	byID := req.hdr.Version >= 13
	answers := map[tp]kmsg.FetchResponseTopicPartition{}
	var throttle int32
	hinted := false
	for i, r := range g.resps {
		sub := calls[i].req.(*kmsg.FetchRequest)
		if !finished[i] {
			for _, t := range sub.Topics {
				for _, p := range t.Partitions {
					answers[tp{t.Topic, p.Partition}] = c.fetchPlaceholder(tp{t.Topic, p.Partition}, p.FetchOffset)
				}
			}
			continue
		}
		var resp *kmsg.FetchResponse
		if r != nil {
			resp = r.(*kmsg.FetchResponse)
		}
		if resp == nil || resp.ErrorCode != 0 {
			code := kerr.NotLeaderForPartition.Code
			if resp != nil {
				code = resp.ErrorCode
			}
			for _, t := range sub.Topics {
				for _, p := range t.Partitions {
					answers[tp{t.Topic, p.Partition}] = fetchError(p.Partition, code)
				}
			}
			continue
		}
		throttle = max(throttle, resp.ThrottleMillis)
		hinted = hinted || len(resp.Brokers) > 0
		for _, t := range resp.Topics {
			name := t.Topic
			if byID {
				name = fetchTopicName(sub, t.TopicID)
			}
			for _, p := range t.Partitions {
				// Rewritten before it was decoded (virtualAnswer).
				hinted = hinted || p.CurrentLeader.LeaderID >= 0
				answers[tp{name, p.Partition}] = p
				if p.ErrorCode == 0 {
					c.watermarks[tp{name, p.Partition}] = watermarks{p.HighWatermark, p.LastStableOffset, p.LogStartOffset}
				}
			}
		}
	}
	out := kmsg.NewPtrFetchResponse()
	out.ThrottleMillis = throttle
	out.SessionID = 0
	for ti, t := range in.Topics {
		rt := kmsg.FetchResponseTopic{Topic: t.Topic, TopicID: t.TopicID}
		for _, p := range t.Partitions {
			rt.Partitions = append(rt.Partitions, answerFor(local, answers, ti, names[ti], p.Partition, fetchError))
		}
		out.Topics = append(out.Topics, rt)
	}
	if hinted {
		for _, b := range s.virtualBrokers() {
			out.Brokers = append(out.Brokers, kmsg.FetchResponseBroker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
		}
	}
	return out
}

// fetchInPlace answers a fetch that went to one broker: the common case
// with lanes. The broker's answer is rewritten in place — topic IDs,
// preferred read replica, leader hints, and batch leader epochs under a
// generation other than 0 — and sent on as it came, without decoding or
// copying the records. An answer that cannot be rewritten in place (a
// top-level error, KIP-951 node endpoints) goes through the decoding path.
// A large answer to a streamable fetch is streamed instead (fetchStream).
func (s *Server) fetchInPlace(c *clientConn, req *request, in *kmsg.FetchRequest, names []string, sc *subCall) *reply {
	version := req.hdr.Version
	var byPhys fetchTopics
	if version >= 13 {
		byPhys = make(fetchTopics, len(in.Topics))
		for ti, t := range in.Topics {
			if info := req.up.Snapshot().Topics[names[ti]]; info != nil {
				byPhys[info.ID] = topicIDs{t.TopicID, names[ti]}
			}
		}
	}
	r := s.fetchWhole(c, req, in, names, sc, byPhys)
	if sc.p.Stream {
		r.stream = func(ctx context.Context, bw *bufio.Writer) (int64, bool, error) {
			return s.fetchStream(ctx, c, req, sc, byPhys, bw)
		}
		r.abandon = sc.dropStreamed
	}
	return r
}

// fetchTopics are the fetched topics' virtual IDs and names, by physical
// ID (v13+).
type fetchTopics map[[16]byte]topicIDs

// virtual gives an answer's topic its virtual ID, in place, and returns its
// name: for the in-place and the streamed paths alike.
func (ts fetchTopics) virtual(t *protocol.FetchTopic) string {
	if t.ID == nil {
		return t.Name
	}
	ids, ok := ts[[16]byte(t.ID)]
	if !ok {
		return ""
	}
	copy(t.ID, ids.vid[:])
	return ids.name
}

// topicIDs are a fetched topic's virtual ID and name.
type topicIDs struct {
	vid  [16]byte
	name string
}

// fetchWhole answers a single-broker fetch from the broker's answer read
// whole, rewritten in place when it can be.
func (s *Server) fetchWhole(c *clientConn, req *request, in *kmsg.FetchRequest, names []string, sc *subCall, byPhys fetchTopics) *reply {
	gen := req.state.Generation
	version := req.hdr.Version
	return &reply{req: req, finish: func(ctx context.Context) ([]byte, func(), error) {
		buf, err := s.waitFetchPart(ctx, req, sc.p)
		if err == nil && buf == nil {
			// An answer left on its connection to be streamed, which
			// fetchStream passed over: its generation had ended.
			err = errGenerationEnded
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, upstream.ErrClientClosed) {
				return nil, nil, err
			}
			if s.generationEnded(req) {
				// Parked on the cluster a switch left (or dropped
				// there, streamed): answered empty now.
				if sc.p.Stream {
					sc.dropStreamed()
				} else {
					sc.p.Abandon()
				}
				return s.fetchDecoded(c, req, in, names, sc, nil, false)
			}
			return s.fetchDecoded(c, req, in, names, sc, nil, true)
		}
		hs := protocol.ResponseHeaderSize(req.hdr.Key, version)
		body := buf.B[hs:]
		// A read-only walk first: a fallback must see the answer as the
		// broker sent it.
		code, endpoints, err := protocol.WalkFetchResponse(body, version, nil, nil)
		if err != nil || code != 0 || endpoints {
			return s.fetchDecoded(c, req, in, names, sc, buf, true)
		}
		rw := s.batchRewrite(req.up, gen)
		var name string
		protocol.WalkFetchResponse(body, version, func(t *protocol.FetchTopic) error {
			name = byPhys.virtual(t)
			return nil
		}, func(_ *protocol.FetchTopic, p *protocol.FetchPartition) error {
			s.virtualFetchPartition(req.up, gen, name, p, rw)
			return nil
		})
		binary.BigEndian.PutUint32(buf.B, uint32(req.hdr.CorrelationID))
		return buf.B, func() { upstream.ResponseBufs.Put(buf) }, nil
	}}
}

// fetchDecoded answers a single-broker fetch through the decoding path,
// from the answer in buf (nil: the broker could not be asked, or, when not
// answered, was not waited for: every partition is answered empty).
func (s *Server) fetchDecoded(c *clientConn, req *request, in *kmsg.FetchRequest, names []string, sc *subCall, buf *bytebufferpool.ByteBuffer, answered bool) ([]byte, func(), error) {
	g := &gathered{resps: make([]kmsg.Response, 1)}
	if buf != nil {
		g.bufs = append(g.bufs, buf)
		s.virtualAnswer(req, sc.req.(*kmsg.FetchRequest), buf.B)
		resp := sc.req.ResponseKind()
		if err := decodeResponse(buf, req.hdr.Key, req.hdr.Version, resp); err != nil {
			c.log.Warn("undecodable upstream response", zap.Int32("broker", sc.broker), zap.Error(err))
		} else {
			g.resps[0] = resp
		}
	}
	out := s.mergeFetch(c, req, in, names, nil, []*subCall{sc}, g, []bool{answered})
	enc, release := encodeResponse(req, out)
	g.release()
	return enc, release, nil
}

// virtualFetchPartition rewrites, in place, what one partition of a broker's
// Fetch answer must say to clients: no preferred read replica, the
// diverging epoch and the leader hint's epoch virtual, the hint's leader a
// broker of Ferry's, each record batch's partition leader epoch virtual and
// the mirror's fillers hidden (rw). Every path of a Fetch answer goes
// through it: read whole and rewritten in place (fetchWhole), decoded and
// merged (each broker's answer is rewritten before it is decoded:
// virtualAnswer), and streamed (fetchStream, which passes the windows
// before and after the records in two calls and rewrites the records as
// they pass, with the same rw). Nil windows are left alone. It reports
// whether the partition carries a leader hint.
func (s *Server) virtualFetchPartition(u *upstream.Cluster, gen uint32, topic string, p *protocol.FetchPartition, rw protocol.BatchRewrite) bool {
	if upstream.LeaderMoved(p.ErrorCode) {
		u.RefreshSoon()
	}
	if p.PreferredReadReplica != nil {
		binary.BigEndian.PutUint32(p.PreferredReadReplica, 0xffffffff)
	}
	if p.DivergingEpoch != nil {
		if e := int32(binary.BigEndian.Uint32(p.DivergingEpoch)); e >= 0 {
			binary.BigEndian.PutUint32(p.DivergingEpoch, uint32(routing.VirtualEpoch(gen, e)))
		}
	}
	if len(p.Records) > 0 {
		protocol.RewriteRecords(p.Records, rw)
	}
	if p.CurrentLeader == nil {
		return false
	}
	id := int32(binary.BigEndian.Uint32(p.CurrentLeader))
	if id < 0 {
		return false
	}
	binary.BigEndian.PutUint32(p.CurrentLeader, uint32(s.virtualLeader(u, topic, p.Partition, id)))
	e := int32(binary.BigEndian.Uint32(p.CurrentLeader[4:]))
	binary.BigEndian.PutUint32(p.CurrentLeader[4:], uint32(routing.VirtualEpoch(gen, e)))
	return true
}

// batchRewrite is what the record batches of a Fetch answer from u need
// under gen: leader epochs made virtual (generation 0 maps them to
// themselves), and the mirror's fillers hidden when the cluster may hold
// them. A property of the cluster, not of the generation: the standby the
// mirror wrote into becomes the active cluster at a switch.
func (s *Server) batchRewrite(u *upstream.Cluster, gen uint32) protocol.BatchRewrite {
	rw := protocol.BatchRewrite{HideFillers: u.Fillers, Hidden: s.metrics.fillersHidden.Inc}
	if gen != 0 {
		rw.Epoch = func(e int32) int32 { return routing.VirtualEpoch(gen, e) }
	}
	return rw
}

// virtualAnswer rewrites a broker's answer to sub (buf: response header
// and body) in place through virtualFetchPartition, before it is decoded to be
// merged. Topic IDs stay physical: the merged answer takes the client's.
func (s *Server) virtualAnswer(req *request, sub *kmsg.FetchRequest, buf []byte) {
	hs := protocol.ResponseHeaderSize(req.hdr.Key, req.hdr.Version)
	if len(buf) < hs {
		return
	}
	gen := req.state.Generation
	rw := s.batchRewrite(req.up, gen)
	var name string
	protocol.WalkFetchResponse(buf[hs:], req.hdr.Version, func(t *protocol.FetchTopic) error {
		name = t.Name
		if t.ID != nil {
			name = fetchTopicName(sub, [16]byte(t.ID))
		}
		return nil
	}, func(_ *protocol.FetchTopic, p *protocol.FetchPartition) error {
		s.virtualFetchPartition(req.up, gen, name, p, rw)
		return nil
	})
}

// physicalEpochs maps a request's virtual current and last-fetched epochs
// back, or returns the error that tells the client its metadata is stale.
func physicalEpochs(gen uint32, current, lastFetched *int32) int16 {
	if *current >= 0 {
		phys, ok := routing.PhysicalEpoch(gen, *current)
		if !ok {
			if routing.EpochGeneration(*current) < gen {
				return kerr.FencedLeaderEpoch.Code
			}
			return kerr.UnknownLeaderEpoch.Code
		}
		*current = phys
	}
	if lastFetched != nil && *lastFetched >= 0 {
		// The epoch of the last batch fetched under another
		// generation names an epoch of the other cluster: unknown
		// (-1) here, so the broker skips the divergence check rather
		// than checking against someone else's epoch.
		phys, ok := routing.PhysicalEpoch(gen, *lastFetched)
		if !ok {
			phys = -1
		}
		*lastFetched = phys
	}
	return 0
}

func fetchTopicName(sub *kmsg.FetchRequest, id [16]byte) string {
	for _, t := range sub.Topics {
		if t.TopicID == id {
			return t.Topic
		}
	}
	return ""
}

// noRecords is the records of a partition Ferry answers itself: empty, as
// a broker sends them, not null, which librdkafka refuses ("invalid
// MessageSetSize -1") along with the whole response.
var noRecords = []byte{}

func fetchError(p int32, code int16) kmsg.FetchResponseTopicPartition {
	r := kmsg.NewFetchResponseTopicPartition()
	r.Partition = p
	r.RecordBatches = noRecords
	r.ErrorCode = code
	r.HighWatermark = -1
	r.LastStableOffset = -1
	r.LogStartOffset = -1
	r.PreferredReadReplica = -1
	return r
}

// watermarks are a partition's last answered high watermark, last stable
// offset and log start offset.
type watermarks struct{ hw, lso, logStart int64 }

// fetchPlaceholder answers a partition whose fetch is still parked
// upstream: no records, no error, the last watermarks this connection saw.
func (c *clientConn) fetchPlaceholder(x tp, fetchOffset int64) kmsg.FetchResponseTopicPartition {
	r := kmsg.NewFetchResponseTopicPartition()
	r.Partition = x.p
	r.RecordBatches = noRecords
	r.PreferredReadReplica = -1
	w, ok := c.watermarks[x]
	if !ok || w.hw < fetchOffset {
		w = watermarks{fetchOffset, fetchOffset, -1}
	}
	r.HighWatermark, r.LastStableOffset, r.LogStartOffset = w.hw, w.lso, w.logStart
	return r
}

// errGenerationEnded: a fetch still waited upstream when a switch ended the
// routing generation it was sent under.
var errGenerationEnded = errors.New("the fetch's routing generation ended while it waited upstream")

// generationEnded reports whether a switch has ended the generation req was
// sent under, or Shutdown has begun: either way a fetch parked upstream is
// answered empty now rather than at its MaxWait (the client fetches again,
// from the new cluster or through another member).
func (s *Server) generationEnded(req *request) bool {
	return s.routes.Current().Generation != req.state.Generation || s.draining.Load()
}

// waitFetchPart waits for a fetch part's answer, as pending.wait does, but
// gives up with errGenerationEnded when a switch ends the generation the
// fetch was sent under. No record will come to a long poll parked on the
// cluster a switch left, and a consumer kept there for its MaxWait (5 s by
// franz-go's default) rejoins its group and reads from the new cluster that
// much later; answered empty at the flip, it fetches again at once, meets
// the new generation's epochs and refreshes its metadata. An answer
// already in is taken.
func (s *Server) waitFetchPart(ctx context.Context, req *request, p *upstream.Pending) (*bytebufferpool.ByteBuffer, error) {
	p.Want()
	for {
		changed := s.routes.Changed()
		select {
		case <-p.Done:
			return p.Buf, p.Err
		default:
		}
		if s.generationEnded(req) {
			return nil, errGenerationEnded
		}
		select {
		case <-p.Done:
			return p.Buf, p.Err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-s.drainc:
		}
	}
}

// gatherFetch waits until some part of a split fetch brings records or
// errors, or every part has answered, or a switch ends the generation the
// fetch was sent under (waitFetchPart), then takes every answer already in.
// finished says which parts answered.
func (c *clientConn) gatherFetch(ctx context.Context, req *request, calls []*subCall) (*gathered, []bool, error) {
	g := &gathered{resps: make([]kmsg.Response, len(calls))}
	finished := make([]bool, len(calls))
	waiting := 0
	ready := false
	var gone error // the client left: nobody to answer
	for i, sc := range calls {
		if sc.err != nil {
			finished[i], ready = true, true
			continue
		}
		waiting++
	}
	take := func(i int) {
		finished[i] = true
		waiting--
		buf, err := calls[i].p.Wait(ctx)
		if err != nil {
			if errors.Is(err, upstream.ErrClientClosed) {
				gone = err
			}
			ready = true
			return
		}
		g.bufs = append(g.bufs, buf)
		c.s.virtualAnswer(req, calls[i].req.(*kmsg.FetchRequest), buf.B)
		resp := calls[i].req.ResponseKind()
		if err := decodeResponse(buf, req.hdr.Key, req.hdr.Version, resp); err != nil {
			c.log.Warn("undecodable upstream response", zap.Int32("broker", calls[i].broker), zap.Error(err))
			ready = true
			return
		}
		g.resps[i] = resp
		ready = ready || fetchHasNews(resp.(*kmsg.FetchResponse))
	}
	for _, sc := range calls {
		if sc.err == nil {
			sc.p.Want() // the writer waits for every part
		}
	}
	cases := make([]reflect.SelectCase, 0, len(calls)+2)
	idx := make([]int, 0, len(calls))
	for waiting > 0 && !ready {
		changed := c.s.routes.Changed()
		if c.s.generationEnded(req) {
			break
		}
		cases = append(cases[:0],
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(changed)},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c.s.drainc)})
		idx = idx[:0]
		for i, sc := range calls {
			if !finished[i] {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(sc.p.Done)})
				idx = append(idx, i)
			}
		}
		switch chosen, _, _ := reflect.Select(cases); chosen {
		case 0:
			g.release()
			return nil, nil, ctx.Err()
		case 1, 2: // the routing state changed, or Shutdown began: looked at above
		default:
			take(idx[chosen-3])
		}
	}
	// Take whatever else is already in, without waiting; the rest is
	// answered as empty and its late answer dropped.
	for i, sc := range calls {
		if finished[i] {
			continue
		}
		select {
		case <-sc.p.Done:
			take(i)
		default:
			sc.p.Abandon()
		}
	}
	if gone != nil {
		g.release()
		return nil, nil, gone
	}
	for i, sc := range calls {
		if finished[i] && (sc.err != nil || g.resps[i] == nil) {
			req.up.RefreshSoon()
			break
		}
	}
	return g, finished, nil
}

// fetchHasNews reports whether an answer carries records or errors, which
// the client should get without waiting for the other brokers.
func fetchHasNews(r *kmsg.FetchResponse) bool {
	if r.ErrorCode != 0 {
		return true
	}
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 || len(p.RecordBatches) > 0 {
				return true
			}
		}
	}
	return false
}
