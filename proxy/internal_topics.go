package proxy

// Ferry's own topics (WithInternalTopics): the routing state's compacted
// topic on every cluster (routing.DefaultStoreTopic). A member that starts
// obeys the highest generation it reads there, so a client that could write
// it could steer the next restart, and one that could delete it, or shorten
// its retention, could lose the state. Ferry treats these topics as Kafka
// treats a topic the client's principal may not describe: answers that
// list topics leave them out, and whatever names one is answered
// TOPIC_AUTHORIZATION_FAILED by Ferry and never forwarded.
//
//   - Metadata (03_metadata.go) lists none for all topics; one named, by
//     name or virtual ID, is not asked upstream, so auto-creation cannot
//     make it.
//   - Split requests (Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
//     DescribeProducers): its partitions are refused where the request is
//     split by leader (splitTopics, splitByLeader), the other topics
//     served. DeleteRecords has them taken out before, as the admin
//     requests do.
//   - Admin requests (CreateTopics, DeleteTopics, CreatePartitions,
//     DeleteRecords, config describes and changes of TOPIC resources,
//     ElectLeaders, AlterPartitionReassignments, DescribeTopicPartitions)
//     and AddPartitionsToTxn (whose transaction would end with a marker in
//     the topic): the items naming one are taken out and answered by
//     Ferry, the rest forwarded (takeTopics, the first of the item rules
//     of topic_refusals.go). ListPartitionReassignments naming one is
//     refused as a whole: its answer has no per-topic error. Named by its
//     physical ID, read from the brokers directly, a topic is answered
//     UNKNOWN_TOPIC_ID like any ID Ferry did not issue (topic_refusals.go).
//   - Listings: DescribeTopicPartitions and ListPartitionReassignments for
//     all topics, ListConfigResources, DescribeLogDirs, and the
//     assignments ConsumerGroupDescribe shows, leave them out.
//
// The transactional ID under which members write the routing state
// (routing.StoreTransactionalID, the topic's name and "/") is Ferry's too:
// a client that initialised it would fence Ferry's writes of the state,
// and one that knew its producer's epoch could abort them. Every request
// naming it (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
// TxnOffsetCommit, DescribeTransactions) is answered
// TRANSACTIONAL_ID_AUTHORIZATION_FAILED by Ferry, reason
// internal_transactional_id (takeTxnIDs).
//
// Left as they are: the group offset APIs (OffsetCommit, OffsetFetch,
// TxnOffsetCommit: a group's offsets for the topic change nothing in it),
// ElectLeaders for every partition (a preferred leader election moves no
// data).
//
// KIP-848 regex subscriptions are resolved by the broker's group
// coordinator, to which these are ordinary topics: ".*" matches them. The
// assignment a ConsumerGroupHeartbeat answer carries has them taken out
// (hideInternalAssigned), so the member never fetches them (the Java
// consumer would throw TopicAuthorizationException; franz-go adopts a
// topic the broker assigned it). The member never reports owning them,
// which holds nothing up: a partition it never owned has nothing to
// revoke. The assignments a ConsumerGroupDescribe answer shows have them
// taken out too (hideInternalDescribed).

import (
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

const internalTopicMessage = "ferry: the topic is Ferry's own and not open to clients"

// internalTopics are Ferry's own topics, by name and by the virtual ID
// clients would know them by.
type internalTopics struct {
	names []string
	ids   [][16]byte
	// txnPrefixes start the transactional IDs of their writes
	// (routing.StoreTransactionalID).
	txnPrefixes []string
}

func newInternalTopics(clusterID string, names []string) internalTopics {
	it := internalTopics{names: slices.Clone(names)}
	for _, n := range names {
		it.ids = append(it.ids, routing.VirtualTopicID(clusterID, n))
		it.txnPrefixes = append(it.txnPrefixes, routing.StoreTransactionalID(n, ""))
	}
	return it
}

// has reports whether name is an internal topic: one string compare per
// internal topic (there is one), cheap enough for every topic of every
// Produce and Fetch.
func (it *internalTopics) has(name string) bool {
	for _, n := range it.names {
		if n == name {
			return true
		}
	}
	return false
}

func (it *internalTopics) hasID(id [16]byte) bool {
	return slices.Contains(it.ids, id)
}

// hasTxnID reports whether id is the transactional ID of an internal
// topic's writes (routing.StoreTransactionalID).
func (it *internalTopics) hasTxnID(id string) bool {
	return slices.ContainsFunc(it.txnPrefixes, func(p string) bool { return strings.HasPrefix(id, p) })
}

const internalTxnIDMessage = "ferry: the transactional ID is Ferry's own and not open to clients"

// takeTxnIDs refuses a request naming a transactional ID that reserved
// picks, as takeTopics does: DescribeTransactions has those IDs taken out;
// a request of one transaction (or AddPartitionsToTxn v4+ batching one
// such) is refused whole.
func takeTxnIDs(kr kmsg.Request, reserved func(string) bool) (kmsg.Request, bool) {
	var named bool
	switch r := kr.(type) {
	case *kmsg.InitProducerIDRequest:
		named = r.TransactionalID != nil && reserved(*r.TransactionalID)
	case *kmsg.AddPartitionsToTxnRequest:
		named = reserved(r.TransactionalID) || slices.ContainsFunc(r.Transactions, func(t kmsg.AddPartitionsToTxnRequestTransaction) bool { return reserved(t.TransactionalID) })
	case *kmsg.AddOffsetsToTxnRequest:
		named = reserved(r.TransactionalID)
	case *kmsg.EndTxnRequest:
		named = reserved(r.TransactionalID)
	case *kmsg.TxnOffsetCommitRequest:
		named = reserved(r.TransactionalID)
	case *kmsg.DescribeTransactionsRequest:
		if out := take(&r.TransactionalIDs, func(id *string) bool { return reserved(*id) }); out != nil {
			cp := *r
			cp.TransactionalIDs = out
			return &cp, len(r.TransactionalIDs) == 0
		}
	}
	if named {
		return kr, true
	}
	return nil, false
}

// internalRefused counts and logs (sampled) a request that named an
// internal topic.
func (s *Server) internalRefused(c *clientConn, req *request) {
	s.metrics.refused(req.hdr.Key, reasonInternalTopic)
	c.logRefusal(zapcore.InfoLevel, reasonInternalTopic, "request naming Ferry's own topic refused",
		zap.String("api", protocol.APIName(req.hdr.Key)))
}

// takeTopics takes the items of an admin request naming a topic that
// pick picks out of kr and returns a copy of kr holding only them (nil
// when there are none), and whether kr has nothing left. pick is given a
// topic's name, or for DeleteTopics v6 by ID its ID (the name "").
func takeTopics(kr kmsg.Request, pick func(name string, id [16]byte) bool) (kmsg.Request, bool) {
	byName := func(n string) bool { return pick(n, [16]byte{}) }
	switch r := kr.(type) {
	case *kmsg.CreateTopicsRequest:
		out := take(&r.Topics, func(t *kmsg.CreateTopicsRequestTopic) bool { return byName(t.Topic) })
		for i := range out {
			out[i].Configs = nil // the answer would echo them
		}
		if out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	case *kmsg.CreatePartitionsRequest:
		if out := take(&r.Topics, func(t *kmsg.CreatePartitionsRequestTopic) bool { return byName(t.Topic) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	case *kmsg.DeleteTopicsRequest:
		// v0-v5 name topics in TopicNames, v6 in Topics, by name or
		// by (virtual) ID.
		names := take(&r.TopicNames, func(n *string) bool { return byName(*n) })
		topics := take(&r.Topics, func(t *kmsg.DeleteTopicsRequestTopic) bool {
			if t.Topic != nil {
				return pick(*t.Topic, t.TopicID)
			}
			return pick("", t.TopicID)
		})
		if names != nil || topics != nil {
			cp := *r
			cp.TopicNames, cp.Topics = names, topics
			return &cp, len(r.TopicNames) == 0 && len(r.Topics) == 0
		}
	case *kmsg.DeleteRecordsRequest:
		if out := take(&r.Topics, func(t *kmsg.DeleteRecordsRequestTopic) bool { return byName(t.Topic) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	case *kmsg.DescribeConfigsRequest:
		if out := take(&r.Resources, func(res *kmsg.DescribeConfigsRequestResource) bool {
			return res.ResourceType == kmsg.ConfigResourceTypeTopic && byName(res.ResourceName)
		}); out != nil {
			cp := *r
			cp.Resources = out
			return &cp, len(r.Resources) == 0
		}
	case *kmsg.AlterConfigsRequest:
		if out := take(&r.Resources, func(res *kmsg.AlterConfigsRequestResource) bool {
			return res.ResourceType == kmsg.ConfigResourceTypeTopic && byName(res.ResourceName)
		}); out != nil {
			cp := *r
			cp.Resources = out
			return &cp, len(r.Resources) == 0
		}
	case *kmsg.IncrementalAlterConfigsRequest:
		if out := take(&r.Resources, func(res *kmsg.IncrementalAlterConfigsRequestResource) bool {
			return res.ResourceType == kmsg.ConfigResourceTypeTopic && byName(res.ResourceName)
		}); out != nil {
			cp := *r
			cp.Resources = out
			return &cp, len(r.Resources) == 0
		}
	case *kmsg.ElectLeadersRequest:
		// Null topics (every partition) cannot be narrowed: left as it is.
		if out := take(&r.Topics, func(t *kmsg.ElectLeadersRequestTopic) bool { return byName(t.Topic) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	case *kmsg.AlterPartitionAssignmentsRequest:
		if out := take(&r.Topics, func(t *kmsg.AlterPartitionAssignmentsRequestTopic) bool { return byName(t.Topic) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	case *kmsg.AddPartitionsToTxnRequest:
		// v0-v3, a client's (v4+ batches are the brokers'): a
		// transaction that added it would end with a marker in it.
		if out := take(&r.Topics, func(t *kmsg.AddPartitionsToTxnRequestTopic) bool { return byName(t.Topic) }); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	case *kmsg.ListPartitionReassignmentsRequest:
		if slices.ContainsFunc(r.Topics, func(t kmsg.ListPartitionReassignmentsRequestTopic) bool { return byName(t.Topic) }) {
			return r, true // refused as a whole
		}
	case *kmsg.DescribeTopicPartitionsRequest:
		cursor := ""
		if r.Cursor != nil {
			cursor = r.Cursor.Topic
		}
		// The broker answers only the topics from the cursor's on;
		// those before it are not answered at all.
		if out := take(&r.Topics, func(t *kmsg.DescribeTopicPartitionsRequestTopic) bool {
			return byName(t.Topic) && t.Topic >= cursor
		}); out != nil {
			cp := *r
			cp.Topics = out
			return &cp, len(r.Topics) == 0
		}
	}
	return nil, false
}

// take removes the elements internal picks from *s and returns them (nil
// when there are none).
func take[T any](s *[]T, internal func(*T) bool) []T {
	var out []T
	keep := (*s)[:0]
	for i := range *s {
		e := (*s)[i]
		if internal(&e) {
			out = append(out, e)
		} else {
			keep = append(keep, e)
		}
	}
	if out != nil {
		*s = keep
	}
	return out
}

// appendAnswers appends the per-item answers of add (Ferry's) to those of
// resp (the broker's), slice by slice, for the APIs whose items Ferry
// refuses (topic_refusals.go); it reports false for any other.
func appendAnswers(resp, add kmsg.Response) bool {
	switch r := resp.(type) {
	case *kmsg.CreateTopicsResponse:
		r.Topics = append(r.Topics, add.(*kmsg.CreateTopicsResponse).Topics...)
	case *kmsg.CreatePartitionsResponse:
		r.Topics = append(r.Topics, add.(*kmsg.CreatePartitionsResponse).Topics...)
	case *kmsg.DeleteTopicsResponse:
		r.Topics = append(r.Topics, add.(*kmsg.DeleteTopicsResponse).Topics...)
	case *kmsg.DeleteRecordsResponse:
		r.Topics = append(r.Topics, add.(*kmsg.DeleteRecordsResponse).Topics...)
	case *kmsg.DescribeConfigsResponse:
		r.Resources = append(r.Resources, add.(*kmsg.DescribeConfigsResponse).Resources...)
	case *kmsg.AlterConfigsResponse:
		r.Resources = append(r.Resources, add.(*kmsg.AlterConfigsResponse).Resources...)
	case *kmsg.IncrementalAlterConfigsResponse:
		r.Resources = append(r.Resources, add.(*kmsg.IncrementalAlterConfigsResponse).Resources...)
	case *kmsg.ElectLeadersResponse:
		r.Topics = append(r.Topics, add.(*kmsg.ElectLeadersResponse).Topics...)
	case *kmsg.AlterPartitionAssignmentsResponse:
		r.Topics = append(r.Topics, add.(*kmsg.AlterPartitionAssignmentsResponse).Topics...)
	case *kmsg.AddPartitionsToTxnResponse:
		a := add.(*kmsg.AddPartitionsToTxnResponse)
		r.Transactions = append(r.Transactions, a.Transactions...)
		r.Topics = append(r.Topics, a.Topics...)
	case *kmsg.ListPartitionReassignmentsResponse:
		r.Topics = append(r.Topics, add.(*kmsg.ListPartitionReassignmentsResponse).Topics...)
	case *kmsg.DescribeTopicPartitionsResponse:
		r.Topics = append(r.Topics, add.(*kmsg.DescribeTopicPartitionsResponse).Topics...)
	case *kmsg.OffsetCommitResponse:
		r.Topics = append(r.Topics, add.(*kmsg.OffsetCommitResponse).Topics...)
	case *kmsg.OffsetFetchResponse:
		a := add.(*kmsg.OffsetFetchResponse)
		r.Topics = append(r.Topics, a.Topics...)
		r.Groups = append(r.Groups, a.Groups...)
	case *kmsg.TxnOffsetCommitResponse:
		r.Topics = append(r.Topics, add.(*kmsg.TxnOffsetCommitResponse).Topics...)
	case *kmsg.DescribeTransactionsResponse:
		r.TransactionStates = append(r.TransactionStates, add.(*kmsg.DescribeTransactionsResponse).TransactionStates...)
	case *kmsg.ShareFetchResponse:
		// Ferry's refusals name no leader: they bring no endpoints.
		a := add.(*kmsg.ShareFetchResponse)
		r.Topics = append(r.Topics, a.Topics...)
		r.NodeEndpoints = append(r.NodeEndpoints, a.NodeEndpoints...)
	case *kmsg.ShareAcknowledgeResponse:
		a := add.(*kmsg.ShareAcknowledgeResponse)
		r.Topics = append(r.Topics, a.Topics...)
		r.NodeEndpoints = append(r.NodeEndpoints, a.NodeEndpoints...)
	case *kmsg.ConsumerGroupHeartbeatResponse, *kmsg.InitProducerIDResponse, *kmsg.AddOffsetsToTxnResponse, *kmsg.EndTxnResponse:
		// no per-item answers
	default:
		return false
	}
	return true
}

// hideInternalTopicPartitions takes the internal topics out of a
// DescribeTopicPartitions answer for all topics. A next cursor naming
// one points past it instead: at the next topic Ferry knows of, or
// nowhere.
func (s *Server) hideInternalTopicPartitions(u *upstream.Cluster, resp *kmsg.DescribeTopicPartitionsResponse) {
	it := &s.internal
	if len(it.names) == 0 {
		return
	}
	resp.Topics = slices.DeleteFunc(resp.Topics, func(t kmsg.DescribeTopicPartitionsResponseTopic) bool {
		return t.Topic != nil && it.has(*t.Topic)
	})
	if resp.NextCursor == nil || !it.has(resp.NextCursor.Topic) {
		return
	}
	after := resp.NextCursor.Topic
	next := ""
	for name := range u.Snapshot().Topics {
		if name > after && !it.has(name) && (next == "" || name < next) {
			next = name
		}
	}
	if next == "" {
		resp.NextCursor = nil
		return
	}
	resp.NextCursor.Topic, resp.NextCursor.Partition = next, 0
}

// hideInternalReassignments takes the internal topics out of a
// ListPartitionReassignments answer for all topics.
func (s *Server) hideInternalReassignments(resp *kmsg.ListPartitionReassignmentsResponse) {
	resp.Topics = slices.DeleteFunc(resp.Topics, func(t kmsg.ListPartitionReassignmentsResponseTopic) bool {
		return s.internal.has(t.Topic)
	})
}

// hideInternalConfigResources takes the internal topics out of a
// ListConfigResources answer.
func (s *Server) hideInternalConfigResources(resp *kmsg.ListConfigResourcesResponse) {
	resp.ConfigResources = slices.DeleteFunc(resp.ConfigResources, func(r kmsg.ListConfigResourcesResponseConfigResource) bool {
		return r.Type == int8(kmsg.ConfigResourceTypeTopic) && s.internal.has(r.Name)
	})
}

// hideInternalAssigned takes Ferry's own topics out of a KIP-848 member's
// assignment (its topic IDs virtual already).
func (s *Server) hideInternalAssigned(resp *kmsg.ConsumerGroupHeartbeatResponse) {
	if resp.Assignment == nil || len(s.internal.ids) == 0 {
		return
	}
	take(&resp.Assignment.Topics, func(t *kmsg.ConsumerGroupHeartbeatResponseAssignmentTopic) bool { return s.internal.hasID(t.TopicID) })
}

// hideInternalShareAssigned takes Ferry's own topics out of a share
// group member's assignment (its topic IDs virtual already).
func (s *Server) hideInternalShareAssigned(resp *kmsg.ShareGroupHeartbeatResponse) {
	if resp.Assignment == nil || len(s.internal.ids) == 0 {
		return
	}
	take(&resp.Assignment.TopicPartitions, func(t *kmsg.ShareGroupHeartbeatResponseAssignmentTopicPartition) bool {
		return s.internal.hasID(t.TopicID)
	})
}

// hideInternalDescribed takes Ferry's own topics out of the members'
// assignments, current and target, and subscriptions that a
// ConsumerGroupDescribe answer shows (a regex group's take them in).
func (s *Server) hideInternalDescribed(resp *kmsg.ConsumerGroupDescribeResponse) {
	it := &s.internal
	if len(it.names) == 0 {
		return
	}
	hide := func(t *kmsg.AssignmentTopicPartition) bool { return it.has(t.Topic) || it.hasID(t.TopicID) }
	for gi := range resp.Groups {
		g := &resp.Groups[gi]
		for mi := range g.Members {
			m := &g.Members[mi]
			take(&m.Assignment.TopicPartitions, hide)
			take(&m.TargetAssignment.TopicPartitions, hide)
			take(&m.SubscribedTopics, func(n *string) bool { return it.has(*n) })
		}
	}
}

// hideInternalLogDirs takes Ferry's own topics out of a DescribeLogDirs
// answer.
func (s *Server) hideInternalLogDirs(resp *kmsg.DescribeLogDirsResponse) {
	for di := range resp.Dirs {
		take(&resp.Dirs[di].Topics, func(t *kmsg.DescribeLogDirsResponseDirTopic) bool { return s.internal.has(t.Topic) })
	}
}
