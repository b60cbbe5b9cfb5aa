package proxy

// Answers Ferry gives in a broker's place when it cannot get the broker's
// own: the upstream connection could not be made, died with the request in
// flight, or the pool was full. A Kafka client retries a retriable error
// code on the connection it has; a connection closed under it is, for some
// clients, a permanent failure of every record in flight (franz-go fails a
// produce whose new connection ends before the first answer). So Ferry
// answers every such request with the code a broker's absence means for its
// API and keeps the connection.

import (
	"github.com/ferry-gw/ferry/protocol/errorresp"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// upstreamErrorCode is the retriable code that tells a client of key's API
// that the broker it needs cannot be reached now, and what to do: find the
// leader again (split requests), find the coordinator again (group and
// transaction requests), find the controller again (admin requests), or
// simply retry.
func upstreamErrorCode(kr kmsg.Request) int16 {
	key := kr.Key()
	if key == int16(kmsg.FindCoordinator) {
		return kerr.CoordinatorNotAvailable.Code
	}
	switch routes[key] {
	case routeSplit, routeLane:
		return kerr.NotLeaderForPartition.Code
	case routeGroup, routeFanOut:
		return kerr.CoordinatorNotAvailable.Code
	case routeTxn:
		if r, ok := kr.(*kmsg.InitProducerIDRequest); ok && r.TransactionalID == nil {
			// An idempotent producer's ID comes from any broker:
			// there is no coordinator to look up again, and the
			// clients differ on what else they retry. The Java
			// client fails the producer on REQUEST_TIMED_OUT and
			// kafkajs on anything but the coordinator errors; every
			// client simply retries COORDINATOR_LOAD_IN_PROGRESS.
			return kerr.CoordinatorLoadInProgress.Code
		}
		return kerr.CoordinatorNotAvailable.Code
	}
	if _, ok := kr.(kmsg.AdminRequest); ok {
		return kerr.NotController.Code
	}
	return kerr.RequestTimedOut.Code
}

// errorResponse builds the answer to kr in which everything the request
// names carries code and msg, the way a broker answers a request it
// refuses as a whole (package errorresp), with the node IDs a broker
// would give as unknown.
func errorResponse(kr kmsg.Request, code int16, msg string) kmsg.Response {
	resp := errorresp.For(kr, code, msg)
	if resp == nil {
		// A request kmsg gained after errorresp was generated; Ferry
		// serves none (TestErrorResponseEveryAPI).
		resp = kr.ResponseKind()
		resp.SetVersion(kr.GetVersion())
		return resp
	}
	switch r := resp.(type) {
	case *kmsg.DescribeClusterResponse:
		r.ClusterAuthorizedOperations = -2147483648
	case *kmsg.FindCoordinatorResponse:
		r.NodeID = -1
		for i := range r.Coordinators {
			r.Coordinators[i].NodeID = -1
		}
	}
	return resp
}
