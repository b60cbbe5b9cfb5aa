package proxy

// DeleteRecords (key 21), v0-v2: split by upstream partition leader and
// merged. Nothing in it carries physical identity.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleDeleteRecords(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.DeleteRecordsRequest)
	reqParts := map[tp]kmsg.DeleteRecordsRequestTopicPartition{}
	var all []tp
	for _, t := range in.Topics {
		for _, p := range t.Partitions {
			x := tp{t.Topic, p.Partition}
			reqParts[x] = p
			all = append(all, x)
		}
	}
	groups, local := c.byLeader(c.ctx, req.up, all)
	parts := map[int32]kmsg.Request{}
	for b, xs := range groups {
		sub := &kmsg.DeleteRecordsRequest{Version: in.Version, TimeoutMillis: in.TimeoutMillis}
		idx := map[string]int{}
		for _, x := range xs {
			i, ok := idx[x.topic]
			if !ok {
				i = len(sub.Topics)
				idx[x.topic] = i
				sub.Topics = append(sub.Topics, kmsg.DeleteRecordsRequestTopic{Topic: x.topic})
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
		answers := map[tp]kmsg.DeleteRecordsResponseTopicPartition{}
		out := kmsg.NewPtrDeleteRecordsResponse()
		for _, r := range g.resps {
			if r == nil {
				continue
			}
			resp := r.(*kmsg.DeleteRecordsResponse)
			out.ThrottleMillis = max(out.ThrottleMillis, resp.ThrottleMillis)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					answers[tp{t.Topic, p.Partition}] = p
				}
			}
		}
		for _, t := range in.Topics {
			rt := kmsg.DeleteRecordsResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p.Partition}
				a, ok := answers[x]
				if !ok {
					code, isLocal := local[x]
					if !isLocal {
						code = kerr.NotLeaderForPartition.Code
					}
					a = kmsg.NewDeleteRecordsResponseTopicPartition()
					a.Partition, a.ErrorCode, a.LowWatermark = p.Partition, code, -1
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		return out, g.release, nil
	}), nil
}
