package proxy

// CreatePartitions (key 37), every version Ferry advertises. As
// CreateTopics (19_create_topics.go): an explicit assignment of the new
// partitions names virtual brokers, mapped to the physical brokers their
// lanes stand for; a topic whose assignment cannot be mapped is answered by
// Ferry with INVALID_REPLICA_ASSIGNMENT and a message listing the valid IDs,
// and the others go upstream in a copy of the request.

import (
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleCreatePartitions(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.CreatePartitionsRequest)
	return forwardAssigned(s, c, req, kr, in.Topics, assignedTopics[kmsg.CreatePartitionsRequestTopic, kmsg.CreatePartitionsRequestTopicAssignment, kmsg.CreatePartitionsResponseTopic]{
		assignments: func(t *kmsg.CreatePartitionsRequestTopic) *[]kmsg.CreatePartitionsRequestTopicAssignment {
			return &t.Assignment
		},
		replicas: func(a *kmsg.CreatePartitionsRequestTopicAssignment) *[]int32 { return &a.Replicas },
		where: func(i int, _ *kmsg.CreatePartitionsRequestTopicAssignment) string {
			return "new partition " + strconv.Itoa(i) + " of the assignment"
		},
		refuse: func(t *kmsg.CreatePartitionsRequestTopic, msg string) kmsg.CreatePartitionsResponseTopic {
			r := kmsg.NewCreatePartitionsResponseTopic()
			r.Topic, r.ErrorCode, r.ErrorMessage = t.Topic, kerr.InvalidReplicaAssignment.Code, &msg
			return r
		},
		only: func(topics []kmsg.CreatePartitionsRequestTopic) kmsg.Request {
			out := *in
			out.Topics = topics
			return &out
		},
		addRefused: func(resp kmsg.Response, refused []kmsg.CreatePartitionsResponseTopic) {
			r := resp.(*kmsg.CreatePartitionsResponse)
			r.Topics = append(r.Topics, refused...)
		},
	})
}
