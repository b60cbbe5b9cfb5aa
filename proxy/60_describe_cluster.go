package proxy

// DescribeCluster (key 60), v0-v2. Answered by Ferry: the virtual cluster's
// ID and its members as brokers. v1 added EndpointType (1 brokers, 2
// controllers): Ferry has no controllers to show, so both get the members.
//
// With IncludeClusterAuthorizedOperations, Kafka answers the bit field of
// the operations the caller may perform on the cluster (every cluster
// operation where no authorizer is configured). Ferry does not invent it:
// it answers what the active cluster answers Ferry for the same question
// (clusterOperations), and a refusal as the cluster refused. Without the
// flag the field is INT32_MIN, as Kafka leaves it.

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// authorizedOperationsOmitted is the authorized-operations value of an
// answer to a request that did not ask for them.
const authorizedOperationsOmitted = -2147483648

func handleDescribeCluster(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.DescribeClusterRequest)
	resp := kmsg.NewPtrDescribeClusterResponse()
	resp.ClusterID = s.cfg.clusterID
	resp.EndpointType = in.EndpointType
	brokers := s.virtualBrokers()
	resp.ControllerID = brokers[0].NodeID
	for _, b := range brokers {
		resp.Brokers = append(resp.Brokers, kmsg.DescribeClusterResponseBroker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
	}
	resp.ClusterAuthorizedOperations = authorizedOperationsOmitted
	if !in.IncludeClusterAuthorizedOperations {
		return localReply(req, resp), nil
	}
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		ops, err := req.up.ClusterOperations(ctx)
		if err != nil {
			return nil, nil, err
		}
		if ops.ErrorCode != 0 {
			resp.ErrorCode, resp.ErrorMessage = ops.ErrorCode, ops.ErrorMessage
			resp.Brokers, resp.ClusterID, resp.ControllerID = []kmsg.DescribeClusterResponseBroker{}, "", -1
			return resp, nil, nil
		}
		resp.ClusterAuthorizedOperations = ops.ClusterAuthorizedOperations
		return resp, nil, nil
	}), nil
}
