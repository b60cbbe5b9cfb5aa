package proxy

// ShareFetch (key 78) and ShareAcknowledge (key 79): KIP-932 share groups.
//
// A share consumer keeps a share session with each broker it fetches from,
// keyed on the broker by group and member, and numbered by an epoch the
// client increments with every request; an incremental request may name no
// partition at all. So these requests are not split by partition leader as
// Fetch is: each goes whole to one physical broker, the one behind the lane
// the client sent it to (lanes.go), and every request of a session reaches
// the same broker. A partition that broker does not lead is answered by the
// broker itself NOT_LEADER_OR_FOLLOWER with its leader, which Ferry makes
// the lane that stands for that leader: the client moves the partition
// there, as it would between brokers. Where a lane stands for no single
// physical broker (a listener of no lane, or fewer lanes than brokers), the
// request goes to the leader of the first partition it names, and an
// empty one to where this connection's last went.
//
// Topic IDs are virtual both ways, a partition's leader is the lane of its
// physical leader on the member that owns it, leader epochs are virtual,
// node endpoints list Ferry's lanes, and the record batches of a ShareFetch
// get what a Fetch's get (batchRewrite); their records are not decoded.
// Unknown topic IDs are answered UNKNOWN_TOPIC_ID by Ferry
// (topic_refusals.go). Share fetches, long polls, use the connections
// fetches use, so that the acknowledgements and heartbeats sent meanwhile
// do not queue behind them.
//
// Across a switch: the new cluster's brokers know neither the session nor
// the member; they answer SHARE_SESSION_NOT_FOUND (or the group's own
// errors), on which the client opens a new session and rejoins. Records it
// had acquired from the old cluster cannot be acknowledged there; the
// share group's start offsets, copied by the switch, make them delivered
// again (mirror/sync.go, syncShareGroups).

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/upstream"
)

// shareTarget is where a connection's last share request without a lane
// of its own went.
type shareTarget struct {
	gen    uint32
	broker int32
}

func handleShareFetch(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	return s.forwardShare(c, req, kr)
}

func handleShareAcknowledge(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	return s.forwardShare(c, req, kr)
}

// shareParts lists the topic IDs (virtual) and first partitions a share
// request names, for choosing its broker.
func shareParts(kr kmsg.Request) (ids [][16]byte, firsts []int32) {
	switch r := kr.(type) {
	case *kmsg.ShareFetchRequest:
		for _, t := range r.Topics {
			if len(t.Partitions) > 0 {
				ids, firsts = append(ids, t.TopicID), append(firsts, t.Partitions[0].Partition)
			}
		}
	case *kmsg.ShareAcknowledgeRequest:
		for _, t := range r.Topics {
			if len(t.Partitions) > 0 {
				ids, firsts = append(ids, t.TopicID), append(firsts, t.Partitions[0].Partition)
			}
		}
	}
	return ids, firsts
}

// shareBroker is the physical broker a share request goes to (see the top
// of the file).
func (s *Server) shareBroker(ctx context.Context, c *clientConn, req *request, kr kmsg.Request) (int32, error) {
	u, gen := req.up, req.state.Generation
	if c.lane >= 0 {
		only, n := int32(-1), 0
		for b := range u.Snapshot().Brokers {
			if u.Lane(b, s.lanes) == c.lane {
				only, n = b, n+1
			}
		}
		if n == 1 {
			return only, nil
		}
	}
	ids, firsts := shareParts(kr)
	for i, vid := range ids {
		t := u.TopicByVID(ctx, vid)
		if t == nil {
			continue
		}
		if p, ok := u.Partition(ctx, t.Name, firsts[i]); ok && p.Leader >= 0 {
			c.shareTo = shareTarget{gen, p.Leader}
			return p.Leader, nil
		}
	}
	if c.shareTo.gen == gen && c.shareTo.broker >= 0 {
		if _, ok := u.Snapshot().Brokers[c.shareTo.broker]; ok {
			return c.shareTo.broker, nil
		}
	}
	return u.AnyBroker()
}

// forwardShare sends a ShareFetch or ShareAcknowledge to its broker and
// makes the answer virtual.
func (s *Server) forwardShare(c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
	defer cancel()
	u, gen := req.up, req.state.Generation
	b, err := s.shareBroker(ctx, c, req, kr)
	if err != nil {
		return nil, err
	}
	// The IDs left are ones Ferry issued (unknown ones were taken out:
	// topic_refusals.go); names by physical ID, for the answer's leaders.
	s.translate(ctx, u, gen, kr, toPhysical)
	buf := encodeRequest(req, kr)
	var p *upstream.Pending
	if _, long := kr.(*kmsg.ShareFetchRequest); long {
		c.upsMu.Lock()
		var uc *upstream.Conn
		if uc, err = c.fetchConn(u, b); err == nil {
			s.metrics.bytesUp.Add(float64(len(buf.B) + 4))
			p, err = uc.SendFrame(buf.B, true, false, nil) // share fetches are not writes
		}
		c.upsMu.Unlock()
	} else {
		p, err = c.sendRaw(req, b, buf.B, true)
	}
	upstream.EncodedBufs.Put(buf)
	if err != nil {
		return nil, err
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
		s.virtualShare(u, gen, resp)
		return resp, done, nil
	}), nil
}

// virtualShare makes a broker's ShareFetch or ShareAcknowledge answer
// virtual, in place: leaders (by physical topic ID, before the IDs are
// made virtual), node endpoints, record batches, then topic IDs and
// leader epochs (translate).
func (s *Server) virtualShare(u *upstream.Cluster, gen uint32, resp kmsg.Response) {
	snap := u.Snapshot()
	name := func(id [16]byte) string {
		if t := snap.ByID[id]; t != nil {
			return t.Name
		}
		return ""
	}
	leader := func(topic string, p int32, id *int32, code int16) {
		if upstream.LeaderMoved(code) {
			u.RefreshSoon()
		}
		switch {
		case *id < 0:
		case topic == "":
			*id = -1 // a topic Ferry does not know: no hint
		default:
			*id = s.virtualLeader(u, topic, p, *id)
		}
	}
	switch r := resp.(type) {
	case *kmsg.ShareFetchResponse:
		rw := s.batchRewrite(u, gen)
		for ti := range r.Topics {
			t := &r.Topics[ti]
			n := name(t.TopicID)
			for pi := range t.Partitions {
				p := &t.Partitions[pi]
				leader(n, p.Partition, &p.CurrentLeader.LeaderID, p.ErrorCode)
				if len(p.Records) > 0 {
					protocol.RewriteRecords(p.Records, rw)
				}
			}
		}
		if len(r.NodeEndpoints) > 0 {
			r.NodeEndpoints = r.NodeEndpoints[:0]
			for _, b := range s.virtualBrokers() {
				r.NodeEndpoints = append(r.NodeEndpoints, kmsg.ShareFetchResponseNodeEndpoint{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
			}
		}
	case *kmsg.ShareAcknowledgeResponse:
		for ti := range r.Topics {
			t := &r.Topics[ti]
			n := name(t.TopicID)
			for pi := range t.Partitions {
				p := &t.Partitions[pi]
				leader(n, p.Partition, &p.CurrentLeader.LeaderID, p.ErrorCode)
			}
		}
		if len(r.NodeEndpoints) > 0 {
			r.NodeEndpoints = r.NodeEndpoints[:0]
			for _, b := range s.virtualBrokers() {
				r.NodeEndpoints = append(r.NodeEndpoints, kmsg.ShareAcknowledgeResponseNodeEndpoint{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
			}
		}
	}
	s.translate(context.Background(), u, gen, resp, toVirtual)
}
