package proxy

// DescribeCluster (key 60), v0-v2. Answered by Ferry: the virtual cluster's
// ID and its members as brokers. v1 added EndpointType (1 brokers, 2
// controllers): Ferry has no controllers to show, so both get the members.

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleDescribeCluster(s *Server, _ *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.DescribeClusterRequest)
	resp := kmsg.NewPtrDescribeClusterResponse()
	resp.ClusterID = s.cfg.clusterID
	resp.EndpointType = in.EndpointType
	brokers := s.virtualBrokers()
	resp.ControllerID = brokers[0].NodeID
	for _, b := range brokers {
		resp.Brokers = append(resp.Brokers, kmsg.DescribeClusterResponseBroker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
	}
	if !in.IncludeClusterAuthorizedOperations {
		resp.ClusterAuthorizedOperations = -2147483648
	}
	return localReply(req, resp), nil
}
