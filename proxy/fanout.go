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

// gatherFanOut answers a fanned-out request with one answer, out: each
// broker's answer added to it by add, its throttle the longest, its error
// the first a broker gave, or COORDINATOR_NOT_AVAILABLE when a broker did
// not answer. header finds an answer's error code and throttle.
func gatherFanOut[R kmsg.Response](c *clientConn, req *request, calls []*subCall, newOut func() R,
	header func(R) (errorCode *int16, throttleMillis *int32), add func(out, resp R)) *reply {
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		g, err := c.gather(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		out := newOut()
		code, throttle := header(out)
		for _, r := range g.resps {
			if r == nil {
				*code = kerr.CoordinatorNotAvailable.Code
				continue
			}
			resp := r.(R)
			respCode, respThrottle := header(resp)
			*throttle = max(*throttle, *respThrottle)
			if *respCode != 0 && *code == 0 {
				*code = *respCode
			}
			add(out, resp)
		}
		return out, g.release, nil
	})
}

func handleListGroups(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	seen := map[string]bool{} // the reply is built once
	return gatherFanOut(c, req, c.fanOut(req, kr), kmsg.NewPtrListGroupsResponse,
		func(r *kmsg.ListGroupsResponse) (*int16, *int32) { return &r.ErrorCode, &r.ThrottleMillis },
		func(out, resp *kmsg.ListGroupsResponse) {
			for _, grp := range resp.Groups {
				if !seen[grp.Group] {
					seen[grp.Group] = true
					out.Groups = append(out.Groups, grp)
				}
			}
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
	return gatherFanOut(c, req, c.fanOut(req, in), kmsg.NewPtrListTransactionsResponse,
		func(r *kmsg.ListTransactionsResponse) (*int16, *int32) { return &r.ErrorCode, &r.ThrottleMillis },
		func(out, resp *kmsg.ListTransactionsResponse) {
			out.UnknownStateFilters = resp.UnknownStateFilters
			for _, t := range resp.TransactionStates {
				t.ProducerID = routing.VirtualPID(gen, t.ProducerID)
				out.TransactionStates = append(out.TransactionStates, t)
			}
		}), nil
}
