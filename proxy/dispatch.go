package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/protocol/kfields"
	"github.com/ferry-gw/ferry/upstream"
)

// ErrUnsupportedVersion closes a connection that sent a key or version
// outside what Ferry advertises; a broker does the same (ApiVersions aside,
// which is answered with UNSUPPORTED_VERSION).
var ErrUnsupportedVersion = errors.New("unsupported API key or version")

// How Ferry treats each client-facing API key. Keys not listed (inter-broker
// and controller RPCs, SASL, streams groups, delegation tokens)
// are not advertised and are refused (SaslHandshake is advertised and
// answered: 17_sasl_handshake.go); so are the admin APIs that only make
// sense against one physical cluster's brokers (DescribeQuorum), whose
// answers would name physical brokers. Partition reassignments are served:
// they name brokers by the lanes Ferry shows (replicaMap, lanes.go).
type route int8

const (
	routeLocal  route = iota + 1 // answered by Ferry
	routeSplit                   // split by partition leader, answers merged
	routeGroup                   // forwarded to the group coordinator
	routeTxn                     // forwarded to the transaction coordinator
	routeFanOut                  // sent to every broker, answers merged
	routeAny                     // any broker (KRaft brokers forward to the controller)
	routeLane                    // whole to the broker behind the client's lane (78_share_fetch.go)
)

var routes = map[int16]route{
	int16(kmsg.Produce):                      routeSplit,
	int16(kmsg.Fetch):                        routeSplit,
	int16(kmsg.ListOffsets):                  routeSplit,
	int16(kmsg.Metadata):                     routeLocal,
	int16(kmsg.OffsetCommit):                 routeGroup,
	int16(kmsg.OffsetFetch):                  routeGroup,
	int16(kmsg.FindCoordinator):              routeLocal,
	int16(kmsg.JoinGroup):                    routeGroup,
	int16(kmsg.Heartbeat):                    routeGroup,
	int16(kmsg.LeaveGroup):                   routeGroup,
	int16(kmsg.SyncGroup):                    routeGroup,
	int16(kmsg.DescribeGroups):               routeGroup,
	int16(kmsg.ListGroups):                   routeFanOut,
	int16(kmsg.ApiVersions):                  routeLocal,
	int16(kmsg.CreateTopics):                 routeAny,
	int16(kmsg.DeleteTopics):                 routeAny,
	int16(kmsg.DeleteRecords):                routeSplit,
	int16(kmsg.InitProducerID):               routeTxn,
	int16(kmsg.OffsetForLeaderEpoch):         routeSplit,
	int16(kmsg.AddPartitionsToTxn):           routeTxn,
	int16(kmsg.AddOffsetsToTxn):              routeTxn,
	int16(kmsg.EndTxn):                       routeTxn,
	int16(kmsg.TxnOffsetCommit):              routeGroup,
	int16(kmsg.DescribeACLs):                 routeAny,
	int16(kmsg.CreateACLs):                   routeAny,
	int16(kmsg.DeleteACLs):                   routeAny,
	int16(kmsg.DescribeConfigs):              routeAny,
	int16(kmsg.AlterConfigs):                 routeAny,
	int16(kmsg.DescribeLogDirs):              routeAny,
	int16(kmsg.CreatePartitions):             routeAny,
	int16(kmsg.DeleteGroups):                 routeGroup,
	int16(kmsg.ElectLeaders):                 routeAny,
	int16(kmsg.AlterPartitionAssignments):    routeAny,
	int16(kmsg.ListPartitionReassignments):   routeAny,
	int16(kmsg.IncrementalAlterConfigs):      routeAny,
	int16(kmsg.OffsetDelete):                 routeGroup,
	int16(kmsg.DescribeClientQuotas):         routeAny,
	int16(kmsg.AlterClientQuotas):            routeAny,
	int16(kmsg.DescribeUserSCRAMCredentials): routeAny,
	int16(kmsg.AlterUserSCRAMCredentials):    routeAny,
	int16(kmsg.UpdateFeatures):               routeAny,
	int16(kmsg.DescribeCluster):              routeLocal,
	int16(kmsg.DescribeProducers):            routeSplit,
	int16(kmsg.DescribeTransactions):         routeTxn,
	int16(kmsg.ListTransactions):             routeFanOut,
	int16(kmsg.ConsumerGroupHeartbeat):       routeGroup,
	int16(kmsg.ConsumerGroupDescribe):        routeGroup,
	int16(kmsg.GetTelemetrySubscriptions):    routeAny,
	int16(kmsg.PushTelemetry):                routeAny,
	int16(kmsg.ListConfigResources):          routeAny,
	int16(kmsg.DescribeTopicPartitions):      routeAny,
	int16(kmsg.StreamsGroupHeartbeat):        routeGroup,
	int16(kmsg.StreamsGroupDescribe):         routeGroup,
	int16(kmsg.ShareGroupHeartbeat):          routeGroup,
	int16(kmsg.ShareGroupDescribe):           routeGroup,
	int16(kmsg.ShareFetch):                   routeLane,
	int16(kmsg.ShareAcknowledge):             routeLane,
	int16(kmsg.DescribeShareGroupOffsets):    routeGroup,
	int16(kmsg.AlterShareGroupOffsets):       routeGroup,
	int16(kmsg.DeleteShareGroupOffsets):      routeGroup,
}

// clientKeys lists every key Ferry serves.
func clientKeys() []int16 {
	ks := make([]int16, 0, len(routes))
	for k := range routes {
		ks = append(ks, k)
	}
	return ks
}

// handler answers one decoded request.
type handler func(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error)

// handlers are the keys Ferry decodes and treats specially; every other
// served key is forwarded as bytes by its route.
var handlers map[int16]handler

func init() {
	handlers = map[int16]handler{
		int16(kmsg.ApiVersions):                handleApiVersions,
		int16(kmsg.Metadata):                   handleMetadata,
		int16(kmsg.FindCoordinator):            handleFindCoordinator,
		int16(kmsg.DescribeCluster):            handleDescribeCluster,
		int16(kmsg.Produce):                    handleProduce,
		int16(kmsg.Fetch):                      handleFetch,
		int16(kmsg.ListOffsets):                handleListOffsets,
		int16(kmsg.OffsetForLeaderEpoch):       handleOffsetForLeaderEpoch,
		int16(kmsg.DeleteRecords):              handleDeleteRecords,
		int16(kmsg.DescribeProducers):          handleDescribeProducers,
		int16(kmsg.ListGroups):                 handleListGroups,
		int16(kmsg.ListTransactions):           handleListTransactions,
		int16(kmsg.SASLHandshake):              handleSASLHandshake,
		int16(kmsg.SASLAuthenticate):           handleSASLAuthenticate,
		int16(kmsg.CreateTopics):               handleCreateTopics,
		int16(kmsg.CreatePartitions):           handleCreatePartitions,
		int16(kmsg.AlterPartitionAssignments):  handleAlterPartitionReassignments,
		int16(kmsg.ListPartitionReassignments): handleListPartitionReassignments,
		int16(kmsg.ShareFetch):                 handleShareFetch,
		int16(kmsg.ShareAcknowledge):           handleShareAcknowledge,
	}
}

// dispatch routes one request. It runs on the connection's reader
// goroutine: everything it sends upstream is sent in arrival order.
func (s *Server) dispatch(c *clientConn, req *request) (*reply, error) {
	h := req.hdr
	if h.Key == int16(kmsg.ApiVersions) && !s.advertised().Supports(h.Key, h.Version) {
		s.metrics.refused(h.Key, reasonUnsupportedVersion)
		return apiVersionsUnsupported(s, req), nil
	}
	if !s.authenticated(c) {
		if err := s.gateUnauthenticated(c, req); err != nil {
			return nil, err
		}
	}
	if h.Key == int16(kmsg.SASLAuthenticate) && s.auth == nil {
		// Only after a successful SaslHandshake, which Ferry never
		// gives (17_sasl_handshake.go).
		return nil, s.refuse(h.Key, reasonSASL, errors.New("SaslAuthenticate: Ferry's listeners offer no SASL and refused the handshake; configure the client without SASL"))
	}
	if !s.advertised().Supports(h.Key, h.Version) || !h.Known {
		reason := reasonUnsupportedVersion
		if _, served := s.advertised()[h.Key]; !served {
			reason = reasonUnknownKey
		}
		return nil, s.refuse(h.Key, reason, fmt.Errorf("%w: %s (key %d) v%d", ErrUnsupportedVersion, kmsg.NameForKey(h.Key), h.Key, h.Version))
	}
	kr := kmsg.RequestForKey(h.Key)
	kr.SetVersion(h.Version)
	if err := kr.ReadFrom(req.body); err != nil {
		return nil, s.refuse(h.Key, reasonMalformedBody, fmt.Errorf("%s v%d: malformed request body: %w", kmsg.NameForKey(h.Key), h.Version, err))
	}
	req.kr = kr
	if req.heldTooLong {
		s.metrics.heldTooLong.Inc()
		if p, ok := kr.(*kmsg.ProduceRequest); ok && p.Acks == 0 {
			return nil, nil
		}
		return localReply(req, s.unwrittenAnswer(req, "ferry: "+errHeldTooLong.Error())), nil
	}
	whole, part := s.enforcePolicy(c, req, kr)
	if whole != nil {
		return whole, nil
	}
	// Items Ferry answers itself (topic_refusals.go), out of what the
	// policy left.
	r, itemPart := s.refuseItems(c, req, kr)
	if r == nil {
		var err error
		if r, err = s.handle(c, req, kr); err != nil {
			// The upstream's fault: answer in the broker's place
			// and keep the connection; the client retries.
			r = s.upstreamFailed(c, req, err)
		}
	}
	if itemPart != nil && r != nil {
		r = itemPart(r)
	}
	if part != nil && r != nil {
		r = part(r)
	}
	return r, nil
}

func (s *Server) handle(c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	if req.up == nil {
		return nil, fmt.Errorf("active cluster %q is not configured", req.state.Active)
	}
	if !req.up.Started.Load() {
		return nil, fmt.Errorf("cluster %q not reached yet", req.up.Name)
	}
	if hf := handlers[req.hdr.Key]; hf != nil {
		return hf(s, c, req, kr)
	}
	switch routes[req.hdr.Key] {
	case routeGroup, routeTxn:
		if faultRefusedCommit(req, kr) {
			c.log.Warn("fault injected: a Kafka Streams commit refused as after a switch that aborted its transaction", zap.String("client_id", req.hdr.ClientID))
			return s.txnReply(req, kr, txnDecision{Verdict: txnRefuse, Code: kerr.UnknownProducerID.Code, Message: abortMsg, Phys: -1}), nil
		}
		return s.forwardCoordinated(c, req, kr)
	case routeAny:
		return s.forwardAny(c, req, kr)
	}
	return nil, fmt.Errorf("%s has no handler", kmsg.NameForKey(req.hdr.Key))
}

// upstreamFailed answers a request whose upstream could not be reached or
// failed with it in flight: the retriable code of its API, a metadata
// refresh so that the retry finds the new leader or coordinator, and a
// count. acks=0 produces get no answer, as ever; nor does a request whose
// client left while it waited (errClientClosed), which is no failure.
func (s *Server) upstreamFailed(c *clientConn, req *request, err error) *reply {
	if errors.Is(err, upstream.ErrClientClosed) {
		return nil // the client left: nobody to answer, nothing failed upstream
	}
	kr := req.kr
	s.metrics.upstreamFailure(req.hdr.Key)
	c.log.Debug("answering in the upstream's place", zap.String("api", kmsg.NameForKey(req.hdr.Key)), zap.Error(err))
	if req.up != nil {
		req.up.RefreshSoon()
	}
	if p, ok := kr.(*kmsg.ProduceRequest); ok {
		if p.Acks == 0 {
			return nil
		}
		// Its batches wait for the client to send them again before
		// the partitions' later ones go on (unansweredProduce); noted
		// before the answer, which may wait for the leader to move.
		s.remapped.refuseUnwritten(req.state.Generation, req, p, kerr.NotLeaderForPartition.Code, func(int, int32) bool { return true })
		s.settleFirsts(req, nil)
	}
	for _, r := range req.remaps {
		// Not written, or not known to be: sent again by the client,
		// and waited for by the partition's later batches.
		s.remapped.answered(req.state.Generation, r, true)
	}
	var ue *upstream.UnreachableError
	if rt := routes[req.hdr.Key]; (rt == routeSplit || rt == routeLane) && req.up != nil && errors.As(err, &ue) {
		// The leader cannot be reached: Ferry says NOT_LEADER once the
		// cluster has moved its partitions (or after leaderWait), not at
		// once. A client retrying at once would spend its retries before
		// the cluster notices the broker is gone (kafkajs has 5); against
		// the dead broker itself each retry first meets a refused
		// connection and a backoff.
		return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
			req.up.WaitLeaderMoved(ctx, ue.Broker, upstream.LeaderWait(kr))
			return s.upstreamAnswer(req, kr, err), nil, nil
		})
	}
	return localReply(req, s.upstreamAnswer(req, kr, err))
}

// upstreamAnswer is the answer to kr in the upstream's place.
func (s *Server) upstreamAnswer(req *request, kr kmsg.Request, err error) kmsg.Response {
	resp := errorResponse(kr, upstreamErrorCode(kr), "ferry: "+clientErrorText(err))
	if req.up != nil {
		// The handler may have made the request's topic IDs physical
		// before it failed: the answer echoes them, so make them virtual.
		snap := req.up.Snapshot()
		kfields.Visit(resp, &kfields.Visitor{TopicID: func(id *[16]byte) {
			if t := snap.ByID[*id]; t != nil {
				*id = t.VID
			}
		}})
	}
	return resp
}

// rawReply answers with an upstream response frame as it came, its
// correlation ID set back to the client's.
func rawReply(req *request, p *upstream.Pending) *reply {
	return &reply{req: req, finish: func(ctx context.Context) ([]byte, func(), error) {
		buf, err := p.Wait(ctx)
		if err != nil {
			return nil, nil, err
		}
		binary.BigEndian.PutUint32(buf.B, uint32(req.hdr.CorrelationID))
		return buf.B, func() { upstream.ResponseBufs.Put(buf) }, nil
	}}
}

// localReply answers with a response Ferry built.
func localReply(req *request, resp kmsg.Response) *reply {
	return &reply{req: req, finish: func(context.Context) ([]byte, func(), error) {
		out, release := encodeResponse(req, resp)
		return out, release, nil
	}}
}

// futureReply answers with what build returns once it can.
func futureReply(req *request, build func(ctx context.Context) (kmsg.Response, func(), error)) *reply {
	return &reply{req: req, finish: func(ctx context.Context) ([]byte, func(), error) {
		resp, done, err := build(ctx)
		if err != nil {
			if done != nil {
				done()
			}
			return nil, nil, err
		}
		out, release := encodeResponse(req, resp)
		if done != nil {
			done() // upstream buffers the response aliased
		}
		return out, release, nil
	}}
}

func encodeResponse(req *request, resp kmsg.Response) ([]byte, func()) {
	resp.SetVersion(req.hdr.Version)
	if req.stats != nil {
		req.stats.CountResponse(resp)
	}
	buf := upstream.EncodedBufs.Get()
	buf.B = protocol.AppendResponseHeader(buf.B[:0], req.hdr.Key, req.hdr.Version, req.hdr.CorrelationID)
	buf.B = resp.AppendTo(buf.B)
	return buf.B, func() { upstream.EncodedBufs.Put(buf) }
}

// decodeResponse parses an upstream response frame into resp (which aliases
// buf: keep buf until resp is encoded).
func decodeResponse(buf *bytebufferpool.ByteBuffer, key, version int16, resp kmsg.Response) error {
	resp.SetVersion(version)
	hs := protocol.ResponseHeaderSize(key, version)
	if len(buf.B) < hs {
		return fmt.Errorf("%s v%d: short response", kmsg.NameForKey(key), version)
	}
	if err := resp.ReadFrom(buf.B[hs:]); err != nil {
		return fmt.Errorf("%s v%d: malformed response: %w", kmsg.NameForKey(key), version, err)
	}
	return nil
}

// encodeRequest re-encodes a rewritten request with the client's header
// fields.
func encodeRequest(req *request, kr kmsg.Request) *bytebufferpool.ByteBuffer {
	// kr's records alias the frame: a spliced one's bytes are read back
	// first (produce_splice.go). A failure is the send's (sendRaw).
	req.fill()
	buf := upstream.EncodedBufs.Get()
	buf.B = protocol.AppendRequestHeader(buf.B[:0], kr, req.hdr.CorrelationID, req.hdr.ClientID)
	buf.B = kr.AppendTo(buf.B)
	return buf
}

// forwardTo sends the request to one broker: the client's own bytes when
// rewritten is false, else kr re-encoded. fix, when set, rewrites the decoded
// response; without it the response is passed through as bytes.
func (s *Server) forwardTo(c *clientConn, req *request, broker int32, kr kmsg.Request, rewritten bool, fix func(kmsg.Response) error) (*reply, error) {
	frame := req.frame.B
	if rewritten {
		buf := encodeRequest(req, kr)
		defer upstream.EncodedBufs.Put(buf)
		frame = buf.B
	}
	p, err := c.sendRaw(req, broker, frame, true)
	if err != nil {
		return nil, err
	}
	if fix == nil {
		return rawReply(req, p), nil
	}
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		buf, err := p.Wait(ctx)
		if err != nil {
			return nil, nil, err
		}
		done := func() { upstream.ResponseBufs.Put(buf) }
		resp := kr.ResponseKind()
		if err := decodeResponse(buf, req.hdr.Key, req.hdr.Version, resp); err != nil {
			return nil, done, err
		}
		if err := fix(resp); err != nil {
			return nil, done, err
		}
		return resp, done, nil
	}), nil
}
