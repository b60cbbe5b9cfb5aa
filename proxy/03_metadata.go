package proxy

// Metadata (key 3), v0-v13. Answered by Ferry from a fresh upstream
// Metadata request (clients ask rarely: at start, every metadata.max.age,
// and after errors, which is exactly when freshness matters).
//
// Brokers are Ferry's members, the cluster ID is Ferry's, each partition's
// leader is the lane of its physical leader on the member rendezvous
// hashing picks, its replicas and ISR are the lanes of its physical ones on
// that member (replicaLanes, lanes.go), leader epochs are virtual
// (generation-shifted) and topic IDs are virtual (v10+). v0 asks for every
// topic with an empty list, v1+ with a null one; v10+ may name topics by
// (virtual) ID; v13 added a top-level error code. Ferry's own topics are
// never listed, and one named is answered TOPIC_AUTHORIZATION_FAILED
// without asking upstream (internal_topics.go).
//
// Authorized operations: a topic's are the cluster's answer (Ferry asks
// upstream with the client's IncludeTopicAuthorizedOperations). The
// cluster's (v8-v10 IncludeClusterAuthorizedOperations; v11 moved it to
// DescribeCluster) are what the active cluster answers DescribeCluster,
// as in 60_describe_cluster.go; INT32_MIN when not asked for.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

func handleMetadata(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.MetadataRequest)
	ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
	defer cancel()

	all := in.Topics == nil || (req.hdr.Version == 0 && len(in.Topics) == 0)
	up := kmsg.NewPtrMetadataRequest()
	up.AllowAutoTopicCreation = in.AllowAutoTopicCreation
	up.IncludeTopicAuthorizedOperations = in.IncludeTopicAuthorizedOperations
	var unknownIDs [][16]byte
	// Ferry's own topics, answered as Kafka answers a topic the client
	// may not describe, and never asked upstream (internal_topics.go).
	var refused []kmsg.MetadataResponseTopic
	if !all {
		up.Topics = make([]kmsg.MetadataRequestTopic, 0, len(in.Topics))
		for _, t := range in.Topics {
			if (t.Topic != nil && s.internal.has(*t.Topic)) || (t.Topic == nil && s.internal.hasID(t.TopicID)) {
				rt := kmsg.NewMetadataResponseTopic()
				// By name: the name and no ID; by ID: the ID and no
				// name, as Kafka answers.
				rt.ErrorCode, rt.Topic = topicAuthFailed, t.Topic
				if t.Topic == nil {
					rt.TopicID = t.TopicID
				}
				refused = append(refused, rt)
				continue
			}
			if t.Topic != nil {
				up.Topics = append(up.Topics, kmsg.MetadataRequestTopic{Topic: t.Topic})
				continue
			}
			if ti := req.up.TopicByVID(ctx, t.TopicID); ti != nil {
				name := ti.Name
				up.Topics = append(up.Topics, kmsg.MetadataRequestTopic{Topic: &name})
			} else {
				unknownIDs = append(unknownIDs, t.TopicID)
			}
		}
	}
	brokers := s.virtualBrokers()
	gen := req.state.Generation
	// Every topic, the cluster's authorized operations not asked for: the
	// answer depends on nothing but the cluster's, and may be kept.
	keep := all && !(in.IncludeClusterAuthorizedOperations && req.hdr.Version >= 8 && req.hdr.Version <= 10)
	var (
		upResp *kmsg.MetadataResponse
		snap   *upstream.Snapshot
	)
	var body upstream.MetadataBody // the cluster's answer as it encoded it, when kept
	if all || len(up.Topics) > 0 {
		var (
			r    *kmsg.MetadataResponse
			err  error
			kept *metadataAnswer
		)
		if keep {
			var f *metadataFlight
			if f, err = s.metaAnswers.ask(ctx, s.ctx, flightKey{req.up, up.IncludeTopicAuthorizedOperations}); err == nil {
				r, body, err, kept = f.resp, f.body, f.err, f.kept
				// One request of the flight at a time past here: the
				// first translates a changed answer, the others find
				// its translation (metadataAnswers.find).
				f.translating.Lock()
				defer f.translating.Unlock()
			}
			if err == nil && r == nil {
				// The bytes of the kept answer's: nothing decoded.
				if kept.under(gen, brokers) {
					kept.installed()
					s.metrics.metaAllBy[metaSameBytes].Inc()
					return kept.reply(req), nil
				}
				r = kept.from // translated again, under this generation and these members
			}
		} else {
			r, err = req.up.AskMetadata(ctx, up)
		}
		if err != nil {
			// The cluster cannot answer now: answer from what Ferry last
			// knew, so that clients keep their brokers and retry.
			c.log.Info("metadata from the cache: the cluster did not answer", zap.Error(err))
			if keep {
				s.metrics.metaAllBy[metaFromSnapshot].Inc()
			}
			r, keep = metadataResponse(req.up.Snapshot(), up.Topics, all), false
		}
		if keep {
			if a := s.metaAnswers.find(req.up, gen, brokers, r); a != nil {
				a.setBody(body)
				a.installed()
				s.metrics.metaAllBy[metaSameFields].Inc()
				return a.reply(req), nil
			}
		}
		if err == nil {
			snap = req.up.Install(r, all)
		}
		upResp = r
	} else {
		upResp = kmsg.NewPtrMetadataResponse()
	}

	resp := kmsg.NewPtrMetadataResponse()
	for _, b := range brokers {
		resp.Brokers = append(resp.Brokers, kmsg.MetadataResponseBroker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
	}
	resp.ClusterID = &s.cfg.clusterID
	resp.ControllerID = brokers[0].NodeID
	resp.AuthorizedOperations = authorizedOperationsOmitted
	if in.IncludeClusterAuthorizedOperations && req.hdr.Version >= 8 && req.hdr.Version <= 10 {
		// Ferry asks upstream at a version without this field (v11
		// removed it): the cluster's answer comes from DescribeCluster.
		ops, err := req.up.ClusterOperations(ctx)
		if err != nil {
			return nil, err
		}
		resp.AuthorizedOperations = 0 // what Kafka answers a caller that may not describe the cluster
		if ops.ErrorCode == 0 {
			resp.AuthorizedOperations = ops.ClusterAuthorizedOperations
		}
	}
	resp.ErrorCode = upResp.ErrorCode
	if refused != nil {
		s.internalRefused(c, req)
	}
	resp.Topics = make([]kmsg.MetadataResponseTopic, 0, len(upResp.Topics)+len(unknownIDs)+len(refused))
	for _, t := range upResp.Topics {
		if t.Topic != nil && s.internal.has(*t.Topic) {
			continue // listed for all topics: never shown
		}
		out := kmsg.MetadataResponseTopic{ErrorCode: t.ErrorCode, Topic: t.Topic, IsInternal: t.IsInternal, AuthorizedOperations: t.AuthorizedOperations}
		if t.Topic != nil {
			out.TopicID = routing.VirtualTopicID(s.cfg.clusterID, *t.Topic)
			out.Partitions = make([]kmsg.MetadataResponseTopicPartition, 0, len(t.Partitions))
			for _, p := range t.Partitions {
				out.Partitions = append(out.Partitions, s.virtualPartition(req.up, *t.Topic, p, gen, brokers))
			}
		}
		resp.Topics = append(resp.Topics, out)
	}
	for _, id := range unknownIDs {
		t := kmsg.NewMetadataResponseTopic() // AuthorizedOperations INT32_MIN, as Kafka answers an unknown ID
		t.ErrorCode, t.TopicID = kerr.UnknownTopicID.Code, id
		resp.Topics = append(resp.Topics, t)
	}
	resp.Topics = append(resp.Topics, refused...)
	if keep {
		s.metrics.metaAllBy[metaTranslated].Inc()
		return s.metaAnswers.keep(req.up, gen, brokers, upResp, body, resp, snap).reply(req), nil
	}
	return localReply(req, resp), nil
}

// virtualPartition maps one upstream partition to what clients see.
func (s *Server) virtualPartition(u *upstream.Cluster, topic string, p kmsg.MetadataResponseTopicPartition, gen uint32, brokers []routing.Broker) kmsg.MetadataResponseTopicPartition {
	out := kmsg.MetadataResponseTopicPartition{ErrorCode: p.ErrorCode, Partition: p.Partition, Leader: -1, LeaderEpoch: routing.VirtualEpoch(gen, p.LeaderEpoch)}
	if p.Leader < 0 {
		out.Replicas, out.ISR = []int32{}, []int32{}
		return out
	}
	out.Leader = s.virtualLeader(u, topic, p.Partition, p.Leader)
	out.Replicas, out.ISR = s.replicaLanes(u, brokers, out.Leader, p.Replicas, p.ISR)
	out.OfflineReplicas = []int32{}
	return out
}

// metadataResponse answers a Metadata request from the snapshot: the topics
// asked for (every one when all is set), each partition as last seen. A
// topic the snapshot does not hold is LEADER_NOT_AVAILABLE, retriable:
// Ferry cannot tell whether it exists.
func metadataResponse(s *upstream.Snapshot, topics []kmsg.MetadataRequestTopic, all bool) *kmsg.MetadataResponse {
	resp := kmsg.NewPtrMetadataResponse()
	add := func(name string) {
		t := s.Topics[name]
		n := name
		rt := kmsg.MetadataResponseTopic{Topic: &n, AuthorizedOperations: authorizedOperationsOmitted}
		if t == nil {
			rt.ErrorCode = kerr.LeaderNotAvailable.Code
			resp.Topics = append(resp.Topics, rt)
			return
		}
		rt.ErrorCode, rt.IsInternal, rt.TopicID = t.Err, t.Internal, t.ID
		for i, p := range t.Parts {
			if !p.Exists {
				continue
			}
			rt.Partitions = append(rt.Partitions, kmsg.MetadataResponseTopicPartition{
				Partition: int32(i), ErrorCode: p.Err, Leader: p.Leader, LeaderEpoch: p.Epoch,
				Replicas: p.Replicas, ISR: p.ISR, OfflineReplicas: p.Offline,
			})
		}
		resp.Topics = append(resp.Topics, rt)
	}
	if all {
		for name := range s.Topics {
			add(name)
		}
		return resp
	}
	for _, t := range topics {
		if t.Topic != nil {
			add(*t.Topic)
		}
	}
	return resp
}
