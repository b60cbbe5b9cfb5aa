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
	var m *replicaMap
	var refused []kmsg.CreateTopicsResponseTopic
	keep := make([]kmsg.CreateTopicsRequestTopic, 0, len(in.Topics))
	for _, t := range in.Topics { // t is a copy: in keeps the client's IDs
		msg := ""
		if len(t.ReplicaAssignment) > 0 {
			if m == nil {
				m = s.replicaMap(req.up)
			}
			t.ReplicaAssignment, msg = physicalAssignments(m, t.ReplicaAssignment,
				func(a *kmsg.CreateTopicsRequestTopicReplicaAssignment) *[]int32 { return &a.Replicas },
				func(_ int, a *kmsg.CreateTopicsRequestTopicReplicaAssignment) string {
					return "partition " + strconv.Itoa(int(a.Partition))
				})
		}
		if msg == "" {
			keep = append(keep, t)
			continue
		}
		r := kmsg.NewCreateTopicsResponseTopic()
		r.Topic, r.ErrorCode, r.ErrorMessage = t.Topic, kerr.InvalidReplicaAssignment.Code, &msg
		refused = append(refused, r)
	}
	if m == nil {
		return s.forwardAny(c, req, kr)
	}
	out := *in
	out.Topics = keep
	return s.forwardRest(c, req, &out, len(keep) == 0, func(resp kmsg.Response) {
		r := resp.(*kmsg.CreateTopicsResponse)
		r.Topics = append(r.Topics, refused...)
	})
}
