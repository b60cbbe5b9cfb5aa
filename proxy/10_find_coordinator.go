package proxy

// FindCoordinator (key 10), v0-v6. v0-3 carry one key, v4+ a batch.
//
// Ferry looks the real coordinator up on the active cluster unless it has
// it cached (errors such as COORDINATOR_NOT_AVAILABLE reach the client as a
// broker would give them; connections asking for one key at once share one
// lookup) and answers with the Ferry member that hashes from the key. That
// member forwards the group's or transaction's requests to the real
// coordinator; a NOT_COORDINATOR from it drops the cached entry, so the
// client's next FindCoordinator asks the cluster again.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

func handleFindCoordinator(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.FindCoordinatorRequest)
	keys := in.CoordinatorKeys
	if req.hdr.Version < 4 {
		keys = []string{in.CoordinatorKey}
	}
	ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
	defer cancel()
	found, err := req.up.Coordinators(ctx, in.CoordinatorType, keys)
	if err != nil {
		return nil, err
	}
	resp := kmsg.NewPtrFindCoordinatorResponse()
	byID := brokersByID(s.virtualBrokers())
	for _, f := range found {
		out := kmsg.FindCoordinatorResponseCoordinator{Key: f.Key, ErrorCode: f.ErrorCode, ErrorMessage: f.ErrorMessage, NodeID: -1, Port: -1}
		if f.ErrorCode == 0 {
			b := byID[s.virtualCoordinator(req.up, f.Key, f.NodeID)]
			out.NodeID, out.Host, out.Port = b.NodeID, b.Host, b.Port
		}
		resp.Coordinators = append(resp.Coordinators, out)
	}
	if req.hdr.Version < 4 {
		f := resp.Coordinators[0]
		resp.ErrorCode, resp.ErrorMessage, resp.NodeID, resp.Host, resp.Port = f.ErrorCode, f.ErrorMessage, f.NodeID, f.Host, f.Port
		resp.Coordinators = nil
	}
	return localReply(req, resp), nil
}

func brokersByID(bs []routing.Broker) map[int32]routing.Broker {
	m := make(map[int32]routing.Broker, len(bs))
	for _, b := range bs {
		m[b.NodeID] = b
	}
	return m
}
