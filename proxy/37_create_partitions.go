package proxy

// CreatePartitions (key 37), every version Ferry advertises. As
// CreateTopics (19_create_topics.go): an explicit assignment of the new
// partitions names virtual brokers, mapped to the physical brokers their
// lanes stand for; a topic whose assignment cannot be mapped is answered by
// Ferry with INVALID_REPLICA_ASSIGNMENT and a message listing the valid IDs.

import (
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleCreatePartitions(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.CreatePartitionsRequest)
	var m *replicaMap
	var refused []kmsg.CreatePartitionsResponseTopic
	keep := in.Topics[:0]
	for _, t := range in.Topics {
		msg := ""
		for i := range t.Assignment {
			if m == nil {
				m = s.replicaMap(req.up)
			}
			a := &t.Assignment[i]
			phys, why := m.physical(a.Replicas)
			if why != "" {
				msg = "new partition " + strconv.Itoa(i) + " of the assignment: " + why
				break
			}
			a.Replicas = phys
		}
		if msg == "" {
			keep = append(keep, t)
			continue
		}
		r := kmsg.NewCreatePartitionsResponseTopic()
		r.Topic, r.ErrorCode, r.ErrorMessage = t.Topic, kerr.InvalidReplicaAssignment.Code, &msg
		refused = append(refused, r)
	}
	in.Topics = keep
	merge := func(resp kmsg.Response) {
		r := resp.(*kmsg.CreatePartitionsResponse)
		r.Topics = append(r.Topics, refused...)
	}
	if len(in.Topics) == 0 && len(refused) > 0 {
		resp := kmsg.NewPtrCreatePartitionsResponse()
		merge(resp)
		return localReply(req, resp), nil
	}
	if m == nil {
		return s.forwardAny(c, req, kr)
	}
	return s.forwardAnyWith(c, req, kr, true, merge)
}
