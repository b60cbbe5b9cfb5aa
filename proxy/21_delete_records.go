package proxy

// DeleteRecords (key 21), v0-v2: split by upstream partition leader and
// merged. Nothing in it carries physical identity.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleDeleteRecords(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.DeleteRecordsRequest)
	var order []tp
	entries := map[tp]kmsg.DeleteRecordsRequestTopicPartition{}
	for _, t := range in.Topics {
		for _, p := range t.Partitions {
			x := tp{t.Topic, p.Partition}
			entries[x] = p
			order = append(order, x)
		}
	}
	local := map[tp]int16{}
	calls := splitByLeader(c, req, order, entries, local,
		func() kmsg.Request {
			return &kmsg.DeleteRecordsRequest{Version: in.Version, TimeoutMillis: in.TimeoutMillis}
		},
		func(r kmsg.Request, topic string, ps []kmsg.DeleteRecordsRequestTopicPartition) {
			sub := r.(*kmsg.DeleteRecordsRequest)
			sub.Topics = append(sub.Topics, kmsg.DeleteRecordsRequestTopic{Topic: topic, Partitions: ps})
		})
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		answers, throttle, release, err := gatherAnswers(ctx, c, req, calls, func(r kmsg.Response, put func(tp, kmsg.DeleteRecordsResponseTopicPartition)) int32 {
			resp := r.(*kmsg.DeleteRecordsResponse)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					put(tp{t.Topic, p.Partition}, p)
				}
			}
			return resp.ThrottleMillis
		})
		if err != nil {
			return nil, nil, err
		}
		out := kmsg.NewPtrDeleteRecordsResponse()
		out.ThrottleMillis = throttle
		for _, t := range in.Topics {
			rt := kmsg.DeleteRecordsResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p.Partition}
				a, ok := answers[x]
				if !ok {
					a = kmsg.NewDeleteRecordsResponseTopicPartition()
					a.Partition, a.ErrorCode, a.LowWatermark = p.Partition, unanswered(local, x), -1
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		return out, release, nil
	}), nil
}
