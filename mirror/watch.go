package mirror

import (
	"context"
	"errors"
	"iter"
	"maps"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Idle partitions.
//
// A writer whose fetches have come back empty until their wait reached
// idleFetchMaxWait parks: it closes both its connections and hands its
// partition to the watcher of its source leader, one per source broker,
// which long-polls every parked partition of that broker in one Fetch in a
// fetch session (KIP-227). The broker keeps the session's partitions and
// offsets, so a request names only the partitions parked or woken since
// the last one, and an answer only those whose log changed: with nothing
// new, a request every FetchMaxWait costs a few dozen bytes whatever the
// number of parked partitions. Before, every idle partition held two
// sockets and sent its own fetch every 10 s: 10,000 idle partitions took
// 20,000 file descriptors here and at the brokers, and a fifth of a core.
//
// The watcher wakes a writer when its partition has anything for it: a
// last stable offset above the writer's position (a record to copy, a
// transaction ended), a high watermark below it (truncation), a raised log
// start (trimLogStart), a diverging epoch, or an error (the leader moved,
// the topic went). The condition is on the partition's state, not on
// events, so nothing that happened before the watcher first asked is
// missed. The writer then dials again and fetches on its own connection as
// before. What a parked partition pays is that dial, and, when a record
// lands while the watcher's request in flight does not yet name the
// partition (it was parked after the request was sent), up to FetchMaxWait
// before the next request does.
//
// Any failure of the watcher's own requests wakes every partition it
// watches: each writer then finds out for itself, as it did before.

// Topic IDs. A broker keeps a session's partitions in an open-addressing
// hash table with linear probing (ImplicitLinkedHashCollection), hashed by
// 31 × partition + the topic's hash: the topic name's String.hashCode in a
// session that names topics, its ID's hash in one that uses topic IDs
// (Fetch v13, KIP-516). Names that differ only in a numbered suffix
// (scale-00001, scale-00002, ...) hash to neighbouring values, so 10,000
// partitions of 1,000 such topics sit in one cluster of the table, and
// every partition forgotten reseats the rest of it. In a CPU profile of
// the source broker (JFR) as 1,000 halted writers left a session of
// 10,000, three quarters of its samples were in that reseating, for
// seconds; a model of the table puts it at 788 million probes for those
// 1,000 partitions, and 4 million for each pass over the session that an
// incremental answer makes, against two thousand and five thousand with
// random hashes. So the watcher names topics by ID when the source offers
// Fetch v13 and it knows every parked partition's topic ID; else by name,
// as before (a broker before Kafka 3.1, or after two requests by ID failed
// in a row: a broker of a cluster mid-upgrade may not take them).

// watchIDVersion is the Fetch version of a watcher session by topic IDs.
const watchIDVersion = 13

// fetchSession is what a broker keeps of a KIP-227 fetch session, as the
// watcher last told it.
type fetchSession struct {
	id    int32
	epoch int32                        // of the next request: 0 starts a session
	sent  map[topicPartition]sentFetch // partitions in the session, as last sent
	// byID: the session names topics by ID (decided by its first
	// request); names are the topics' names by ID, for its answers.
	byID  bool
	names map[[16]byte]string
}

// sentFetch is what a request told the session of a partition.
type sentFetch struct {
	offset  int64
	epoch   int32
	topicID [16]byte // in a session by topic ID
}

// reset forgets the session; the next request starts one (and decides
// byID and names anew).
func (s *fetchSession) reset() {
	s.id, s.epoch = 0, 0
	clear(s.sent)
}

// parkedFetch is where a parked partition's writer is: the fetch the
// watcher makes for it, and what it has seen.
type parkedFetch struct {
	offset   int64    // the writer's next offset
	epoch    int32    // leader epoch of the last batch it wrote
	logStart int64    // the source's log start it last saw (-1: none yet, the watcher's first answer tells)
	topicID  [16]byte // the source topic's ID (zero: not known)
}

type parking struct {
	parkedFetch
	seen func(hw int64) // the source's high watermark, when it moves with nothing to copy
	wake func()         // starts the writer again; called once, without wt.mu
	stop func() bool    // of the writer's context's AfterFunc
}

// watcher watches the parked partitions whose leader is one source broker.
type watcher struct {
	m    *Mirror
	addr string
	log  *zap.Logger

	mu     sync.Mutex
	parked map[topicPartition]*parking
	// gone are partitions woken or unparked since the last request: the
	// next one forgets them before naming them again, so that the broker
	// compares a partition parked again with its log afresh (a session
	// answers only for a partition that changed since its last answer).
	gone map[topicPartition]struct{}
	// fresh are partitions parked since the last request: a request looks
	// at what changed, not at every parked partition.
	fresh map[topicPartition]struct{}
	kick  chan struct{} // something was parked
	// idOK: the source broker may be asked by topic ID (read by run);
	// idFailures counts the requests by ID that failed since one was
	// answered.
	idOK       bool
	idFailures int
}

// watcherFor returns the watcher of the source broker at addr, starting
// it if it has none.
func (m *Mirror) watcherFor(addr string) *watcher {
	m.mu.Lock()
	wt, ok := m.watchers[addr]
	if !ok {
		wt = &watcher{
			m:      m,
			addr:   addr,
			log:    m.log.With(zap.String("broker", addr)),
			parked: make(map[topicPartition]*parking),
			gone:   make(map[topicPartition]struct{}),
			fresh:  make(map[topicPartition]struct{}),
			kick:   make(chan struct{}, 1),
		}
		if m.watchers == nil {
			m.watchers = make(map[string]*watcher)
		}
		m.watchers[addr] = wt
	}
	ctx := m.life
	m.mu.Unlock()
	if !ok {
		// Closed, it does not run, and a writer parked on it waits for
		// its own end (Close ends every writer).
		m.goRun(func() { wt.run(ctx) })
	}
	return wt
}

// park hands a partition to the watcher, which calls wake once: when the
// partition has something for its writer, when the watcher fails (the
// writer then fetches for itself), or when ctx ends.
func (wt *watcher) park(ctx context.Context, tp topicPartition, at parkedFetch, seen func(hw int64), wake func()) {
	p := &parking{parkedFetch: at, seen: seen, wake: wake}
	wt.mu.Lock()
	old := wt.parked[tp] // a writer replaced while parked (one runs per partition)
	if old != nil {
		wt.wakeLocked(tp, old)
	}
	wt.parked[tp] = p
	wt.fresh[tp] = struct{}{}
	wt.m.metrics.parked.Inc()
	p.stop = context.AfterFunc(ctx, func() { wt.unpark(tp, func(q *parking) bool { return q == p }) })
	wt.mu.Unlock()
	if old != nil {
		old.wake()
	}
	select {
	case wt.kick <- struct{}{}:
	default:
	}
}

// unpark wakes the writer parked for tp if wake says so of its parking
// (its own, when its context ends; one parked below an end listed, from
// listEnds), and reports whether it did.
func (wt *watcher) unpark(tp topicPartition, wake func(*parking) bool) bool {
	wt.mu.Lock()
	p := wt.parked[tp]
	woken := p != nil && wake(p)
	if woken {
		wt.wakeLocked(tp, p)
	}
	wt.mu.Unlock()
	if woken {
		p.wake()
	}
	return woken
}

// nudge wakes the writer parked for tp below end, the source's end as
// listEnds listed it: should the watcher have missed a change, or an open
// transaction holds the end above the last stable offset.
func (wt *watcher) nudge(tp topicPartition, end int64) {
	if wt.unpark(tp, func(p *parking) bool { return end > p.offset }) {
		wt.log.Debug("a parked partition's end was listed past its writer's position (an open transaction, or a change its watcher missed): woken",
			zap.String("topic", tp.topic), zap.Int32("partition", tp.partition))
	}
}

// wakeLocked takes a parked partition off the watcher; its writer is to be
// woken once wt.mu is let go.
func (wt *watcher) wakeLocked(tp topicPartition, p *parking) {
	p.stop()
	delete(wt.parked, tp)
	wt.gone[tp] = struct{}{}
	wt.m.metrics.parked.Dec()
}

// wakeAll wakes every parked partition.
func (wt *watcher) wakeAll() {
	wt.mu.Lock()
	woken := make([]*parking, 0, len(wt.parked))
	for tp, p := range wt.parked {
		wt.wakeLocked(tp, p)
		woken = append(woken, p)
	}
	wt.mu.Unlock()
	for _, p := range woken {
		p.wake()
	}
}

// run sends the watcher's fetches until ctx ends; with nothing parked, it
// holds no connection.
func (wt *watcher) run(ctx context.Context) {
	l := newLink(wt.addr, wt.m.cfg.srcSec, wt.m.metrics.conns)
	defer l.Close()
	sess := fetchSession{sent: make(map[topicPartition]sentFetch)}
	idKnown := false
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		if !idKnown && wt.m.src != nil {
			// Read once the cluster answers (apiSupport keeps it).
			v, ok, err := wt.m.srcAPIs.maxVersion(ctx, wt.m.src, int16(kmsg.Fetch))
			idKnown = err == nil
			wt.idOK = idKnown && ok && v >= watchIDVersion
		}
		req := wt.request(&sess)
		if req == nil {
			// Nothing parked: no connection, no session, until something is.
			l.Close()
			sess.reset()
			select {
			case <-wt.kick:
			case <-ctx.Done():
			}
			continue
		}
		l.renew()
		if l.c == nil {
			// A new connection starts a new session.
			if _, err := l.conn(ctx); err != nil {
				wt.fail(ctx, &sess, err, &backoff)
				continue
			}
			sess.reset()
			if req = wt.request(&sess); req == nil {
				continue
			}
		}
		byID := sess.byID
		if wt.m.cfg.onWatch != nil {
			wt.m.cfg.onWatch(req)
		}
		resp, err := l.Do(ctx, req)
		if err != nil {
			l.Close()
			wt.failed(byID)
			wt.fail(ctx, &sess, err, &backoff)
			continue
		}
		r := resp.(*kmsg.FetchResponse)
		switch err := kerr.ErrorForCode(r.ErrorCode); {
		case errors.Is(err, kerr.FetchSessionIDNotFound), errors.Is(err, kerr.InvalidFetchSessionEpoch):
			// The broker let the session go (its cache is full, it
			// restarted): start a new one, naming every partition.
			sess.reset()
			continue
		case err != nil:
			wt.failed(byID)
			wt.fail(ctx, &sess, err, &backoff)
			continue
		}
		if byID {
			wt.idFailures = 0
		}
		backoff = 100 * time.Millisecond
		// Before the session's bookkeeping, which may reset it (and its
		// topic names by ID).
		wt.deliver(r, &sess)
		if r.SessionID == 0 {
			// No session (the broker has no room for one): every request
			// is a full one.
			sess.reset()
		} else {
			sess.id = r.SessionID
			if sess.epoch++; sess.epoch < 0 {
				sess.epoch = 1
			}
		}
	}
}

// failed counts a failed request of a session by topic ID: after two in a
// row the watcher names topics (see Topic IDs).
func (wt *watcher) failed(byID bool) {
	if byID {
		wt.idFailures++
	}
}

// request builds the next fetch: the partitions parked since the session
// last named them, and those it names that are parked no more (forgotten);
// nil with nothing parked.
func (wt *watcher) request(sess *fetchSession) *kmsg.FetchRequest {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	if len(wt.parked) == 0 {
		return nil
	}
	if sess.epoch != 0 && sess.byID && wt.lackTopicID(maps.Keys(wt.fresh)) {
		// Parked with no topic ID known (a topic the sync loop no longer
		// lists): the session starts again, by name. The broker drops the
		// old one (same ID, epoch 0).
		sess.epoch = 0
	}
	if sess.epoch == 0 {
		// A new session: by topic ID if every parked partition's is known.
		sess.byID = wt.idOK && wt.idFailures < 2 && !wt.lackTopicID(maps.Keys(wt.parked))
		if sess.names == nil {
			sess.names = make(map[[16]byte]string)
		}
		clear(sess.names)
	}
	req := kmsg.NewPtrFetchRequest()
	req.Version = fetchVersion
	if sess.byID {
		req.Version = watchIDVersion
	}
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(wt.m.cfg.fetchMaxWait / time.Millisecond)
	req.MinBytes = 1
	// The watcher wants to know that a partition changed, not its records
	// (its writer fetches them): a byte each. The broker still returns the
	// first batch it finds (KIP-74), once per wake.
	req.MaxBytes = 1
	req.IsolationLevel = 1
	req.SessionID = sess.id
	req.SessionEpoch = sess.epoch
	fresh := wt.fresh
	if sess.epoch == 0 {
		// A full request: the new session holds what it names.
		clear(sess.sent)
		clear(wt.gone)
		fresh = make(map[topicPartition]struct{}, len(wt.parked))
		for tp := range wt.parked {
			fresh[tp] = struct{}{}
		}
	}
	topics := make(map[string]int) // index in req.Topics
	add := func(tp topicPartition, id [16]byte) *kmsg.FetchRequestTopic {
		return &req.Topics[indexOf(topics, &req.Topics, tp.topic, func(t string) kmsg.FetchRequestTopic {
			rt := kmsg.NewFetchRequestTopic()
			if sess.byID {
				rt.TopicID = id
				sess.names[id] = t
			} else {
				rt.Topic = t
			}
			return rt
		})]
	}
	forgotten := make(map[string]int) // index in req.ForgottenTopics
	forget := func(tp topicPartition) {
		id := sess.sent[tp].topicID
		delete(sess.sent, tp)
		ft := &req.ForgottenTopics[indexOf(forgotten, &req.ForgottenTopics, tp.topic, func(t string) kmsg.FetchRequestForgottenTopic {
			ft := kmsg.NewFetchRequestForgottenTopic()
			if sess.byID {
				ft.TopicID = id
			} else {
				ft.Topic = t
			}
			return ft
		})]
		ft.Partitions = append(ft.Partitions, tp.partition)
	}
	// Every partition that leaves parked passes through gone (wakeLocked).
	// The broker adds what a request names before it forgets: a partition
	// forgotten here is named again in the next request, not this one.
	var again []topicPartition
	for tp := range wt.gone {
		if _, ok := sess.sent[tp]; ok {
			forget(tp)
			if _, ok := wt.parked[tp]; ok {
				again = append(again, tp)
			}
		}
		delete(fresh, tp)
	}
	clear(wt.gone)
	for tp := range fresh {
		p, ok := wt.parked[tp]
		if !ok {
			continue
		}
		sent := sentFetch{p.offset, p.epoch, p.topicID}
		if was, ok := sess.sent[tp]; ok && was == sent {
			continue
		}
		sess.sent[tp] = sent
		t := add(tp, p.topicID)
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition = tp.partition
		fp.CurrentLeaderEpoch = -1
		fp.LastFetchedEpoch = p.epoch
		fp.FetchOffset = p.offset
		fp.LogStartOffset = -1
		fp.PartitionMaxBytes = 1
		t.Partitions = append(t.Partitions, fp)
	}
	clear(wt.fresh)
	for _, tp := range again {
		wt.fresh[tp] = struct{}{} // named in the next request
	}
	return req
}

// lackTopicID reports whether any of the parked partitions tps has no
// known topic ID.
func (wt *watcher) lackTopicID(tps iter.Seq[topicPartition]) bool {
	for tp := range tps {
		if p, ok := wt.parked[tp]; ok && p.topicID == ([16]byte{}) {
			return true
		}
	}
	return false
}

// deliver wakes the writers of the partitions r, an answer in sess, says
// changed.
func (wt *watcher) deliver(r *kmsg.FetchResponse, sess *fetchSession) {
	var woken []*parking
	defer func() {
		for _, p := range woken {
			p.wake()
		}
	}()
	wt.mu.Lock()
	defer wt.mu.Unlock()
	for i := range r.Topics {
		rt := &r.Topics[i]
		name := rt.Topic
		if sess.byID {
			name = sess.names[rt.TopicID]
		}
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			tp := topicPartition{name, rp.Partition}
			p, ok := wt.parked[tp]
			switch {
			case !ok:
			case changed(p.parkedFetch, rp) && !wt.m.cfg.deafWatcher:
				wt.wakeLocked(tp, p)
				woken = append(woken, p)
			default:
				if p.logStart < 0 && rp.ErrorCode == 0 {
					p.logStart = rp.LogStartOffset // parked before the writer knew it
				}
				if p.seen != nil {
					// An open transaction's records: the lag shows them.
					p.seen(rp.HighWatermark)
				}
			}
		}
	}
}

// indexOf returns the index of topic's entry in *list, appending one made
// by mk when it has none; index maps topics to their entries.
func indexOf[T any](index map[string]int, list *[]T, topic string, mk func(string) T) int {
	i, ok := index[topic]
	if !ok {
		i = len(*list)
		index[topic] = i
		*list = append(*list, mk(topic))
	}
	return i
}

// changed reports whether the watcher's answer for a parked partition has
// anything for its writer.
func changed(at parkedFetch, rp *kmsg.FetchResponseTopicPartition) bool {
	return rp.ErrorCode != 0 ||
		len(rp.RecordBatches) > 0 ||
		rp.LastStableOffset > at.offset ||
		rp.HighWatermark < at.offset ||
		at.logStart >= 0 && rp.LogStartOffset > at.logStart ||
		rp.DivergingEpoch.EndOffset >= 0
}

// fail wakes every parked partition with err (their writers find out for
// themselves) and waits the backoff before the next attempt.
func (wt *watcher) fail(ctx context.Context, sess *fetchSession, err error, backoff *time.Duration) {
	if ctx.Err() != nil {
		return
	}
	wt.log.Warn("mirror idle-partition watcher failed, waking its partitions", zap.Error(err))
	sess.reset()
	wt.wakeAll()
	_ = sleep(ctx, *backoff)
	*backoff = min(2**backoff, 5*time.Second)
}
