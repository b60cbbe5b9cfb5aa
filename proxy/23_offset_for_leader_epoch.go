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
	var order []tp
	entries := map[tp]kmsg.OffsetForLeaderEpochRequestTopicPartition{}
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
			entries[x] = p
			order = append(order, x)
		}
	}
	calls := splitByLeader(c, req, order, entries, local,
		func() kmsg.Request { return &kmsg.OffsetForLeaderEpochRequest{Version: in.Version, ReplicaID: -1} },
		func(r kmsg.Request, topic string, ps []kmsg.OffsetForLeaderEpochRequestTopicPartition) {
			sub := r.(*kmsg.OffsetForLeaderEpochRequest)
			sub.Topics = append(sub.Topics, kmsg.OffsetForLeaderEpochRequestTopic{Topic: topic, Partitions: ps})
		})
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		answers, throttle, release, err := gatherAnswers(ctx, c, req, calls, func(r kmsg.Response, put func(tp, kmsg.OffsetForLeaderEpochResponseTopicPartition)) int32 {
			resp := r.(*kmsg.OffsetForLeaderEpochResponse)
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if leaderMoved(p.ErrorCode) {
						req.up.refreshSoon()
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
		out := kmsg.NewPtrOffsetForLeaderEpochResponse()
		out.ThrottleMillis = throttle
		for _, t := range in.Topics {
			rt := kmsg.OffsetForLeaderEpochResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p.Partition}
				a, ok := answers[x]
				if !ok {
					a = kmsg.NewOffsetForLeaderEpochResponseTopicPartition()
					a.Partition, a.ErrorCode, a.LeaderEpoch, a.EndOffset = p.Partition, unanswered(local, x), -1, -1
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		return out, release, nil
	}), nil
}
