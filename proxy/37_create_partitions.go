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
	var m *replicaMap
	var refused []kmsg.CreatePartitionsResponseTopic
	keep := make([]kmsg.CreatePartitionsRequestTopic, 0, len(in.Topics))
	for _, t := range in.Topics { // t is a copy: in keeps the client's IDs
		msg := ""
		if len(t.Assignment) > 0 {
			if m == nil {
				m = s.replicaMap(req.up)
			}
			t.Assignment, msg = physicalAssignments(m, t.Assignment,
				func(a *kmsg.CreatePartitionsRequestTopicAssignment) *[]int32 { return &a.Replicas },
				func(i int, _ *kmsg.CreatePartitionsRequestTopicAssignment) string {
					return "new partition " + strconv.Itoa(i) + " of the assignment"
				})
		}
		if msg == "" {
			keep = append(keep, t)
			continue
		}
		r := kmsg.NewCreatePartitionsResponseTopic()
		r.Topic, r.ErrorCode, r.ErrorMessage = t.Topic, kerr.InvalidReplicaAssignment.Code, &msg
		refused = append(refused, r)
	}
	if m == nil {
		return s.forwardAny(c, req, kr)
	}
	out := *in
	out.Topics = keep
	return s.forwardRest(c, req, &out, len(keep) == 0, func(resp kmsg.Response) {
		r := resp.(*kmsg.CreatePartitionsResponse)
		r.Topics = append(r.Topics, refused...)
	})
}
