package proxy

// CreateTopics (key 19), every version Ferry advertises (Kafka 4 serves v2+).
// Forwarded like the other admin requests (admin.go), but an explicit
// replica assignment names brokers, and a client only knows the virtual
// brokers Ferry's Metadata shows: each is mapped to the physical broker its
// lane stands for (replicaMap, lanes.go). A topic whose assignment names a
// broker that maps to no single physical broker, or two that map to the
// same one, is answered by Ferry with INVALID_REPLICA_ASSIGNMENT and a
// message listing the valid IDs (v1+ carry messages), as Kafka answers an
// assignment naming unknown or duplicate brokers; the other topics go
// upstream, in a copy of the request (the client's stays as it came, for an
// answer in the upstream's place).

import (
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleCreateTopics(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.CreateTopicsRequest)
	return forwardAssigned(s, c, req, kr, in.Topics, assignedTopics[kmsg.CreateTopicsRequestTopic, kmsg.CreateTopicsRequestTopicReplicaAssignment, kmsg.CreateTopicsResponseTopic]{
		assignments: func(t *kmsg.CreateTopicsRequestTopic) *[]kmsg.CreateTopicsRequestTopicReplicaAssignment {
			return &t.ReplicaAssignment
		},
		replicas: func(a *kmsg.CreateTopicsRequestTopicReplicaAssignment) *[]int32 { return &a.Replicas },
		where: func(_ int, a *kmsg.CreateTopicsRequestTopicReplicaAssignment) string {
			return "partition " + strconv.Itoa(int(a.Partition))
		},
		refuse: func(t *kmsg.CreateTopicsRequestTopic, msg string) kmsg.CreateTopicsResponseTopic {
			r := kmsg.NewCreateTopicsResponseTopic()
			r.Topic, r.ErrorCode, r.ErrorMessage = t.Topic, kerr.InvalidReplicaAssignment.Code, &msg
			return r
		},
		only: func(topics []kmsg.CreateTopicsRequestTopic) kmsg.Request {
			out := *in
			out.Topics = topics
			return &out
		},
		addRefused: func(resp kmsg.Response, refused []kmsg.CreateTopicsResponseTopic) {
			r := resp.(*kmsg.CreateTopicsResponse)
			r.Topics = append(r.Topics, refused...)
		},
	})
}
