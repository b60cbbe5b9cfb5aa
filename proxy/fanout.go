package proxy

// ListGroups (key 16) and ListTransactions (key 66) ask every broker (each
// knows only the groups or transactions it coordinates) and merge the
// answers. A broker that cannot be reached turns the answer into
// COORDINATOR_NOT_AVAILABLE, retriable, rather than a silently short list.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

func (c *clientConn) fanOut(req *request, kr kmsg.Request) []*subCall {
	parts := map[int32]kmsg.Request{}
	for b := range req.up.Snapshot().Brokers {
		parts[b] = kr
	}
	return c.sendSplit(req, parts, true, false)
}

func handleListGroups(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	calls := c.fanOut(req, kr)
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		g, err := c.gather(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		out := kmsg.NewPtrListGroupsResponse()
		seen := map[string]bool{}
		for _, r := range g.resps {
			if r == nil {
				out.ErrorCode = kerr.CoordinatorNotAvailable.Code
				continue
			}
			resp := r.(*kmsg.ListGroupsResponse)
			out.ThrottleMillis = max(out.ThrottleMillis, resp.ThrottleMillis)
			if resp.ErrorCode != 0 && out.ErrorCode == 0 {
				out.ErrorCode = resp.ErrorCode
			}
			for _, grp := range resp.Groups {
				if !seen[grp.Group] {
					seen[grp.Group] = true
					out.Groups = append(out.Groups, grp)
				}
			}
		}
		return out, g.release, nil
	}), nil
}

func handleListTransactions(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.ListTransactionsRequest)
	gen := req.state.Generation
	// A producer ID of another generation names another producer here:
	// dropped from the filters. When none is left the answer is empty,
	// not every transaction (no filter means no filtering).
	filters := in.ProducerIDFilters[:0]
	for _, pid := range in.ProducerIDFilters {
		if phys, ok := routing.PhysicalPID(gen, pid); ok {
			filters = append(filters, phys)
		}
	}
	if len(in.ProducerIDFilters) > 0 && len(filters) == 0 {
		s.metrics.refused(req.hdr.Key, reasonOtherGeneration)
		return localReply(req, kmsg.NewPtrListTransactionsResponse()), nil
	}
	in.ProducerIDFilters = filters
	calls := c.fanOut(req, in)
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		g, err := c.gather(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		out := kmsg.NewPtrListTransactionsResponse()
		for _, r := range g.resps {
			if r == nil {
				out.ErrorCode = kerr.CoordinatorNotAvailable.Code
				continue
			}
			resp := r.(*kmsg.ListTransactionsResponse)
			out.ThrottleMillis = max(out.ThrottleMillis, resp.ThrottleMillis)
			if resp.ErrorCode != 0 && out.ErrorCode == 0 {
				out.ErrorCode = resp.ErrorCode
			}
			out.UnknownStateFilters = resp.UnknownStateFilters
			for _, t := range resp.TransactionStates {
				t.ProducerID = routing.VirtualPID(gen, t.ProducerID)
				out.TransactionStates = append(out.TransactionStates, t)
			}
		}
		return out, g.release, nil
	}), nil
}
