package proxy

// Produce (key 0), v3-v13 in practice (v0-2 are advertised by Kafka 4.x for
// librdkafka's feature detection and rejected by the brokers, as here).
//
// Split by upstream partition leader and merged. When every partition has
// the same leader and nothing needs rewriting, the client's bytes go as they
// are. Record batches are never decompressed: under a generation other than
// 0 only the producer ID in each batch header is mapped back to the
// physical one (and the CRC recomputed). v13 addresses topics by ID
// (virtual ID in, physical out, and back). KIP-951 leader hints in the
// answer name Ferry members, never brokers. acks=0 gets no answer.

import (
	"context"
	"encoding/binary"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

func handleProduce(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.ProduceRequest)
	gen := req.state.Generation
	byID := req.hdr.Version >= 13
	expect := in.Acks != 0
	var (
		fence  switchFence
		fenced bool // a switch's drain fenced the transactional ID
	)
	if in.TransactionID != nil {
		s.noteTxn(*in.TransactionID)
		fence, fenced = s.switchFences.of(gen, *in.TransactionID)
	}

	sp := splitTopics(c, req, in.Topics,
		func(t *kmsg.ProduceRequestTopic) (string, [16]byte, []kmsg.ProduceRequestTopicPartition) {
			return t.Topic, t.TopicID, t.Partitions
		},
		func(p *kmsg.ProduceRequestTopicPartition) int32 { return p.Partition },
		func(ti int, name string, p *kmsg.ProduceRequestTopicPartition, leader int32) int16 {
			if c.lane >= 0 && s.lanes > 1 && req.up.Lane(leader, s.lanes) != c.lane {
				// Sent to a lane that does not lead it (the client's
				// metadata is older than the move): forwarding it
				// would let this batch race the client's next ones,
				// sent on the right lane's connection, to the broker.
				req.up.RefreshSoon()
				return kerr.NotLeaderForPartition.Code
			}
			if fenced {
				if code := s.switchFencedProduce(gen, fence, p.Records); code != 0 {
					return code
				}
			}
			if in.TransactionID == nil && in.Acks != 0 {
				// Behind a batch of this generation's producer
				// refused unwritten here.
				if code := s.remapped.nativeGaps(gen, &in.Topics[ti], p.Partition, p.Records); code != 0 {
					return code
				}
				// Not before its producer's first batch here is
				// known written (native_firsts.go).
				if code := s.alone(c.ctx, req, ti, &in.Topics[ti], p.Partition, p.Records); code != 0 {
					return code
				}
			}
			if gen != 0 {
				// In place: the records alias the client's frame.
				t := &in.Topics[ti]
				return s.physicalProducerIDs(c, req, in.TransactionID, in.Acks != 0, name, t, p.Partition, p.Records)
			}
			return 0
		})
	parts := sp.requests(func(ts []splitTopic[kmsg.ProduceRequestTopicPartition]) kmsg.Request {
		sub := &kmsg.ProduceRequest{Version: in.Version, TransactionID: in.TransactionID, Acks: in.Acks, TimeoutMillis: in.TimeoutMillis}
		for _, t := range ts {
			sub.Topics = append(sub.Topics, kmsg.ProduceRequestTopic{Topic: sp.names[t.ti], TopicID: sp.physIDs[t.ti], Partitions: t.parts})
		}
		return sub
	})
	names, local := sp.names, sp.local
	if len(local) > 0 && in.TransactionID == nil {
		// Refused here, unwritten: an idempotent producer's later
		// batches to these partitions wait for them. (A duplicate was
		// written before.)
		// Their batches still carry the client's IDs (refused before
		// the rewrite), whatever other partitions of in now carry.
		s.remapped.refuseUnwritten(gen, nil, in, kerr.OutOfOrderSequenceNumber.Code, func(ti int, p int32) bool {
			code := local[ti][p]
			return code != 0 && code != kerr.DuplicateSequenceNumber.Code
		})
	}

	// The common case (with lanes, nearly every request): one leader,
	// nothing refused. The client's own bytes go upstream, rewritten in
	// place: producer IDs were mapped back above (the records alias the
	// frame), and topic IDs are patched where they lie.
	if len(parts) == 1 && len(local) == 0 && (!byID || physicalTopicIDs(req, in, sp.physIDs)) {
		for b := range parts {
			p, err := c.sendRaw(req, b, req.frame.B, expect)
			if err != nil || !expect {
				return nil, err
			}
			r := s.produceReply(c, req, in, names, []*subCall{{broker: b, req: parts[b], p: p}}, local)
			r.direct = p // its answer needs nothing but p (answers.go)
			if len(req.remaps) == 0 {
				r.finish = s.produceAnswerAsIs(req, in, sp.physIDs, p, r.finish)
			}
			return r, nil
		}
	}
	calls := c.sendSplit(req, parts, expect, false)
	if !expect {
		for _, sc := range calls {
			if sc.err != nil {
				return nil, sc.err // acks=0: a broker would close too
			}
		}
		return nil, nil
	}
	var unsent []*subCall
	for _, sc := range calls {
		if sc.err != nil {
			unsent = append(unsent, sc)
		}
	}
	if len(unsent) > 0 {
		// Noted now, not when answered: the answer waits for the
		// cluster to move the leader (gather), and meanwhile the
		// client may send the partition's next batch to the new one.
		s.unansweredProduce(req, in, names, unsent)
	}
	return s.produceReply(c, req, in, names, calls, local), nil
}

// unansweredProduce notes as refused unwritten the batches of an
// idempotent producer in the parts of a Produce that went to no broker or
// got no answer: Ferry answers them NOT_LEADER_OR_FOLLOWER in the broker's
// place, and until the client sends them again the partition's later
// batches are refused NOT_LEADER_OR_FOLLOWER (gap.later) behind them
// (nativeGaps). Forwarded, a later batch could reach a new
// leader that holds no state for the producer in the partition (the
// refused batch was its first there, or lost with the old leader), which
// takes any sequence as the first (KAFKA-15591): the refused batch would
// then only ever meet OUT_OF_ORDER_SEQUENCE_NUMBER, and a client that
// counts the later acknowledgement as covering it (librdkafka) loses it
// silently. Whether the batch was written is unknown when its answer was
// lost; sent again it is then a duplicate, which the broker recognises.
func (s *Server) unansweredProduce(req *request, in *kmsg.ProduceRequest, names []string, calls []*subCall) {
	failed := map[tp]bool{}
	for _, sc := range calls {
		for _, t := range sc.req.(*kmsg.ProduceRequest).Topics {
			for _, p := range t.Partitions {
				failed[tp{t.Topic, p.Partition}] = true
			}
		}
	}
	s.remapped.refuseUnwritten(req.state.Generation, req, in, kerr.NotLeaderForPartition.Code, func(ti int, p int32) bool {
		return failed[tp{names[ti], p}]
	})
}

// physicalTopicIDs writes the physical topic IDs over the virtual ones in
// a v13+ request's own bytes, and reports whether it could.
func physicalTopicIDs(req *request, in *kmsg.ProduceRequest, physIDs [][16]byte) bool {
	windows, err := protocol.ProduceTopicIDs(req.body, req.hdr.Version)
	if err != nil || len(windows) != len(in.Topics) {
		return false
	}
	for i, w := range windows {
		copy(w, physIDs[i][:])
	}
	return true
}

// physicalProducerIDs maps the producer IDs of a client's batches back to
// the active cluster's, in place. An ID issued under another generation
// means nothing there, or another producer (producer_ids.go): a
// transactional producer's batch goes under its transactional ID's mapping
// (txnRemaps), or is refused; an idempotent one writes on under an ID Ferry
// allocates for it, and is told NOT_LEADER_OR_FOLLOWER (retry) when that
// allocation fails or while the batch that sets the allocated ID's
// sequence in the partition is unanswered, and OUT_OF_ORDER_SEQUENCE_NUMBER
// (retry, behind the one resent) while a batch before it in the partition
// was refused. Its first batch in a partition under a generation continues
// where it stopped there on the cluster taken over from (continues).
func (s *Server) physicalProducerIDs(c *clientConn, req *request, txnID *string, acked bool, name string, t *kmsg.ProduceRequestTopic, partition int32, records []byte) int16 {
	gen := req.state.Generation
	// The partition as the client names it (by name, or by ID from v13).
	topic, topicID := t.Topic, t.TopicID
	var code int16
	protocol.WalkBatches(records, func(b protocol.Batch) error {
		pid := b.ProducerID()
		if pid < 0 {
			return nil
		}
		epoch, seq := b.ProducerEpoch(), b.BaseSequence()
		phys, ok := routing.PhysicalPID(gen, pid)
		if !ok {
			s.metrics.refused(int16(kmsg.Produce), reasonOtherGeneration)
			if txnID != nil {
				// The partition as the client names it (by name, or
				// by ID from v13): its sequences' base.
				part := topic + "\x00" + string(topicID[:]) + "\x00" + strconv.Itoa(int(partition))
				phys, epoch, seq, code = s.txnProduce(c.ctx, gen, *txnID, pid, epoch, part, seq)
				if code != 0 {
					return errStop
				}
			} else {
				gk := gapKey{virt: pid, topic: topic, topicID: topicID, partition: partition}
				if code = s.remapped.blocks(gen, gk, epoch, seq); code != 0 {
					return errStop
				}
				ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
				var err error
				phys, err = s.idempotentPID(ctx, req.up, gen, pid)
				cancel()
				if err != nil {
					c.log.Debug("no producer ID for a producer of another generation", zap.Int64("producer_id", pid), zap.Error(err))
					s.remapped.refused(gen, gk, epoch, seq)
					code = kerr.NotLeaderForPartition.Code
					return errStop
				}
				if acked {
					// The first batch under phys continues where the
					// producer stopped on the cluster taken over from.
					ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
					code = s.continues(ctx, c, req, gk, name, phys, epoch, seq)
					cancel()
					if code != 0 {
						return errStop
					}
				}
				if acked && !s.remapped.claim(gen, gk, phys, epoch, seq) {
					// Retried in place, no epoch bump: once the
					// first is answered this one is next.
					code = kerr.NotLeaderForPartition.Code
					return errStop
				}
				req.remaps = append(req.remaps, remapBatch{key: gk, phys: phys, epoch: epoch, seq: seq})
			}
		}
		// The CRC from the header's change alone: a spliced batch's
		// body is not in the frame (produce_splice.go), and a batch
		// that came with a wrong CRC keeps it for the broker to refuse.
		var old [protocol.BatchHeaderSize]byte
		copy(old[:], b)
		b.SetProducer(phys, epoch, seq)
		b.PatchCRC(old[:])
		req.physicalIDs = true
		return nil
	})
	return code
}

func (s *Server) produceReply(c *clientConn, req *request, in *kmsg.ProduceRequest, names []string, calls []*subCall, local map[int]map[int32]int16) *reply {
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		g, err := c.gather(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		gen := req.state.Generation
		// Every partition's answer by (topic name, partition).
		n := 0
		for _, t := range in.Topics {
			n += len(t.Partitions)
		}
		answers := make(map[tp]kmsg.ProduceResponseTopicPartition, n)
		var throttle int32
		var hinted bool
		var unanswered []*subCall
		for i, r := range g.resps {
			sub := calls[i].req.(*kmsg.ProduceRequest)
			if r == nil {
				if calls[i].err == nil { // sent: noted unsent in handleProduce
					unanswered = append(unanswered, calls[i])
				}
				for _, t := range sub.Topics {
					for _, p := range t.Partitions {
						answers[tp{t.Topic, p.Partition}] = produceError(p.Partition, kerr.NotLeaderForPartition.Code)
					}
				}
				continue
			}
			resp := r.(*kmsg.ProduceResponse)
			throttle = max(throttle, resp.ThrottleMillis)
			hinted = hinted || len(resp.Brokers) > 0
			for ti, t := range resp.Topics {
				name := t.Topic
				if in.Version >= 13 && ti < len(sub.Topics) {
					name = topicNameForID(sub, t.TopicID)
				}
				for _, p := range t.Partitions {
					if upstream.LeaderMoved(p.ErrorCode) {
						req.up.RefreshSoon()
					}
					if p.CurrentLeader.LeaderID >= 0 {
						p.CurrentLeader.LeaderID = s.virtualLeader(req.up, name, p.Partition, p.CurrentLeader.LeaderID)
						p.CurrentLeader.LeaderEpoch = routing.VirtualEpoch(gen, p.CurrentLeader.LeaderEpoch)
						hinted = true
					}
					answers[tp{name, p.Partition}] = p
				}
			}
		}
		if len(unanswered) > 0 {
			s.unansweredProduce(req, in, names, unanswered)
		}
		s.settleFirsts(req, func(ti int, p int32) bool {
			code := answerFor(local, answers, ti, names[ti], p, produceError).ErrorCode
			return code == 0 || code == kerr.DuplicateSequenceNumber.Code
		})
		out := kmsg.NewPtrProduceResponse()
		out.ThrottleMillis = throttle
		out.Topics = make([]kmsg.ProduceResponseTopic, 0, len(in.Topics))
		var failed map[gapPart]bool
		for ti, t := range in.Topics {
			rt := kmsg.ProduceResponseTopic{Topic: t.Topic, TopicID: t.TopicID, Partitions: make([]kmsg.ProduceResponseTopicPartition, 0, len(t.Partitions))}
			for _, p := range t.Partitions {
				a := answerFor(local, answers, ti, names[ti], p.Partition, produceError)
				if a.ErrorCode == kerr.DuplicateSequenceNumber.Code {
					if at, ok := req.writtenAt[gapPart{t.Topic, t.TopicID, p.Partition}]; ok {
						a.BaseOffset = at // where it was written before the switch
					}
				}
				if a.ErrorCode != 0 && a.ErrorCode != kerr.DuplicateSequenceNumber.Code && len(req.remaps) > 0 {
					if failed == nil {
						failed = map[gapPart]bool{}
					}
					failed[gapPart{t.Topic, t.TopicID, p.Partition}] = true
				}
				rt.Partitions = append(rt.Partitions, a)
			}
			out.Topics = append(out.Topics, rt)
		}
		// A batch written under an ID Ferry allocated and answered with
		// an error: the client sends it again, and the partition's later
		// batches wait for it (those already sent behind it were refused
		// here while it was the partition's unanswered first, or met a
		// broker holding its ID's sequence). Answered success, the
		// broker orders what follows.
		for _, r := range req.remaps {
			s.remapped.answered(gen, r, failed[r.key.part()])
		}
		if hinted {
			for _, b := range s.virtualBrokers() {
				out.Brokers = append(out.Brokers, kmsg.ProduceResponseBroker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
			}
		}
		return out, g.release, nil
	})
}

func topicNameForID(sub *kmsg.ProduceRequest, id [16]byte) string {
	for _, t := range sub.Topics {
		if t.TopicID == id {
			return t.Topic
		}
	}
	return ""
}

func produceError(p int32, code int16) kmsg.ProduceResponseTopicPartition {
	r := kmsg.NewProduceResponseTopicPartition()
	r.Partition = p
	r.ErrorCode = code
	r.BaseOffset = -1
	r.LogAppendTime = -1
	r.LogStartOffset = -1
	if code == kerr.UnknownProducerID.Code {
		// Ferry answers it only to a transactional producer holding
		// an ID of another generation. Below any offset the client
		// acknowledged, and not -1 ("unknown: retry"), so that the
		// Java producer fails the batch (the transaction becomes
		// abortable) rather than retrying it under the same ID.
		r.LogStartOffset = -2
	}
	return r
}

// produceAnswerAsIs answers a Produce forwarded whole to one broker with
// the broker's own bytes when they are clean (protocol.ProduceAnswerClean:
// every partition written, no hint to rewrite), v13's topic IDs turned
// back into the client's where they lie: nothing decoded, merged or
// encoded. Any other answer goes to slow, which decodes and rebuilds it.
// (A request with producer IDs Ferry allocated, req.remaps, always does:
// their answers are noted.)
func (s *Server) produceAnswerAsIs(req *request, in *kmsg.ProduceRequest, physIDs [][16]byte, p *upstream.Pending, slow func(context.Context) ([]byte, func(), error)) func(context.Context) ([]byte, func(), error) {
	return func(ctx context.Context) ([]byte, func(), error) {
		buf, err := p.Wait(ctx)
		if err != nil {
			return slow(ctx)
		}
		ids, n, ok := protocol.ProduceAnswerClean(buf.B, req.hdr.Version)
		if !ok || n != producePartitions(in) || !clientTopicIDs(ids, in, physIDs) {
			return slow(ctx) // Wait again gives it the same answer
		}
		s.settleFirsts(req, func(int, int32) bool { return true })
		binary.BigEndian.PutUint32(buf.B, uint32(req.hdr.CorrelationID))
		return buf.B, func() { upstream.ResponseBufs.Put(buf) }, nil
	}
}

// producePartitions counts the partitions a Produce names.
func producePartitions(in *kmsg.ProduceRequest) int {
	n := 0
	for _, t := range in.Topics {
		n += len(t.Partitions)
	}
	return n
}

// clientTopicIDs writes over each physical topic ID window of an answer
// (v13) the client's ID of that topic, and reports whether it could: an
// ID the request did not send leaves the answer untouched.
func clientTopicIDs(ids [][]byte, in *kmsg.ProduceRequest, physIDs [][16]byte) bool {
	topic := func(w []byte) int {
		for ti := range min(len(physIDs), len(in.Topics)) {
			if string(physIDs[ti][:]) == string(w) {
				return ti
			}
		}
		return -1
	}
	for _, w := range ids { // all found before any is written
		if topic(w) < 0 {
			return false
		}
	}
	for _, w := range ids {
		copy(w, in.Topics[topic(w)].TopicID[:])
	}
	return true
}
