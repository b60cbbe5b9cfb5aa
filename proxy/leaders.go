package proxy

import (
	"context"
	"errors"
	"slices"

	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// errStop ends a batch walk early.
var errStop = errors.New("stop")

// tp names a partition.
type tp struct {
	topic string
	p     int32
}

// byLeader groups partitions by their upstream leader. Partitions Ferry
// cannot route are returned with the error a broker would give.
func (c *clientConn) byLeader(ctx context.Context, u *upstream.Cluster, parts []tp) (map[int32][]tp, map[tp]int16) {
	out := map[int32][]tp{}
	var errs map[tp]int16
	for _, x := range parts {
		pinfo, ok := u.Partition(ctx, x.topic, x.p)
		code := int16(0)
		switch {
		case !ok:
			code = kerr.UnknownTopicOrPartition.Code
		case pinfo.Leader < 0:
			code = kerr.NotLeaderForPartition.Code
		}
		if code != 0 {
			if errs == nil {
				errs = map[tp]int16{}
			}
			errs[x] = code
			continue
		}
		out[pinfo.Leader] = append(out[pinfo.Leader], x)
	}
	return out, errs
}

// splitByLeader sends a partition-addressed request (ListOffsets,
// OffsetForLeaderEpoch, DeleteRecords, DescribeProducers) to the upstream
// leaders of its partitions. entries holds the request's entry for each
// partition in order; sub returns an empty request for one broker with the
// client's request-level fields, and addTopic appends one topic with its
// partitions' entries to it. Partitions Ferry cannot route get their error
// code in local; so do those of its own topics (internal_topics.go),
// which are never forwarded.
func splitByLeader[P any](c *clientConn, req *request, order []tp, entries map[tp]P, local map[tp]int16,
	sub func() kmsg.Request, addTopic func(r kmsg.Request, topic string, ps []P)) []*subCall {
	if slices.ContainsFunc(order, func(x tp) bool { return c.s.internal.has(x.topic) }) {
		order = slices.DeleteFunc(slices.Clone(order), func(x tp) bool {
			if c.s.internal.has(x.topic) {
				local[x] = topicAuthFailed
				return true
			}
			return false
		})
		c.s.internalRefused(c, req)
	}
	groups, errs := c.byLeader(c.ctx, req.up, order)
	for x, code := range errs {
		local[x] = code
	}
	parts := make(map[int32]kmsg.Request, len(groups))
	for b, xs := range groups {
		r := sub()
		var topics []string
		byTopic := map[string][]P{}
		for _, x := range xs {
			if _, ok := byTopic[x.topic]; !ok {
				topics = append(topics, x.topic)
			}
			byTopic[x.topic] = append(byTopic[x.topic], entries[x])
		}
		for _, t := range topics {
			addTopic(r, t, byTopic[t])
		}
		parts[b] = r
	}
	return c.sendSplit(req, parts, true, false)
}

// gatherAnswers waits for the parts of a split request and collects each
// partition's answer through each, which reports a decoded response's
// answers and returns its throttle. Partitions without an answer (a broker
// that failed) are missing from the map: the caller answers them with
// local's code or NOT_LEADER_OR_FOLLOWER, which makes the client refresh
// and retry.
func gatherAnswers[A any](ctx context.Context, c *clientConn, req *request, calls []*subCall,
	each func(r kmsg.Response, put func(x tp, a A)) int32) (map[tp]A, int32, func(), error) {
	g, err := c.gather(ctx, req, calls)
	if err != nil {
		return nil, 0, nil, err
	}
	answers := map[tp]A{}
	var throttle int32
	for _, r := range g.resps {
		if r != nil {
			throttle = max(throttle, each(r, func(x tp, a A) { answers[x] = a }))
		}
	}
	return answers, throttle, g.release, nil
}

// unanswered is the error for a partition without an answer.
// answerFor is one partition of a merged Produce or Fetch answer (local is
// by topic index there): Ferry's own error for it, the broker's answer, or
// NOT_LEADER when no broker answered.
func answerFor[A any](local map[int]map[int32]int16, answers map[tp]A, ti int, topic string, partition int32, fail func(int32, int16) A) A {
	if code, ok := local[ti][partition]; ok {
		return fail(partition, code)
	}
	if a, ok := answers[tp{topic, partition}]; ok {
		return a
	}
	return fail(partition, kerr.NotLeaderForPartition.Code)
}

func unanswered(local map[tp]int16, x tp) int16 {
	if code, ok := local[x]; ok {
		return code
	}
	return kerr.NotLeaderForPartition.Code
}
