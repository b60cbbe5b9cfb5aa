package proxy

// ListOffsets (key 2), v1-v11 (Kafka 4.x's floor is v1). Split by upstream
// partition leader and merged; the current leader epoch in the request is
// mapped back to the physical one, the leader epoch in the answer made
// virtual. The replica ID is always -1: Ferry speaks as a consumer.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

func handleListOffsets(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.ListOffsetsRequest)
	gen := req.state.Generation
	local := map[tp]int16{}
	var order []tp
	entries := map[tp]kmsg.ListOffsetsRequestTopicPartition{}
	for _, t := range in.Topics {
		for _, p := range t.Partitions {
			x := tp{t.Topic, p.Partition}
			if code := physicalEpochs(gen, &p.CurrentLeaderEpoch, nil); code != 0 {
				local[x] = code
				continue
			}
			entries[x] = p
			order = append(order, x)
		}
	}
	calls := splitByLeader(c, req, order, entries, local,
		func() kmsg.Request {
			return &kmsg.ListOffsetsRequest{Version: in.Version, ReplicaID: -1, IsolationLevel: in.IsolationLevel, TimeoutMillis: in.TimeoutMillis}
		},
		func(r kmsg.Request, topic string, ps []kmsg.ListOffsetsRequestTopicPartition) {
			sub := r.(*kmsg.ListOffsetsRequest)
			sub.Topics = append(sub.Topics, kmsg.ListOffsetsRequestTopic{Topic: topic, Partitions: ps})
		})
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		answers, throttle, release, err := gatherAnswers(ctx, c, req, calls, func(r kmsg.Response, put func(tp, kmsg.ListOffsetsResponseTopicPartition)) int32 {
			resp := r.(*kmsg.ListOffsetsResponse)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if upstream.LeaderMoved(p.ErrorCode) {
						req.up.RefreshSoon()
					}
					p.LeaderEpoch = routing.VirtualEpoch(gen, p.LeaderEpoch)
					put(tp{t.Topic, p.Partition}, p)
				}
			}
			return resp.ThrottleMillis
		})
		if err != nil {
			return nil, nil, err
		}
		out := kmsg.NewPtrListOffsetsResponse()
		out.ThrottleMillis = throttle
		for _, t := range in.Topics {
			rt := kmsg.ListOffsetsResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p.Partition}
				a, ok := answers[x]
				if !ok {
					a = kmsg.NewListOffsetsResponseTopicPartition()
					a.Partition, a.ErrorCode, a.Offset, a.Timestamp, a.LeaderEpoch = p.Partition, unanswered(local, x), -1, -1, -1
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		return out, release, nil
	}), nil
}
