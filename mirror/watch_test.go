package mirror

import (
	"context"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// named returns the partitions a watcher's request names and forgets.
func named(req *kmsg.FetchRequest) (names, forgets []int32) {
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			names = append(names, p.Partition)
		}
	}
	for _, t := range req.ForgottenTopics {
		forgets = append(forgets, t.Partitions...)
	}
	slices.Sort(names)
	slices.Sort(forgets)
	return names, forgets
}

// TestWatcherSession: the watcher's requests in a fetch session name each
// parked partition once, forget what is no longer parked, and forget a
// partition woken (or unparked) before naming it again even when it parks
// again at the same offset before the next request: the broker answers
// only for partitions whose log changed since its last answer about them,
// so a partition named anew must be a new one to the session.
func TestWatcherSession(t *testing.T) {
	m := &Mirror{metrics: newMetrics(nil), runCtx: context.Background()}
	wt := &watcher{m: m, parked: map[topicPartition]*parking{}, gone: map[topicPartition]struct{}{}, kick: make(chan struct{}, 1)}
	park := func(p int32, offset int64) *parking {
		pk := &parking{parkedFetch: parkedFetch{offset: offset, epoch: 3}, woke: make(chan struct{})}
		wt.parked[topicPartition{"t", p}] = pk
		return pk
	}
	sess := fetchSession{sent: map[topicPartition]parkedFetch{}}
	check := func(what string, wantNames, wantForgets []int32) {
		t.Helper()
		req := wt.request(&sess)
		names, forgets := named(req)
		if !slices.Equal(names, wantNames) || !slices.Equal(forgets, wantForgets) {
			t.Fatalf("%s: request names %v and forgets %v, want %v and %v", what, names, forgets, wantNames, wantForgets)
		}
		if req.SessionEpoch != sess.epoch || req.SessionID != sess.id {
			t.Fatalf("%s: session %d epoch %d, want %d %d", what, req.SessionID, req.SessionEpoch, sess.id, sess.epoch)
		}
		// The broker's answer: a session, the next epoch.
		sess.id = 7
		sess.epoch++
	}
	if wt.request(&sess) != nil {
		t.Fatal("a request with nothing parked")
	}
	park(0, 10)
	p1 := park(1, 20)
	park(2, 30)
	check("first, full", []int32{0, 1, 2}, nil)
	check("nothing changed", nil, nil)

	// Partition 1 changes: woken, its writer goes on.
	resp := &kmsg.FetchResponse{Topics: []kmsg.FetchResponseTopic{{Topic: "t", Partitions: []kmsg.FetchResponseTopicPartition{
		{Partition: 0, HighWatermark: 10, LastStableOffset: 10, LogStartOffset: 0, DivergingEpoch: kmsg.FetchResponseTopicPartitionDivergingEpoch{EndOffset: -1}},
		{Partition: 1, HighWatermark: 21, LastStableOffset: 21, LogStartOffset: 0, DivergingEpoch: kmsg.FetchResponseTopicPartitionDivergingEpoch{EndOffset: -1}},
	}}}}
	wt.deliver(resp)
	select {
	case <-p1.woke:
	default:
		t.Fatal("partition 1's last stable offset passed its writer's position: not woken")
	}
	if _, ok := wt.parked[topicPartition{"t", 0}]; !ok {
		t.Fatal("partition 0, unchanged, woken")
	}
	// It parks again at the same offset before the next request (its
	// fetch found nothing after all): forgotten first, named after.
	park(1, 20)
	check("woken and parked again", nil, []int32{1})
	check("named again", []int32{1}, nil)

	// Parked elsewhere at a new offset: named with it.
	park(2, 31)
	check("new offset", []int32{2}, nil)
	// Unparked (its writer stopped): forgotten.
	delete(wt.parked, topicPartition{"t", 0})
	check("unparked", nil, []int32{0})

	// A new session (the broker lost it): a full request names every
	// parked partition.
	sess.reset()
	check("new session", []int32{1, 2}, nil)
	delete(wt.parked, topicPartition{"t", 1})
	delete(wt.parked, topicPartition{"t", 2})
	if wt.request(&sess) != nil {
		t.Fatal("a request with nothing parked")
	}
}

// TestWatcherWakes: what in a watcher's answer wakes a parked writer.
func TestWatcherWakes(t *testing.T) {
	at := parkedFetch{offset: 100, epoch: 2, logStart: 5}
	quiet := kmsg.FetchResponseTopicPartition{HighWatermark: 104, LastStableOffset: 100, LogStartOffset: 5,
		DivergingEpoch: kmsg.FetchResponseTopicPartitionDivergingEpoch{EndOffset: -1}}
	if changed(at, &quiet) {
		t.Fatal("an open transaction past the writer's position (high watermark above, last stable offset at it) woke it")
	}
	for name, edit := range map[string]func(p *kmsg.FetchResponseTopicPartition){
		"committed records":    func(p *kmsg.FetchResponseTopicPartition) { p.LastStableOffset = 101 },
		"records":              func(p *kmsg.FetchResponseTopicPartition) { p.RecordBatches = []byte{1} },
		"truncated":            func(p *kmsg.FetchResponseTopicPartition) { p.HighWatermark, p.LastStableOffset = 99, 99 },
		"log start raised":     func(p *kmsg.FetchResponseTopicPartition) { p.LogStartOffset = 6 },
		"diverging epoch":      func(p *kmsg.FetchResponseTopicPartition) { p.DivergingEpoch.EndOffset = 90 },
		"not leader any more":  func(p *kmsg.FetchResponseTopicPartition) { p.ErrorCode = 6 },
		"topic gone elsewhere": func(p *kmsg.FetchResponseTopicPartition) { p.ErrorCode = 3 },
	} {
		p := quiet
		edit(&p)
		if !changed(at, &p) {
			t.Errorf("%s: the writer not woken", name)
		}
	}
}
