package proxy

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// metadataAnswers keeps the member's last answer to a Metadata request for
// every topic. Translating the cluster's answer (every partition's leader,
// replicas and epoch), installing it as the snapshot and encoding it again
// were most of the member's time per request at 10,000 partitions, while
// the cluster's answer is the same from one request to the next until a
// leader moves or a topic comes or goes. A request whose upstream answer
// equals the kept one field by field, under the same generation and the
// same members, is answered with the kept translation: what translating
// it again would give, since nothing else goes into it (lanes, once given,
// never change: upstream.Cluster.Lane).
type metadataAnswers struct {
	last atomic.Pointer[metadataAnswer]

	// One upstream request for every topic at a time for each kind
	// (flightKey), and the next one, which every request arriving
	// meanwhile joins: a thousand clients asking at once (a fleet's
	// clients reconnecting, a pattern subscription's consumers, a
	// dashboard polling) cost the cluster two answers of every
	// partition, not a thousand. A request never takes an answer asked
	// before it arrived: what it asks after a change it made (a topic
	// created) must show it.
	mu      sync.Mutex
	flying  map[flightKey]*metadataFlight // sent, not answered
	waiting map[flightKey]*metadataFlight // to be sent when the one flying is answered
}

// flightKey is what an upstream request for every topic depends on besides
// the cluster: the authorized operations asked for.
type flightKey struct {
	up  *upstream.Cluster
	ops bool
}

// metadataFlight is one upstream request for every topic and its answer,
// shared by the client requests that joined it.
type metadataFlight struct {
	done   chan struct{} // closed once answered
	joined int           // client requests waiting for it; under metadataAnswers.mu
	// kept is the answer kept when the request was sent, whose cluster
	// answer's body it was sent with (upstream.Cluster.AskMetadataSince);
	// resp is nil, without err, when the cluster's answer had its bytes.
	kept *metadataAnswer
	resp *kmsg.MetadataResponse
	body upstream.MetadataBody
	err  error
	// translating is held by each client request of the flight while it
	// finds or makes the translation of resp: a thousand requests woken
	// at once by a changed answer translate it once.
	translating sync.Mutex
}

// ask returns the answer of the next upstream request for every topic of
// k's cluster: the one to be sent when the one in flight is answered, or
// a new one when none is in flight. A request that starts a flight sends
// it itself (no goroutine of its own: a request alone pays nothing for
// the sharing), once the one before is answered; those that join wait
// for it until ctx ends. The request sent is bounded by base (the
// server's context: it is not one client's) and LookupTimeout.
func (m *metadataAnswers) ask(ctx, base context.Context, k flightKey) (*metadataFlight, error) {
	m.mu.Lock()
	if f := m.waiting[k]; f != nil {
		f.joined++
		m.mu.Unlock()
		select {
		case <-f.done:
			return f, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f := &metadataFlight{done: make(chan struct{}), joined: 1}
	if m.flying == nil {
		m.flying, m.waiting = map[flightKey]*metadataFlight{}, map[flightKey]*metadataFlight{}
	}
	if prev := m.flying[k]; prev != nil {
		m.waiting[k] = f
		m.mu.Unlock()
		// Not ctx: the others joining f wait for this request to send
		// it. prev's end made f the one flying.
		<-prev.done
	} else {
		m.flying[k] = f
		m.mu.Unlock()
	}

	req := kmsg.NewPtrMetadataRequest() // Topics nil: every topic
	req.IncludeTopicAuthorizedOperations = k.ops
	var since upstream.MetadataBody
	since, f.kept = m.since(k.up)
	sctx, cancel := context.WithTimeout(base, upstream.LookupTimeout)
	f.resp, f.body, f.err = k.up.AskMetadataSince(sctx, req, since)
	cancel()
	m.mu.Lock()
	delete(m.flying, k)
	if next := m.waiting[k]; next != nil {
		delete(m.waiting, k)
		m.flying[k] = next // its first request sends it now
	}
	m.mu.Unlock()
	close(f.done)
	return f, nil
}

// metaHow is how a Metadata request for every topic was answered
// (metrics.metaAll).
type metaHow int

const (
	metaSameBytes    metaHow = iota // the kept translation: the cluster's answer had the same bytes
	metaSameFields                  // the kept translation: the same fields, perhaps in another order
	metaTranslated                  // translated anew
	metaFromSnapshot                // from the snapshot: the cluster did not answer
)

var metaHowNames = [...]string{"same_bytes", "same_fields", "translated", "snapshot"}

// metadataAnswer is one kept answer: what it was translated from and under,
// and the translation, encoded at each version asked for.
type metadataAnswer struct {
	up      *upstream.Cluster
	gen     uint32
	brokers []routing.Broker
	from    *kmsg.MetadataResponse // the cluster's answer
	// fromBody is the cluster's last answer equal to from, as it was
	// encoded: an answer with the same bytes is not decoded
	// (upstream.Cluster.AskMetadataSince).
	fromBody atomic.Pointer[upstream.MetadataBody]
	index    *topicIndex // where from says what of each topic
	// snap is the snapshot installing from last gave: while it is the
	// cluster's, installing an equal answer again changes nothing.
	snap atomic.Pointer[upstream.Snapshot]

	codes connstats.Codes // resp's error codes, counted for each answer

	mu     sync.Mutex
	resp   *kmsg.MetadataResponse // the translation; its version is set under mu
	bodies map[int16][]byte       // resp encoded (no header), by version
}

// find returns the kept answer translated from an answer equal to from
// under gen and brokers, or nil.
func (m *metadataAnswers) find(up *upstream.Cluster, gen uint32, brokers []routing.Broker, from *kmsg.MetadataResponse) *metadataAnswer {
	a := m.last.Load()
	if a == nil || a.up != up || !a.under(gen, brokers) || (a.from != from && !sameMetadata(a.from, a.index, from)) {
		return nil
	}
	return a
}

// setBody makes body, if known, the one the next answer's bytes are
// compared with: the last answer equal to from (a broker other than the
// one before may list the same topics in another order).
func (a *metadataAnswer) setBody(body upstream.MetadataBody) {
	if len(body.Bytes) > 0 {
		a.fromBody.Store(&body)
	}
}

// since is the body of the kept answer's cluster answer, if up's, to ask
// up with (upstream.Cluster.AskMetadataSince), and the kept answer; an
// empty body and nil when there is none.
func (m *metadataAnswers) since(up *upstream.Cluster) (upstream.MetadataBody, *metadataAnswer) {
	a := m.last.Load()
	if a == nil || a.up != up {
		return upstream.MetadataBody{}, nil
	}
	if b := a.fromBody.Load(); b != nil {
		return *b, a
	}
	return upstream.MetadataBody{}, a
}

// under reports whether a was translated under gen and brokers.
func (a *metadataAnswer) under(gen uint32, brokers []routing.Broker) bool {
	return a.gen == gen && sameBrokers(a.brokers, brokers)
}

// keep makes resp, translated from from, the kept answer; body is from's,
// as the cluster encoded it, if known; snap is what installing from gave.
func (m *metadataAnswers) keep(up *upstream.Cluster, gen uint32, brokers []routing.Broker, from *kmsg.MetadataResponse, body upstream.MetadataBody, resp *kmsg.MetadataResponse, snap *upstream.Snapshot) *metadataAnswer {
	a := &metadataAnswer{up: up, gen: gen, brokers: brokers, from: from, index: indexTopics(from), codes: connstats.ResponseCodes(resp), resp: resp, bodies: map[int16][]byte{}}
	a.setBody(body)
	a.snap.Store(snap)
	m.last.Store(a)
	return a
}

// installed makes sure the cluster's snapshot is from's: another refresh
// (or a request for some topics) may have installed since.
func (a *metadataAnswer) installed() {
	if a.up.Snapshot() != a.snap.Load() {
		a.snap.Store(a.up.Install(a.from, true))
	}
}

// reply answers req with the kept translation.
func (a *metadataAnswer) reply(req *request) *reply {
	return &reply{req: req, finish: func(context.Context) ([]byte, func(), error) {
		if req.stats != nil {
			req.stats.CountCodes(a.codes) // as an answer Ferry encodes is
		}
		body := a.body(req.hdr.Version)
		buf := upstream.EncodedBufs.Get()
		buf.B = protocol.AppendResponseHeader(buf.B[:0], req.hdr.Key, req.hdr.Version, req.hdr.CorrelationID)
		buf.B = append(buf.B, body...)
		return buf.B, func() { upstream.EncodedBufs.Put(buf) }, nil
	}}
}

// body is the translation encoded at version v.
func (a *metadataAnswer) body(v int16) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	body, ok := a.bodies[v]
	if !ok {
		a.resp.SetVersion(v)
		body = a.resp.AppendTo(nil)
		a.bodies[v] = body
	}
	return body
}

func sameBrokers(a, b []routing.Broker) bool {
	return slices.EqualFunc(a, b, func(x, y routing.Broker) bool {
		return x.NodeID == y.NodeID && x.Host == y.Host && x.Port == y.Port && sameString(x.Rack, y.Rack)
	})
}

func sameString(a, b *string) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}

// topicIndex finds an answer's topics by name and their partitions by
// number: a broker may list both in any order (kfake does; Kafka lists
// them from hash sets).
type topicIndex struct {
	byName map[string]int // topic's index
	first  []int          // by topic index: where its partitions start in at
	at     []int32        // at first[topic]+partition number: the partition's index in its topic
}

// indexTopics indexes an answer, or returns nil if a topic has no name (one
// asked for by an unknown ID), two share a name or a partition number, or
// a number is out of range.
func indexTopics(m *kmsg.MetadataResponse) *topicIndex {
	idx := &topicIndex{byName: make(map[string]int, len(m.Topics)), first: make([]int, len(m.Topics))}
	for i, t := range m.Topics {
		if t.Topic == nil {
			return nil
		}
		if _, dup := idx.byName[*t.Topic]; dup {
			return nil
		}
		idx.byName[*t.Topic] = i
		idx.first[i] = len(idx.at)
		at := slices.Repeat([]int32{-1}, len(t.Partitions))
		for k, p := range t.Partitions {
			if p.Partition < 0 || int(p.Partition) >= len(at) || at[p.Partition] >= 0 {
				return nil // numbered 0…n-1 in any answer a topic is known in
			}
			at[p.Partition] = int32(k)
		}
		idx.at = append(idx.at, at...)
	}
	return idx
}

// sameMetadata reports whether answer b says what a (indexed by idx)
// says, in every field the member reads from them (all but the throttle
// time and the controller ID, which goes into neither the translation nor
// the snapshot: upstream.Cluster.Controller), its topics and partitions
// perhaps in another order.
func sameMetadata(a *kmsg.MetadataResponse, idx *topicIndex, b *kmsg.MetadataResponse) bool {
	if idx == nil || a.ErrorCode != b.ErrorCode || a.AuthorizedOperations != b.AuthorizedOperations ||
		!sameString(a.ClusterID, b.ClusterID) || len(a.Brokers) != len(b.Brokers) || len(a.Topics) != len(b.Topics) {
		return false
	}
	for i := range a.Brokers {
		x, y := &a.Brokers[i], &b.Brokers[i]
		if x.NodeID != y.NodeID || x.Host != y.Host || x.Port != y.Port || !sameString(x.Rack, y.Rack) {
			return false
		}
	}
	// As many topics and partitions, each of b's found in a once: the
	// same sets.
	topicSeen, partSeen := make([]bool, len(a.Topics)), make([]bool, len(idx.at))
	for i := range b.Topics {
		y := &b.Topics[i]
		if y.Topic == nil {
			return false
		}
		j, ok := idx.byName[*y.Topic]
		if !ok || topicSeen[j] {
			return false
		}
		topicSeen[j] = true
		x := &a.Topics[j]
		if x.ErrorCode != y.ErrorCode || x.TopicID != y.TopicID || x.IsInternal != y.IsInternal ||
			x.AuthorizedOperations != y.AuthorizedOperations || len(x.Partitions) != len(y.Partitions) {
			return false
		}
		for k := range y.Partitions {
			q := &y.Partitions[k]
			if q.Partition < 0 || int(q.Partition) >= len(x.Partitions) {
				return false
			}
			slot := idx.first[j] + int(q.Partition)
			if partSeen[slot] {
				return false
			}
			partSeen[slot] = true
			p := &x.Partitions[idx.at[slot]]
			if p.ErrorCode != q.ErrorCode || p.Leader != q.Leader || p.LeaderEpoch != q.LeaderEpoch ||
				!slices.Equal(p.Replicas, q.Replicas) || !slices.Equal(p.ISR, q.ISR) || !slices.Equal(p.OfflineReplicas, q.OfflineReplicas) {
				return false
			}
		}
	}
	return true
}
