package proxy

// Items of a request Ferry answers itself, never forwarded, whatever the
// request policy allows; the rest of the request is forwarded and the
// answers merged. Three rules, in this order:
//
//   - Ferry's own topics (internal_topics.go): TOPIC_AUTHORIZATION_FAILED,
//     reason internal_topic.
//   - Topic IDs Ferry did not issue: a request names topics by the virtual
//     IDs Metadata gave it; any other ID (a physical one read from the
//     brokers directly, or a deleted topic's) is answered UNKNOWN_TOPIC_ID,
//     as a broker answers an ID it does not know, reason unknown_topic_id.
//     Forwarded, a physical ID would name the topic behind Ferry's checks,
//     which look at names and virtual IDs. Produce, Fetch and Metadata
//     resolve their IDs themselves (splitTopics, handleMetadata); this
//     covers DeleteTopics v6+, OffsetCommit v10+, OffsetFetch v10+,
//     TxnOffsetCommit v6+, ShareFetch and ShareAcknowledge (always
//     forwarded, even with no topic left: the request carries the share
//     session's epoch; a forgotten topic of an unknown ID is dropped), and
//     a KIP-848 member's owned partitions in ConsumerGroupHeartbeat, which
//     have no answer of their own and are left out of what is forwarded.
//   - Kafka's internal topics (kafkaInternal): deleting them or their
//     records, or changing their configs or partitions, is refused with
//     TOPIC_AUTHORIZATION_FAILED, reason kafka_internal_topic. A client
//     acting under Ferry's identity that set retention.ms on
//     __consumer_offsets would lose every group's committed offsets.

import (
	"context"
	"strings"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const (
	unknownTopicIDMessage = "ferry: the topic ID is not one Ferry issued (topic IDs come from Ferry's Metadata answers)"
	kafkaInternalMessage  = "ferry: the topic is one of Kafka's internal topics: deleting it or its records, and changing its configs or partitions, are refused through Ferry"
)

// itemRule takes the items it refuses out of a request (takeTopics'
// contract) and answers them with code.
type itemRule struct {
	reason string
	code   int16
	msg    string
	take   func(kmsg.Request) (kmsg.Request, bool)
}

// The APIs each rule reads: the others (Produce and Fetch among them) skip
// the rules at the cost of a map lookup.
var (
	namedTopicKeys = keySet(kmsg.CreateTopics, kmsg.CreatePartitions, kmsg.DeleteTopics, kmsg.DeleteRecords,
		kmsg.DescribeConfigs, kmsg.AlterConfigs, kmsg.IncrementalAlterConfigs, kmsg.ElectLeaders,
		kmsg.AlterPartitionAssignments, kmsg.AddPartitionsToTxn, kmsg.ListPartitionReassignments, kmsg.DescribeTopicPartitions)
	topicIDKeys = keySet(kmsg.DeleteTopics, kmsg.OffsetCommit, kmsg.OffsetFetch, kmsg.TxnOffsetCommit,
		kmsg.ConsumerGroupHeartbeat, kmsg.ShareFetch, kmsg.ShareAcknowledge)
	kafkaInternalKeys = keySet(kmsg.DeleteTopics, kmsg.DeleteRecords, kmsg.CreatePartitions,
		kmsg.AlterConfigs, kmsg.IncrementalAlterConfigs)
	txnIDKeys = keySet(kmsg.InitProducerID, kmsg.AddPartitionsToTxn, kmsg.AddOffsetsToTxn, kmsg.EndTxn,
		kmsg.TxnOffsetCommit, kmsg.DescribeTransactions)
)

func keySet(keys ...kmsg.Key) map[int16]bool {
	m := make(map[int16]bool, len(keys))
	for _, k := range keys {
		m[int16(k)] = true
	}
	return m
}

// itemRules are the rules that apply to req, in order.
func (s *Server) itemRules(c *clientConn, req *request) []itemRule {
	key := req.hdr.Key
	if !namedTopicKeys[key] && !topicIDKeys[key] && !txnIDKeys[key] {
		return nil
	}
	var rules []itemRule
	if len(s.internal.names) > 0 && txnIDKeys[key] {
		it := &s.internal
		rules = append(rules, itemRule{reasonInternalTxnID, kerr.TransactionalIDAuthorizationFailed.Code, internalTxnIDMessage, func(kr kmsg.Request) (kmsg.Request, bool) {
			return takeTxnIDs(kr, it.hasTxnID)
		}})
	}
	if len(s.internal.names) > 0 && namedTopicKeys[key] {
		it := &s.internal
		rules = append(rules, itemRule{reasonInternalTopic, topicAuthFailed, internalTopicMessage, func(kr kmsg.Request) (kmsg.Request, bool) {
			return takeTopics(kr, func(name string, id [16]byte) bool { return it.has(name) || it.hasID(id) })
		}})
	}
	u := req.up
	if u != nil && !u.Started.Load() {
		u = nil // handle answers for it: nothing is forwarded
	}
	if u != nil && topicIDKeys[key] {
		rules = append(rules, itemRule{reasonUnknownTopicID, kerr.UnknownTopicID.Code, unknownTopicIDMessage, func(kr kmsg.Request) (kmsg.Request, bool) {
			ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
			defer cancel()
			return takeUnknownTopicIDs(kr, func(id [16]byte) bool { return u.TopicByVID(ctx, id) != nil })
		}})
	}
	if kafkaInternalKeys[key] {
		rules = append(rules, itemRule{reasonKafkaInternalTopic, topicAuthFailed, kafkaInternalMessage, func(kr kmsg.Request) (kmsg.Request, bool) {
			ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
			defer cancel()
			return takeTopics(kr, func(name string, id [16]byte) bool { return kafkaInternal(ctx, u, name, id) })
		}})
	}
	return rules
}

// kafkaInternal reports whether a topic, by name or by virtual ID, is one
// of Kafka's internal topics: any name starting "__" (Kafka's own:
// __consumer_offsets, __transaction_state, __share_group_state; tiered
// storage's __remote_log_metadata, which Metadata does not mark internal;
// the prefix is Kafka's convention for state a cluster keeps in topics),
// and any topic the cluster's Metadata marks internal. u may be nil (no
// cluster reached): the names alone decide.
func kafkaInternal(ctx context.Context, u *upstream.Cluster, name string, id [16]byte) bool {
	if name == "" && id != ([16]byte{}) && u != nil {
		if t := u.TopicByVID(ctx, id); t != nil {
			name = t.Name
		}
	}
	if strings.HasPrefix(name, "__") {
		return true
	}
	if u == nil {
		return false
	}
	t := u.Snapshot().Topics[name]
	return t != nil && t.Internal
}

// takeUnknownTopicIDs takes the items naming a topic by an ID that known
// does not know out of kr, as takeTopics does. The zero ID names no topic
// by ID (older versions name topics by name): left to the broker.
func takeUnknownTopicIDs(kr kmsg.Request, known func([16]byte) bool) (kmsg.Request, bool) {
	unknown := func(id [16]byte) bool { return id != ([16]byte{}) && !known(id) }
	switch r := kr.(type) {
	case *kmsg.DeleteTopicsRequest:
		if out := take(&r.Topics, func(t *kmsg.DeleteTopicsRequestTopic) bool { return unknown(t.TopicID) }); out != nil {
			cp := *r
			cp.TopicNames, cp.Topics = nil, out
			return &cp, len(r.TopicNames) == 0 && len(r.Topics) == 0
		}
	case *kmsg.OffsetCommitRequest:
		if out := take(&r.Topics, func(t *kmsg.OffsetCommitRequestTopic) bool { return unknown(t.TopicID) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	case *kmsg.TxnOffsetCommitRequest:
		if out := take(&r.Topics, func(t *kmsg.TxnOffsetCommitRequestTopic) bool { return unknown(t.TopicID) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	case *kmsg.OffsetFetchRequest:
		// Per group; always forwarded, for the groups' own answers.
		var cp *kmsg.OffsetFetchRequest
		for gi := range r.Groups {
			g := &r.Groups[gi]
			if out := take(&g.Topics, func(t *kmsg.OffsetFetchRequestGroupTopic) bool { return unknown(t.TopicID) }); out != nil {
				if cp == nil {
					cp = &kmsg.OffsetFetchRequest{Version: r.Version}
				}
				cg := *g
				cg.Topics = out
				cp.Groups = append(cp.Groups, cg)
			}
		}
		if cp != nil {
			return cp, false
		}
	case *kmsg.ShareFetchRequest:
		forgot := len(take(&r.ForgottenTopicsData, func(t *kmsg.ShareFetchRequestForgottenTopicsData) bool { return unknown(t.TopicID) })) > 0
		out := take(&r.Topics, func(t *kmsg.ShareFetchRequestTopic) bool { return unknown(t.TopicID) })
		if out != nil || forgot {
			cp := *r
			cp.Topics, cp.ForgottenTopicsData = out, nil
			return &cp, false
		}
	case *kmsg.ShareAcknowledgeRequest:
		if out := take(&r.Topics, func(t *kmsg.ShareAcknowledgeRequestTopic) bool { return unknown(t.TopicID) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, false
		}
	case *kmsg.ConsumerGroupHeartbeatRequest:
		// The partitions the member owns: nothing answers them, and
		// it never owned a topic Ferry does not know.
		if out := take(&r.Topics, func(t *kmsg.ConsumerGroupHeartbeatRequestTopic) bool { return unknown(t.TopicID) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, false
		}
	}
	return nil, false
}

// refuseItems applies the item rules to kr: it takes the items they refuse
// out of kr, in place and in the bytes forwarded. It returns whole, the
// answer when nothing is left to forward, or part, which adds every rule's
// refusals to the answer in one decoding of it.
func (s *Server) refuseItems(c *clientConn, req *request, kr kmsg.Request) (whole *reply, part func(*reply) *reply) {
	rewritten := false
	var refused []kmsg.Response // each refusing rule's answers, in the rules' order
	addRefused := func(resp kmsg.Response) {
		for i := len(refused) - 1; i >= 0; i-- {
			mergeAnswers(resp, refused[i])
		}
	}
	for _, rule := range s.itemRules(c, req) {
		taken, empty := rule.take(kr)
		if taken == nil {
			continue
		}
		s.itemRefused(c, req, rule.reason)
		if _, ok := taken.(*kmsg.ConsumerGroupHeartbeatRequest); ok {
			rewritten = true // nothing to answer
			continue
		}
		if _, ok := taken.(*kmsg.ListPartitionReassignmentsRequest); ok {
			// Its answer lists reassignments with no error of their own.
			resp := kmsg.NewPtrListPartitionReassignmentsResponse()
			resp.SetVersion(req.hdr.Version)
			msg := rule.msg
			resp.ErrorCode, resp.ErrorMessage = rule.code, &msg
			addRefused(resp)
			return localReply(req, resp), nil
		}
		if empty && taken == kr {
			// Refused whole (a request of one transactional ID): the
			// answer's own error code says so.
			resp := refusedAnswers(taken, rule.code, rule.msg)
			addRefused(resp)
			return localReply(req, resp), nil
		}
		refused = append(refused, refusedAnswers(taken, rule.code, rule.msg))
		if empty {
			resp := kr.ResponseKind()
			resp.SetVersion(req.hdr.Version)
			addRefused(resp)
			return localReply(req, resp), nil
		}
		rewritten = true
	}
	if rewritten {
		rewriteFrame(req, kr)
	}
	if len(refused) == 0 {
		return nil, nil
	}
	return nil, func(r *reply) *reply { return s.addToReply(c, req, r, addRefused) }
}

// itemRefused counts and logs (sampled) a request some of whose items a
// rule refused.
func (s *Server) itemRefused(c *clientConn, req *request, reason string) {
	if reason == reasonInternalTopic {
		s.internalRefused(c, req)
		return
	}
	s.metrics.refused(req.hdr.Key, reason)
	c.logRefusal(zapcore.InfoLevel, reason, "request items refused", zap.String("api", protocol.APIName(req.hdr.Key)))
}

// refusedAnswers is the answer to the refused items alone. An OffsetFetch
// group's answer is its topics' (the group itself is answered by its
// coordinator): the group carries no error.
func refusedAnswers(taken kmsg.Request, code int16, msg string) kmsg.Response {
	resp := errorResponse(taken, code, msg)
	if r, ok := resp.(*kmsg.OffsetFetchResponse); ok {
		r.ErrorCode = 0
		for gi := range r.Groups {
			r.Groups[gi].ErrorCode = 0
		}
	}
	return resp
}

// mergeAnswers adds the refused items' answers to resp: slice by slice,
// and an OffsetFetch's per group.
func mergeAnswers(resp, refused kmsg.Response) {
	r, ok := resp.(*kmsg.OffsetFetchResponse)
	if !ok {
		appendAnswers(resp, refused)
		return
	}
	for _, g := range refused.(*kmsg.OffsetFetchResponse).Groups {
		found := false
		for i := range r.Groups {
			if r.Groups[i].Group == g.Group {
				r.Groups[i].Topics = append(r.Groups[i].Topics, g.Topics...)
				found = true
				break
			}
		}
		if !found {
			r.Groups = append(r.Groups, g)
		}
	}
}
