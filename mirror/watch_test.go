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
// so a partition named anew must be a new one to the session. The same
// by topic name (Fetch v12) and, where the broker offers Fetch v13, by
// topic ID: every topic of the requests, named or forgotten, is the
// topic's ID, and the answers by ID wake the partition they are about.
func TestWatcherSession(t *testing.T) {
	for _, byID := range []bool{false, true} {
		t.Run(map[bool]string{false: "by-name", true: "by-id"}[byID], func(t *testing.T) { testWatcherSession(t, byID) })
	}
}

var watchTestID = [16]byte{0xfe, 0x11, 7}

// checkWatchTopics fails unless every topic req names or forgets is "t" by
// name (Fetch v12) or, byID, watchTestID (Fetch v13).
func checkWatchTopics(t *testing.T, what string, req *kmsg.FetchRequest, byID bool) {
	t.Helper()
	wantV, wantName, wantID := int16(fetchVersion), "t", [16]byte{}
	if byID {
		wantV, wantName, wantID = watchIDVersion, "", watchTestID
	}
	if req.Version != wantV {
		t.Fatalf("%s: Fetch v%d, want v%d", what, req.Version, wantV)
	}
	for _, rt := range req.Topics {
		if rt.Topic != wantName || rt.TopicID != wantID {
			t.Fatalf("%s: a topic named %q, ID %x; want %q, %x", what, rt.Topic, rt.TopicID, wantName, wantID)
		}
	}
	for _, ft := range req.ForgottenTopics {
		if ft.Topic != wantName || ft.TopicID != wantID {
			t.Fatalf("%s: a topic forgotten as %q, ID %x; want %q, %x", what, ft.Topic, ft.TopicID, wantName, wantID)
		}
	}
}

func testWatcherSession(t *testing.T, byID bool) {
	m := &Mirror{metrics: newMetrics(nil), life: context.Background()}
	wt := &watcher{m: m, parked: map[topicPartition]*parking{}, gone: map[topicPartition]struct{}{},
		fresh: map[topicPartition]struct{}{}, kick: make(chan struct{}, 1), idOK: byID}
	woken := map[int32]int{}
	// As park does, without the writer's context.
	park := func(p int32, offset int64) *parking {
		pk := &parking{parkedFetch: parkedFetch{offset: offset, epoch: 3, topicID: watchTestID},
			wake: func() { woken[p]++ }, stop: func() bool { return true }}
		tp := topicPartition{"t", p}
		wt.parked[tp] = pk
		wt.fresh[tp] = struct{}{}
		return pk
	}
	// As park does when its writer stops.
	unpark := func(p int32) {
		tp := topicPartition{"t", p}
		wt.wakeLocked(tp, wt.parked[tp])
	}
	sess := fetchSession{sent: map[topicPartition]sentFetch{}}
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
		checkWatchTopics(t, what, req, byID)
		// The broker's answer: a session, the next epoch.
		sess.id = 7
		sess.epoch++
	}
	if wt.request(&sess) != nil {
		t.Fatal("a request with nothing parked")
	}
	p0 := park(0, 10)
	var seen0 []int64
	p0.seen = func(hw int64) { seen0 = append(seen0, hw) }
	park(1, 20)
	park(2, 30)
	check("first, full", []int32{0, 1, 2}, nil)
	check("nothing changed", nil, nil)

	// Partition 1 changes: woken, its writer goes on.
	rt := kmsg.FetchResponseTopic{Topic: "t"}
	if byID {
		rt = kmsg.FetchResponseTopic{TopicID: watchTestID} // v13 answers by ID alone
	}
	resp := &kmsg.FetchResponse{Topics: []kmsg.FetchResponseTopic{{Topic: rt.Topic, TopicID: rt.TopicID, Partitions: []kmsg.FetchResponseTopicPartition{
		{Partition: 0, HighWatermark: 12, LastStableOffset: 10, LogStartOffset: 0, DivergingEpoch: kmsg.FetchResponseTopicPartitionDivergingEpoch{EndOffset: -1}},
		{Partition: 1, HighWatermark: 21, LastStableOffset: 21, LogStartOffset: 0, DivergingEpoch: kmsg.FetchResponseTopicPartitionDivergingEpoch{EndOffset: -1}},
	}}}}
	wt.deliver(resp, &sess)
	if woken[1] != 1 {
		t.Fatalf("partition 1's last stable offset passed its writer's position: woken %d times, want once", woken[1])
	}
	if _, ok := wt.parked[topicPartition{"t", 1}]; ok {
		t.Fatal("partition 1 woken and still parked")
	}
	if _, ok := wt.parked[topicPartition{"t", 0}]; !ok || woken[0] != 0 {
		t.Fatal("partition 0, unchanged, woken")
	}
	if !slices.Equal(seen0, []int64{12}) {
		t.Fatalf("partition 0's high watermark reported %v, want [12] (an open transaction's records)", seen0)
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
	unpark(0)
	check("unparked", nil, []int32{0})

	// A new session (the broker lost it): a full request names every
	// parked partition.
	sess.reset()
	check("new session", []int32{1, 2}, nil)
	unpark(1)
	unpark(2)
	if wt.request(&sess) != nil {
		t.Fatal("a request with nothing parked")
	}
}

// TestWatcherSessionByName: a session names topics by name when the
// broker lacks Fetch v13, when a parked partition's topic ID is not known
// (at the session's start, or parked later: the session then starts again,
// the broker told to drop the old one), and after two requests by ID
// failed in a row.
func TestWatcherSessionByName(t *testing.T) {
	m := &Mirror{metrics: newMetrics(nil), life: context.Background()}
	wt := &watcher{m: m, parked: map[topicPartition]*parking{}, gone: map[topicPartition]struct{}{},
		fresh: map[topicPartition]struct{}{}, kick: make(chan struct{}, 1)}
	park := func(p int32, id [16]byte) {
		tp := topicPartition{"t", p}
		wt.parked[tp] = &parking{parkedFetch: parkedFetch{offset: 5, topicID: id}, wake: func() {}, stop: func() bool { return true }}
		wt.fresh[tp] = struct{}{}
	}
	sess := fetchSession{sent: map[topicPartition]sentFetch{}}
	next := func(what string, byID bool, epoch int32, names []int32) {
		t.Helper()
		req := wt.request(&sess)
		if req.SessionEpoch != epoch {
			t.Fatalf("%s: session epoch %d, want %d", what, req.SessionEpoch, epoch)
		}
		if got, _ := named(req); !slices.Equal(got, names) {
			t.Fatalf("%s: names %v, want %v", what, got, names)
		}
		checkWatchTopics(t, what, req, byID)
		sess.id, sess.epoch = 9, req.SessionEpoch+1
	}
	park(0, watchTestID)
	next("a broker without Fetch v13", false, 0, []int32{0})

	wt.idOK = true
	sess.reset()
	park(1, [16]byte{})
	next("a partition's topic ID unknown", false, 0, []int32{0, 1})

	delete(wt.parked, topicPartition{"t", 1})
	sess.reset()
	next("every topic ID known", true, 0, []int32{0})
	next("nothing changed", true, 1, nil)
	park(1, [16]byte{})
	req := wt.request(&sess)
	if req.SessionEpoch != 0 || req.SessionID != 9 {
		t.Fatalf("parked with no topic ID in a session by ID: session %d epoch %d, want the same session (9) at epoch 0 (dropped, a new one started)", req.SessionID, req.SessionEpoch)
	}
	checkWatchTopics(t, "a new session by name", req, false)

	delete(wt.parked, topicPartition{"t", 1})
	for i, want := range []bool{true, true, false} {
		sess.reset()
		next("after failed requests by ID", want, 0, []int32{0})
		if i < 2 {
			wt.failed(true)
		}
	}
	n := wt.idFailures
	wt.failed(false)
	if wt.idFailures != n {
		t.Fatal("a request by name that failed counted against topic IDs")
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
	// Parked at a session's start, before the writer knew the log start:
	// the watcher's first answer tells it, and wakes nothing.
	if unknown := (parkedFetch{offset: 100, epoch: 2, logStart: -1}); changed(unknown, &quiet) {
		t.Fatal("a log start the writer did not know yet woke it")
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
