package proxy

// Fetch (key 1), v4-v18 (Kafka 4.x's floor is v4).
//
// Split by upstream partition leader and merged; each part keeps the
// client's MaxWait and MinBytes, so the answer comes when every leader has
// answered. KIP-227 fetch sessions are per broker and cannot survive a
// switch, so Ferry does not open any: every upstream fetch is a full,
// sessionless one (session ID 0, epoch -1), and the client is answered with
// session ID 0, which makes it keep sending full fetches.
//
// Record bytes are not decoded. Under a generation other than 0 the
// partition leader epoch in each batch header (outside the CRC) is made
// virtual. Leader epochs in the request are mapped back to physical ones; an
// epoch of another generation is answered FENCED_LEADER_EPOCH (or
// UNKNOWN_LEADER_EPOCH if newer) so the client refreshes its metadata.
// v13+ addresses topics by ID. Preferred read replicas are never offered:
// a client reads through Ferry only.

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
)

func handleFetch(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.FetchRequest)
	gen := req.state.Generation
	byID := req.hdr.Version >= 13

	local := map[int]map[int32]int16{}
	fail := func(ti int, p int32, code int16) {
		if local[ti] == nil {
			local[ti] = map[int32]int16{}
		}
		local[ti][p] = code
	}
	parts := map[int32]kmsg.Request{}
	subTopic := map[int32]map[int]int{}
	names := make([]string, len(in.Topics))
	for ti := range in.Topics {
		t := &in.Topics[ti]
		name, physID := t.Topic, t.TopicID
		if byID {
			info := req.up.topicByVID(c.ctx, t.TopicID)
			if info == nil {
				for _, p := range t.Partitions {
					fail(ti, p.Partition, kerr.UnknownTopicID.Code)
				}
				continue
			}
			name, physID = info.name, info.id
		}
		names[ti] = name
		for pi := range t.Partitions {
			p := t.Partitions[pi]
			if code := physicalEpochs(gen, &p.CurrentLeaderEpoch, &p.LastFetchedEpoch); code != 0 {
				fail(ti, p.Partition, code)
				continue
			}
			pinfo, ok := req.up.partition(c.ctx, name, p.Partition)
			switch {
			case !ok:
				fail(ti, p.Partition, kerr.UnknownTopicOrPartition.Code)
				continue
			case pinfo.leader < 0:
				fail(ti, p.Partition, kerr.NotLeaderForPartition.Code)
				continue
			}
			sub, _ := parts[pinfo.leader].(*kmsg.FetchRequest)
			if sub == nil {
				sub = &kmsg.FetchRequest{Version: in.Version, ReplicaID: -1, MaxWaitMillis: in.MaxWaitMillis, MinBytes: in.MinBytes, MaxBytes: in.MaxBytes, IsolationLevel: in.IsolationLevel, SessionID: 0, SessionEpoch: -1}
				sub.ReplicaState.ID = -1
				sub.ReplicaState.Epoch = -1
				parts[pinfo.leader] = sub
				subTopic[pinfo.leader] = map[int]int{}
			}
			idx, ok := subTopic[pinfo.leader][ti]
			if !ok {
				idx = len(sub.Topics)
				subTopic[pinfo.leader][ti] = idx
				sub.Topics = append(sub.Topics, kmsg.FetchRequestTopic{Topic: name, TopicID: physID})
			}
			sub.Topics[idx].Partitions = append(sub.Topics[idx].Partitions, p)
		}
	}
	calls := c.sendSplit(req, parts, true)
	maxWait := time.Duration(in.MaxWaitMillis) * time.Millisecond
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		if len(calls) == 0 && len(local) == 0 && maxWait > 0 {
			// Nothing to fetch: answer after MaxWait, as a broker would.
			t := time.NewTimer(maxWait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, nil, ctx.Err()
			}
		}
		g, err := c.gather(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		type tp struct {
			topic string
			p     int32
		}
		answers := map[tp]kmsg.FetchResponseTopicPartition{}
		var throttle int32
		hinted := false
		for i, r := range g.resps {
			sub := calls[i].req.(*kmsg.FetchRequest)
			var resp *kmsg.FetchResponse
			if r != nil {
				resp = r.(*kmsg.FetchResponse)
			}
			if resp == nil || resp.ErrorCode != 0 {
				code := kerr.NotLeaderForPartition.Code
				if resp != nil {
					code = resp.ErrorCode
				}
				for _, t := range sub.Topics {
					for _, p := range t.Partitions {
						answers[tp{t.Topic, p.Partition}] = fetchError(p.Partition, code)
					}
				}
				continue
			}
			throttle = max(throttle, resp.ThrottleMillis)
			hinted = hinted || len(resp.Brokers) > 0
			for _, t := range resp.Topics {
				name := t.Topic
				if byID {
					name = fetchTopicName(sub, t.TopicID)
				}
				for _, p := range t.Partitions {
					hinted = s.virtualFetchPartition(name, &p, gen) || hinted
					answers[tp{name, p.Partition}] = p
				}
			}
		}
		out := kmsg.NewPtrFetchResponse()
		out.ThrottleMillis = throttle
		out.SessionID = 0
		for ti, t := range in.Topics {
			rt := kmsg.FetchResponseTopic{Topic: t.Topic, TopicID: t.TopicID}
			for _, p := range t.Partitions {
				if code, ok := local[ti][p.Partition]; ok {
					rt.Partitions = append(rt.Partitions, fetchError(p.Partition, code))
					continue
				}
				a, ok := answers[tp{names[ti], p.Partition}]
				if !ok {
					a = fetchError(p.Partition, kerr.NotLeaderForPartition.Code)
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		if hinted {
			for _, b := range s.fleet.Brokers() {
				out.Brokers = append(out.Brokers, kmsg.FetchResponseBroker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
			}
		}
		return out, g.release, nil
	}), nil
}

// virtualFetchPartition rewrites one partition's answer in place and reports
// whether it carries a leader hint.
func (s *Server) virtualFetchPartition(topic string, p *kmsg.FetchResponseTopicPartition, gen uint32) bool {
	p.PreferredReadReplica = -1
	if p.DivergingEpoch.Epoch >= 0 {
		p.DivergingEpoch.Epoch = routing.VirtualEpoch(gen, p.DivergingEpoch.Epoch)
	}
	if gen != 0 && len(p.RecordBatches) > 0 {
		protocol.WalkBatches(p.RecordBatches, func(b protocol.Batch) error {
			b.SetPartitionLeaderEpoch(routing.VirtualEpoch(gen, b.PartitionLeaderEpoch()))
			return nil
		})
	}
	if p.CurrentLeader.LeaderID >= 0 {
		p.CurrentLeader.LeaderID = s.fleet.Leader(topic, p.Partition)
		p.CurrentLeader.LeaderEpoch = routing.VirtualEpoch(gen, p.CurrentLeader.LeaderEpoch)
		return true
	}
	return false
}

// physicalEpochs maps a request's virtual current and last-fetched epochs
// back, or returns the error that tells the client its metadata is stale.
func physicalEpochs(gen uint32, current, lastFetched *int32) int16 {
	if *current >= 0 {
		phys, ok := routing.PhysicalEpoch(gen, *current)
		if !ok {
			if routing.EpochGeneration(*current) < gen {
				return kerr.FencedLeaderEpoch.Code
			}
			return kerr.UnknownLeaderEpoch.Code
		}
		*current = phys
	}
	if lastFetched != nil && *lastFetched >= 0 {
		if phys, ok := routing.PhysicalEpoch(gen, *lastFetched); ok {
			*lastFetched = phys
		}
	}
	return 0
}

func fetchTopicName(sub *kmsg.FetchRequest, id [16]byte) string {
	for _, t := range sub.Topics {
		if t.TopicID == id {
			return t.Topic
		}
	}
	return ""
}

func fetchError(p int32, code int16) kmsg.FetchResponseTopicPartition {
	r := kmsg.NewFetchResponseTopicPartition()
	r.Partition = p
	r.ErrorCode = code
	r.HighWatermark = -1
	r.LastStableOffset = -1
	r.LogStartOffset = -1
	r.PreferredReadReplica = -1
	return r
}
