package proxy

// Requests for a group coordinator or a transaction coordinator: classic
// groups (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), KIP-848
// (ConsumerGroupHeartbeat, ConsumerGroupDescribe), offsets (OffsetCommit,
// OffsetFetch, OffsetDelete, TxnOffsetCommit), group admin (DescribeGroups,
// DeleteGroups) and transactions (InitProducerId, AddPartitionsToTxn,
// AddOffsetsToTxn, EndTxn, DescribeTransactions).
//
// Clients send them to the Ferry member FindCoordinator named; that member
// forwards them to the real coordinator of the active cluster. Requests that
// name several groups or transactions are split by coordinator and the
// answers merged. When the answer says the coordinator moved, Ferry forgets
// it and passes the error on: the client asks FindCoordinator again. Topic
// IDs, producer IDs and leader epochs are translated both ways.

import (
	"context"
	"sort"

	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	coordGroup int8 = 0
	coordTxn   int8 = 1
)

// coordinatorKeys returns the keys a request names and their type.
func coordinatorKeys(key int16, version int16, kr kmsg.Request) (int8, []string) {
	switch r := kr.(type) {
	case *kmsg.OffsetCommitRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.OffsetFetchRequest:
		if version < 8 {
			return coordGroup, []string{r.Group}
		}
		ks := make([]string, len(r.Groups))
		for i, g := range r.Groups {
			ks[i] = g.Group
		}
		return coordGroup, ks
	case *kmsg.JoinGroupRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.HeartbeatRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.LeaveGroupRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.SyncGroupRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.DescribeGroupsRequest:
		return coordGroup, r.Groups
	case *kmsg.DeleteGroupsRequest:
		return coordGroup, r.Groups
	case *kmsg.OffsetDeleteRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.TxnOffsetCommitRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.ConsumerGroupHeartbeatRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.ConsumerGroupDescribeRequest:
		return coordGroup, r.Groups
	case *kmsg.StreamsGroupHeartbeatRequest:
		return coordGroup, []string{r.Group}
	case *kmsg.StreamsGroupDescribeRequest:
		return coordGroup, r.Groups
	case *kmsg.ShareGroupHeartbeatRequest:
		return coordGroup, []string{r.GroupID}
	case *kmsg.ShareGroupDescribeRequest:
		return coordGroup, r.GroupIDs
	case *kmsg.DescribeShareGroupOffsetsRequest:
		ks := make([]string, len(r.Groups))
		for i, g := range r.Groups {
			ks[i] = g.GroupID
		}
		return coordGroup, ks
	case *kmsg.AlterShareGroupOffsetsRequest:
		return coordGroup, []string{r.GroupID}
	case *kmsg.DeleteShareGroupOffsetsRequest:
		return coordGroup, []string{r.GroupID}
	case *kmsg.InitProducerIDRequest:
		if r.TransactionalID == nil {
			return coordTxn, nil // any broker allocates an idempotent producer ID
		}
		return coordTxn, []string{*r.TransactionalID}
	case *kmsg.AddPartitionsToTxnRequest:
		if version < 4 {
			return coordTxn, []string{r.TransactionalID}
		}
		ks := make([]string, len(r.Transactions))
		for i, t := range r.Transactions {
			ks[i] = t.TransactionalID
		}
		return coordTxn, ks
	case *kmsg.AddOffsetsToTxnRequest:
		return coordTxn, []string{r.TransactionalID}
	case *kmsg.EndTxnRequest:
		return coordTxn, []string{r.TransactionalID}
	case *kmsg.DescribeTransactionsRequest:
		return coordTxn, r.TransactionalIDs
	}
	return coordGroup, nil
}

func (s *Server) forwardCoordinated(c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	typ, keys := coordinatorKeys(req.hdr.Key, req.hdr.Version, kr)
	ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
	defer cancel()
	// Where each key goes. A key whose coordinator cannot be found goes to
	// any broker, which answers it with the coordinator error a client
	// expects and retries on.
	byBroker := map[int32][]int{}
	for i, k := range keys {
		b, err := req.up.Coordinator(ctx, typ, k)
		if err != nil {
			if b, err = req.up.AnyBroker(); err != nil {
				return nil, err
			}
		}
		byBroker[b] = append(byBroker[b], i)
	}
	gen := req.state.Generation
	r, rewritten, mapped := s.otherGeneration(c, req, kr)
	if r != nil {
		return r, nil
	}
	rewritten = s.clampLostCommits(ctx, c, req, kr) || rewritten // epochs as the client sent them
	rewritten = s.translate(ctx, req.up, gen, kr, toPhysical) || rewritten
	if typ == coordTxn && mapped == nil {
		for _, k := range keys {
			s.noteTxn(k)
		}
		r, rw := s.switchFencedCoordinator(req, kr)
		if r != nil {
			return r, nil
		}
		rewritten = rewritten || rw
	} else if tc, ok := kr.(*kmsg.TxnOffsetCommitRequest); ok && mapped == nil {
		s.noteTxn(tc.TransactionalID)
		if r, _ := s.switchFencedCoordinator(req, kr); r != nil {
			return r, nil
		}
	}
	if mapped != nil {
		mapped.set() // physical already: not translated
	}
	fix := func(resp kmsg.Response) error {
		if coordinatorMoved(resp) {
			for _, k := range keys {
				req.up.ForgetCoordinator(typ, k)
			}
		}
		if mapped != nil {
			mapped.answered(resp) // physical IDs yet
		}
		s.memberFromBeforeSwitch(c.ctx, req.up, gen, kr, resp)
		s.translate(context.Background(), req.up, gen, resp, toVirtual)
		switch r := resp.(type) {
		case *kmsg.ConsumerGroupHeartbeatResponse:
			s.hideInternalAssigned(r)
		case *kmsg.ConsumerGroupDescribeResponse:
			s.hideInternalDescribed(r)
		case *kmsg.ShareGroupHeartbeatResponse:
			s.hideInternalShareAssigned(r)
		}
		return nil
	}
	if len(keys) == 0 {
		// An idempotent producer's ID: any broker allocates one, so a
		// broker that cannot be reached (a dead one stays in the
		// cluster's metadata for its session timeout) is passed over.
		return s.forwardReachable(c, req, req.up.BrokerIDs(), kr, rewritten, fix)
	}
	if len(byBroker) == 1 {
		for b := range byBroker {
			return s.forwardTo(c, req, b, kr, rewritten, fix)
		}
	}
	parts := map[int32]kmsg.Request{}
	for b, idxs := range byBroker {
		sub, ok := keysSubset(kr, idxs)
		if !ok {
			// A single-key request never gets here; be safe anyway.
			return s.forwardTo(c, req, b, kr, rewritten, fix)
		}
		parts[b] = sub
	}
	calls := c.sendSplit(req, parts, true, false)
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		g, err := c.gather(ctx, req, calls)
		if err != nil {
			return nil, nil, err
		}
		var merged kmsg.Response
		for _, r := range g.resps {
			if r == nil {
				g.release()
				return nil, nil, upstream.ErrClosed
			}
			fix(r)
			if merged == nil {
				merged = r
				continue
			}
			mergeKeyAnswers(merged, r)
		}
		return merged, g.release, nil
	}), nil
}

// keysSubset copies a request that names several coordinator keys,
// keeping only the keys at idxs (indexes into coordinatorKeys' list);
// ok is false for a request that names one key.
func keysSubset(kr kmsg.Request, idxs []int) (sub kmsg.Request, ok bool) {
	sort.Ints(idxs)
	switch r := kr.(type) {
	case *kmsg.DescribeGroupsRequest:
		c := *r
		c.Groups = pick(r.Groups, idxs)
		return &c, true
	case *kmsg.DeleteGroupsRequest:
		c := *r
		c.Groups = pick(r.Groups, idxs)
		return &c, true
	case *kmsg.ConsumerGroupDescribeRequest:
		c := *r
		c.Groups = pick(r.Groups, idxs)
		return &c, true
	case *kmsg.StreamsGroupDescribeRequest:
		c := *r
		c.Groups = pick(r.Groups, idxs)
		return &c, true
	case *kmsg.ShareGroupDescribeRequest:
		c := *r
		c.GroupIDs = pick(r.GroupIDs, idxs)
		return &c, true
	case *kmsg.DescribeShareGroupOffsetsRequest:
		c := *r
		c.Groups = pick(r.Groups, idxs)
		return &c, true
	case *kmsg.DescribeTransactionsRequest:
		c := *r
		c.TransactionalIDs = pick(r.TransactionalIDs, idxs)
		return &c, true
	case *kmsg.OffsetFetchRequest:
		c := *r
		c.Groups = pick(r.Groups, idxs)
		return &c, true
	case *kmsg.AddPartitionsToTxnRequest:
		c := *r
		c.Transactions = pick(r.Transactions, idxs)
		return &c, true
	}
	return nil, false
}

// pick is the elements of s at idxs, in that order.
func pick[T any](s []T, idxs []int) []T {
	out := make([]T, 0, len(idxs))
	for _, i := range idxs {
		out = append(out, s[i])
	}
	return out
}

// mergeKeyAnswers appends from's per-key answers to into's (answers to
// two keysSubset parts of one request), and keeps the larger throttle.
func mergeKeyAnswers(into, from kmsg.Response) {
	switch r := into.(type) {
	case *kmsg.DescribeGroupsResponse:
		r.Groups = append(r.Groups, from.(*kmsg.DescribeGroupsResponse).Groups...)
	case *kmsg.DeleteGroupsResponse:
		r.Groups = append(r.Groups, from.(*kmsg.DeleteGroupsResponse).Groups...)
	case *kmsg.ConsumerGroupDescribeResponse:
		r.Groups = append(r.Groups, from.(*kmsg.ConsumerGroupDescribeResponse).Groups...)
	case *kmsg.StreamsGroupDescribeResponse:
		r.Groups = append(r.Groups, from.(*kmsg.StreamsGroupDescribeResponse).Groups...)
	case *kmsg.ShareGroupDescribeResponse:
		r.Groups = append(r.Groups, from.(*kmsg.ShareGroupDescribeResponse).Groups...)
	case *kmsg.DescribeShareGroupOffsetsResponse:
		r.Groups = append(r.Groups, from.(*kmsg.DescribeShareGroupOffsetsResponse).Groups...)
	case *kmsg.DescribeTransactionsResponse:
		r.TransactionStates = append(r.TransactionStates, from.(*kmsg.DescribeTransactionsResponse).TransactionStates...)
	case *kmsg.OffsetFetchResponse:
		r.Groups = append(r.Groups, from.(*kmsg.OffsetFetchResponse).Groups...)
	case *kmsg.AddPartitionsToTxnResponse:
		r.Transactions = append(r.Transactions, from.(*kmsg.AddPartitionsToTxnResponse).Transactions...)
	}
	keepLargerThrottle(into, from)
}

// keepLargerThrottle sets into's throttle to from's when from's is larger.
func keepLargerThrottle(into, from kmsg.Response) {
	t, ok1 := into.(kmsg.ThrottleResponse)
	ft, ok2 := from.(kmsg.ThrottleResponse)
	set, ok3 := into.(kmsg.SetThrottleResponse)
	if !ok1 || !ok2 || !ok3 {
		return
	}
	a, _ := t.Throttle()
	if b, _ := ft.Throttle(); b > a {
		set.SetThrottle(b)
	}
}
