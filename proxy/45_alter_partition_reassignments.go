package proxy

// AlterPartitionReassignments (key 45; kmsg's AlterPartitionAssignments),
// v0-v1. Forwarded like the other admin requests (admin.go), with each
// partition's target replicas mapped from the virtual brokers a client
// knows to the physical brokers their lanes stand for, as in CreateTopics
// (19_create_topics.go). A partition whose replicas cannot be mapped is
// answered by Ferry with INVALID_REPLICA_ASSIGNMENT and a message listing
// the valid IDs, as Kafka answers per partition; null replicas (cancel a
// reassignment) pass as they are. The answer names partitions only.

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleAlterPartitionReassignments(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.AlterPartitionAssignmentsRequest)
	m := s.replicaMap(req.up)
	var refused []kmsg.AlterPartitionAssignmentsResponseTopic
	keepTopics := make([]kmsg.AlterPartitionAssignmentsRequestTopic, 0, len(in.Topics))
	for _, t := range in.Topics { // t is a copy: in keeps the client's IDs
		var bad []kmsg.AlterPartitionAssignmentsResponseTopicPartition
		keep := make([]kmsg.AlterPartitionAssignmentsRequestTopicPartition, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			if p.Replicas != nil {
				phys, why := m.physical(p.Replicas)
				if why != "" {
					r := kmsg.NewAlterPartitionAssignmentsResponseTopicPartition()
					r.Partition, r.ErrorCode, r.ErrorMessage = p.Partition, kerr.InvalidReplicaAssignment.Code, &why
					bad = append(bad, r)
					continue
				}
				p.Replicas = phys
			}
			keep = append(keep, p)
		}
		t.Partitions = keep
		if len(bad) > 0 {
			rt := kmsg.NewAlterPartitionAssignmentsResponseTopic()
			rt.Topic, rt.Partitions = t.Topic, bad
			refused = append(refused, rt)
		}
		if len(keep) > 0 {
			keepTopics = append(keepTopics, t)
		}
	}
	merge := func(resp kmsg.Response) {
		r := resp.(*kmsg.AlterPartitionAssignmentsResponse)
		if r.ErrorCode != 0 {
			return // the request as a whole failed
		}
	next:
		for _, rt := range refused {
			for i := range r.Topics {
				if r.Topics[i].Topic == rt.Topic {
					r.Topics[i].Partitions = append(r.Topics[i].Partitions, rt.Partitions...)
					continue next
				}
			}
			r.Topics = append(r.Topics, rt)
		}
	}
	out := *in
	out.Topics = keepTopics
	return s.forwardRest(c, req, &out, len(keepTopics) == 0 && len(refused) > 0, merge)
}
