package proxy

// OffsetForLeaderEpoch (key 23), v2-v4 from clients (KIP-320 log truncation
// detection). Split by upstream partition leader and merged. Both epochs in
// the request are virtual and mapped back; an epoch of an older generation
// is answered FENCED_LEADER_EPOCH until the switchover records per-partition
// end offsets to answer it from.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

func handleOffsetForLeaderEpoch(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.OffsetForLeaderEpochRequest)
	gen := req.state.Generation
	local := map[tp]int16{}
	reqParts := map[tp]kmsg.OffsetForLeaderEpochRequestTopicPartition{}
	var all []tp
	for _, t := range in.Topics {
		for _, p := range t.Partitions {
			x := tp{t.Topic, p.Partition}
			code := physicalEpochs(gen, &p.CurrentLeaderEpoch, nil)
			if code == 0 {
				phys, ok := routing.PhysicalEpoch(gen, p.LeaderEpoch)
				if !ok {
					code = kerr.FencedLeaderEpoch.Code
				}
				p.LeaderEpoch = phys
			}
			if code != 0 {
				local[x] = code
				continue
			}
			reqParts[x] = p
			all = append(all, x)
		}
	}
	groups, errs := c.byLeader(c.ctx, req.up, all)
	for x, code := range errs {
		local[x] = code
	}
	parts := map[int32]kmsg.Request{}
	for b, xs := range groups {
		sub := &kmsg.OffsetForLeaderEpochRequest{Version: in.Version, ReplicaID: -1}
		idx := map[string]int{}
		for _, x := range xs {
			i, ok := idx[x.topic]
			if !ok {
				i = len(sub.Topics)
				idx[x.topic] = i
				sub.Topics = append(sub.Topics, kmsg.OffsetForLeaderEpochRequestTopic{Topic: x.topic})
			}
			sub.Topics[i].Partitions = append(sub.Topics[i].Partitions, reqParts[x])
		}
		parts[b] = sub
	}
	calls := c.sendSplit(req, parts, true)
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		g, err := c.gather(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		answers := map[tp]kmsg.OffsetForLeaderEpochResponseTopicPartition{}
		out := kmsg.NewPtrOffsetForLeaderEpochResponse()
		for _, r := range g.resps {
			if r == nil {
				continue
			}
			resp := r.(*kmsg.OffsetForLeaderEpochResponse)
			out.ThrottleMillis = max(out.ThrottleMillis, resp.ThrottleMillis)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					p.LeaderEpoch = routing.VirtualEpoch(gen, p.LeaderEpoch)
					answers[tp{t.Topic, p.Partition}] = p
				}
			}
		}
		for _, t := range in.Topics {
			rt := kmsg.OffsetForLeaderEpochResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p.Partition}
				a, ok := answers[x]
				if !ok {
					code, isLocal := local[x]
					if !isLocal {
						code = kerr.NotLeaderForPartition.Code
					}
					a = kmsg.NewOffsetForLeaderEpochResponseTopicPartition()
					a.Partition, a.ErrorCode, a.LeaderEpoch, a.EndOffset = p.Partition, code, -1, -1
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		return out, g.release, nil
	}), nil
}
