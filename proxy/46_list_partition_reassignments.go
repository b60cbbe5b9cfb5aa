package proxy

// ListPartitionReassignments (key 46), v0. Forwarded like the other admin
// requests (admin.go); the answer's replica lists name physical brokers,
// and each is shown as the lane that stands for it on the member that
// leads the partition in Metadata (virtualLeader), so that an answer's IDs
// can be given back in AlterPartitionReassignments.

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleListPartitionReassignments(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	return s.forwardAnyWith(c, req, kr, false, func(resp kmsg.Response) {
		r := resp.(*kmsg.ListPartitionReassignmentsResponse)
		s.hideInternalReassignments(r) // asked for all topics (internal_topics.go)
		for _, t := range r.Topics {
			for i := range t.Partitions {
				p := &t.Partitions[i]
				for _, ids := range [][]int32{p.Replicas, p.AddingReplicas, p.RemovingReplicas} {
					for j, phys := range ids {
						ids[j] = s.virtualLeader(req.up, t.Topic, p.Partition, phys)
					}
				}
			}
		}
	})
}
