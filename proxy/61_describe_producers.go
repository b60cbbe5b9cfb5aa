package proxy

// DescribeProducers (key 61), v0: split by upstream partition leader and
// merged; producer IDs in the answer are made virtual.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

func handleDescribeProducers(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.DescribeProducersRequest)
	gen := req.state.Generation
	var all []tp
	for _, t := range in.Topics {
		for _, p := range t.Partitions {
			all = append(all, tp{t.Topic, p})
		}
	}
	groups, local := c.byLeader(c.ctx, req.up, all)
	parts := map[int32]kmsg.Request{}
	for b, xs := range groups {
		sub := &kmsg.DescribeProducersRequest{Version: in.Version}
		idx := map[string]int{}
		for _, x := range xs {
			i, ok := idx[x.topic]
			if !ok {
				i = len(sub.Topics)
				idx[x.topic] = i
				sub.Topics = append(sub.Topics, kmsg.DescribeProducersRequestTopic{Topic: x.topic})
			}
			sub.Topics[i].Partitions = append(sub.Topics[i].Partitions, x.p)
		}
		parts[b] = sub
	}
	calls := c.sendSplit(req, parts, true)
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		g, err := c.gather(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		answers := map[tp]kmsg.DescribeProducersResponseTopicPartition{}
		out := kmsg.NewPtrDescribeProducersResponse()
		for _, r := range g.resps {
			if r == nil {
				continue
			}
			resp := r.(*kmsg.DescribeProducersResponse)
			out.ThrottleMillis = max(out.ThrottleMillis, resp.ThrottleMillis)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					for i := range p.ActiveProducers {
						p.ActiveProducers[i].ProducerID = routing.VirtualPID(gen, p.ActiveProducers[i].ProducerID)
					}
					answers[tp{t.Topic, p.Partition}] = p
				}
			}
		}
		for _, t := range in.Topics {
			rt := kmsg.DescribeProducersResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p}
				a, ok := answers[x]
				if !ok {
					code, isLocal := local[x]
					if !isLocal {
						code = kerr.NotLeaderForPartition.Code
					}
					a = kmsg.NewDescribeProducersResponseTopicPartition()
					a.Partition, a.ErrorCode = p, code
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		return out, g.release, nil
	}), nil
}
