package proxy

// ListOffsets (key 2), v1-v11 (Kafka 4.x's floor is v1). Split by upstream
// partition leader and merged; the current leader epoch in the request is
// mapped back to the physical one, the leader epoch in the answer made
// virtual. The replica ID is always -1: Ferry speaks as a consumer.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

func handleListOffsets(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.ListOffsetsRequest)
	gen := req.state.Generation
	local := map[tp]int16{}
	reqParts := map[tp]kmsg.ListOffsetsRequestTopicPartition{}
	var all []tp
	for _, t := range in.Topics {
		for _, p := range t.Partitions {
			x := tp{t.Topic, p.Partition}
			if code := physicalEpochs(gen, &p.CurrentLeaderEpoch, nil); code != 0 {
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
		sub := &kmsg.ListOffsetsRequest{Version: in.Version, ReplicaID: -1, IsolationLevel: in.IsolationLevel, TimeoutMillis: in.TimeoutMillis}
		idx := map[string]int{}
		for _, x := range xs {
			i, ok := idx[x.topic]
			if !ok {
				i = len(sub.Topics)
				idx[x.topic] = i
				sub.Topics = append(sub.Topics, kmsg.ListOffsetsRequestTopic{Topic: x.topic})
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
		answers := map[tp]kmsg.ListOffsetsResponseTopicPartition{}
		out := kmsg.NewPtrListOffsetsResponse()
		for _, r := range g.resps {
			if r == nil {
				continue
			}
			resp := r.(*kmsg.ListOffsetsResponse)
			out.ThrottleMillis = max(out.ThrottleMillis, resp.ThrottleMillis)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					p.LeaderEpoch = routing.VirtualEpoch(gen, p.LeaderEpoch)
					answers[tp{t.Topic, p.Partition}] = p
				}
			}
		}
		for _, t := range in.Topics {
			rt := kmsg.ListOffsetsResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p.Partition}
				a, ok := answers[x]
				if !ok {
					code, isLocal := local[x]
					if !isLocal {
						code = kerr.NotLeaderForPartition.Code
					}
					a = kmsg.NewListOffsetsResponseTopicPartition()
					a.Partition, a.ErrorCode, a.Offset, a.Timestamp, a.LeaderEpoch = p.Partition, code, -1, -1, -1
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		return out, g.release, nil
	}), nil
}
