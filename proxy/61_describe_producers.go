package proxy

// DescribeProducers (key 61), v0: split by upstream partition leader and
// merged; producer IDs in the answer are made virtual.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

func handleDescribeProducers(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.DescribeProducersRequest)
	gen := req.state.Generation
	var order []tp
	entries := map[tp]int32{}
	for _, t := range in.Topics {
		for _, p := range t.Partitions {
			x := tp{t.Topic, p}
			entries[x] = p
			order = append(order, x)
		}
	}
	local := map[tp]int16{}
	calls := splitByLeader(c, req, order, entries, local,
		func() kmsg.Request { return &kmsg.DescribeProducersRequest{Version: in.Version} },
		func(r kmsg.Request, topic string, ps []int32) {
			sub := r.(*kmsg.DescribeProducersRequest)
			sub.Topics = append(sub.Topics, kmsg.DescribeProducersRequestTopic{Topic: topic, Partitions: ps})
		})
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		answers, throttle, release, err := gatherAnswers(ctx, c, req, calls, func(r kmsg.Response, put func(tp, kmsg.DescribeProducersResponseTopicPartition)) int32 {
			resp := r.(*kmsg.DescribeProducersResponse)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					for i := range p.ActiveProducers {
						p.ActiveProducers[i].ProducerID = routing.VirtualPID(gen, p.ActiveProducers[i].ProducerID)
					}
					put(tp{t.Topic, p.Partition}, p)
				}
			}
			return resp.ThrottleMillis
		})
		if err != nil {
			return nil, nil, err
		}
		out := kmsg.NewPtrDescribeProducersResponse()
		out.ThrottleMillis = throttle
		for _, t := range in.Topics {
			rt := kmsg.DescribeProducersResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p}
				a, ok := answers[x]
				if !ok {
					a = kmsg.NewDescribeProducersResponseTopicPartition()
					a.Partition, a.ErrorCode = p, unanswered(local, x)
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		return out, release, nil
	}), nil
}
