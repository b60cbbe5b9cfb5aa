package proxy

// OffsetForLeaderEpoch (key 23), v2-v4 from clients (KIP-320 log truncation
// detection). Split by upstream partition leader and merged. Both epochs in
// the request are virtual and mapped back.
//
// An epoch of an older generation is the last epoch a consumer saw before a
// switch. It is answered here, from the end offset the partition had on the
// new cluster when that generation ended (routing.State.Fences): a consumer
// positioned beyond it (a forced switch lost what it read) is brought back
// to it, and any other carries on. Without a recorded end (the partition was
// not mirrored then) the current leader epoch's end is asked for instead:
// nothing known was lost. An epoch of a newer generation than Ferry's is
// UNKNOWN_LEADER_EPOCH, as a broker says of an epoch it has not reached.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

func handleOffsetForLeaderEpoch(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.OffsetForLeaderEpochRequest)
	gen := req.state.Generation
	local := map[tp]int16{}
	fenced := map[tp]fencedEnd{}
	var order []tp
	entries := map[tp]kmsg.OffsetForLeaderEpochRequestTopicPartition{}
	for _, t := range in.Topics {
		for _, p := range t.Partitions {
			x := tp{t.Topic, p.Partition}
			code := physicalEpochs(gen, &p.CurrentLeaderEpoch, nil)
			if code == 0 {
				phys, ok := routing.PhysicalEpoch(gen, p.LeaderEpoch)
				switch {
				case ok:
					p.LeaderEpoch = phys
				case routing.EpochGeneration(p.LeaderEpoch) > gen:
					code = kerr.UnknownLeaderEpoch.Code
				default:
					if end, ok := fenceEnd(req.state, routing.EpochGeneration(p.LeaderEpoch), t.Topic, p.Partition); ok {
						fenced[x] = fencedEnd{epoch: p.LeaderEpoch, end: end}
						continue
					}
					// Nothing recorded: the end of the current epoch.
					pi, ok := req.up.Partition(c.ctx, t.Topic, p.Partition)
					if !ok {
						code = kerr.UnknownTopicOrPartition.Code
						break
					}
					p.LeaderEpoch = pi.Epoch
				}
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
		out := kmsg.NewPtrOffsetForLeaderEpochResponse()
		out.ThrottleMillis = throttle
		for _, t := range in.Topics {
			rt := kmsg.OffsetForLeaderEpochResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				x := tp{t.Topic, p.Partition}
				a, ok := answers[x]
				if f, isFenced := fenced[x]; isFenced {
					a, ok = kmsg.NewOffsetForLeaderEpochResponseTopicPartition(), true
					a.Partition, a.LeaderEpoch, a.EndOffset = p.Partition, f.epoch, f.end
				}
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

// fencedEnd is an answer from the ends recorded at a switch.
type fencedEnd struct {
	epoch int32 // the client's (virtual) epoch, echoed
	end   int64
}

// fenceEnd is the end offset a partition had when generation gen ended, or
// when the first generation after it that has one recorded ended (an upper
// bound of what gen left: a consumer at or below it lost nothing).
func fenceEnd(st routing.State, gen uint32, topic string, partition int32) (int64, bool) {
	for g := gen; g < st.Generation; g++ {
		if end, ok := st.FenceEnd(g, topic, partition); ok {
			return end, true
		}
	}
	return 0, false
}
