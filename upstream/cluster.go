package upstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/routing"
)

// Cluster names one physical Kafka cluster behind Ferry.
type Config struct {
	Name      string
	Bootstrap []string
	// MirrorTarget says the mirror may have written into the cluster
	// (it was, or may have been, a standby): its logs may hold the
	// mirror's filler batches, which every Fetch answer from it is then
	// checked for, batch header by batch header, and which clients never
	// see. A cluster no mirror ever wrote into needs no check.
	MirrorTarget bool
	// Security is how Ferry connects to the cluster: TLS and SASL, for
	// its franz-go client and its pooled raw connections alike. nil:
	// plaintext, no authentication.
	Security *clusterauth.Security
	// Principals maps client principals ("User:alice") to their own
	// credentials on the cluster: the pooled connections that carry such
	// a client's requests authenticate with them, so the brokers' ACLs
	// see the application rather than Ferry (proxy's principals.go). Every
	// cluster should map the same principals. nil: every client's
	// requests go on Security.
	Principals map[string]*clusterauth.Security
}

// Options are what every upstream of a server shares.
type Options struct {
	// ClusterID is the virtual cluster's, for virtual topic IDs.
	ClusterID string
	Log       *zap.Logger
	// DialTimeout bounds a connection's dial and authentication.
	DialTimeout time.Duration
	// MaxConnsPerBroker bounds a pool's connections; IdleConnsPerBroker
	// are kept open when unused.
	MaxConnsPerBroker, IdleConnsPerBroker int
	// MaxResponseSize is the largest answer frame read.
	MaxResponseSize int32
}

// upstream is one physical cluster: a franz-go client for Ferry's own control
// requests (metadata, coordinator lookups, admin fan-out), a metadata cache
// for routing, and pools of raw connections per broker for client traffic.
type Cluster struct {
	Name      string
	ClusterID string // the virtual cluster's, for virtual topic IDs
	Fillers   bool   // its logs may hold the mirror's fillers (Cluster.MirrorTarget)
	opts      Options
	log       *zap.Logger
	Client    *kgo.Client
	Security  *clusterauth.Security // nil: plaintext
	bootstrap []string
	// idents are the credentials of each identity (proxy's principals.go): [0]
	// is sec, [i] a mapped principal's, nil where the cluster maps none.
	Idents []*clusterauth.Security
	Names  []string // the principal of each identity (Server.idents.names)

	Meta      atomic.Pointer[Snapshot]
	refreshMu sync.Mutex // one refresh at a time; later callers reuse its result
	refreshed time.Time  // guarded by refreshMu
	// metaBroker is the node ID, plus one, of the broker AskMetadata
	// asks (0: none chosen yet).
	metaBroker atomic.Int64
	// controller is the controller ID the last Metadata answer named
	// (-1: none yet); not part of a Snapshot, so that an answer that
	// differs from the one before only there (KRaft brokers name a random
	// live broker each time) is the same snapshot.
	controller atomic.Int32

	coordMu sync.Mutex
	// coords is the coordinator cache: the most recently used
	// maxCoordinators keys, so that keys clients ask for (any group or
	// transactional ID name) cannot grow it without bound, nor the walk
	// of it at a switch (proxy's warm.go); coordsEvicted counts those dropped.
	coords        *simplelru.LRU[CoordKey, int32]
	CoordsEvicted prometheus.Counter
	// lookups in flight, by key: every connection that misses the cache
	// for one key waits for one FindCoordinator (coordinator).
	lookups map[CoordKey]*lookup

	poolMu sync.Mutex
	pools  map[poolKey]*brokerPool
	// authFails are the identities the cluster refuses now.
	authFails upstreamAuthFailures

	Versions protocol.Versions // what the brokers advertise, once started
	Features protocol.Features // the cluster's feature flags, once started
	Started  atomic.Bool       // start succeeded

	// spawn runs a goroutine the server tracks; refreshing is set while
	// a refresh asked for by refreshSoon is under way.
	Spawn      func(func()) bool
	refreshing atomic.Bool

	laneMu sync.Mutex
	Lanes  map[int32]int // physical broker → lane, given on first sight

	opsMu sync.Mutex // the cluster's authorized operations, cached
	ops   *kmsg.DescribeClusterResponse
	opsAt time.Time
}

// poolKey names a pool: a broker, and the identity its connections
// authenticate as (proxy's principals.go; 0: the service identity).
type poolKey struct {
	broker int32
	ident  int32
}

// maxCoordinators bounds a cluster's coordinator cache. A key dropped is
// looked up again when next used.
const MaxCoordinators = 1 << 16

type CoordKey struct {
	Type int8
	Key  string
}

// metaSnapshot is an immutable view of the cluster's metadata; a refresh
// installs a new one.
type Snapshot struct {
	Brokers map[int32]string
	Topics  map[string]*Topic
	ByID    map[[16]byte]*Topic // physical topic ID
	byVID   map[[16]byte]*Topic // virtual topic ID
	leaders map[int32]bool      // brokers that lead a partition
}

type Topic struct {
	Name     string
	ID       [16]byte
	VID      [16]byte
	Err      int16
	Internal bool
	Parts    []partInfo // by partition number
}

type partInfo struct {
	Exists   bool
	Err      int16
	Leader   int32
	Epoch    int32
	Replicas []int32
	ISR      []int32
	Offline  []int32
}

func New(opts Options, cl Config) (*Cluster, error) {
	u := &Cluster{
		Name:      cl.Name,
		ClusterID: opts.ClusterID,
		Fillers:   cl.MirrorTarget,
		opts:      opts,
		log:       opts.Log.With(zap.String("cluster", cl.Name)),
		lookups:   make(map[CoordKey]*lookup),
		pools:     make(map[poolKey]*brokerPool),
		bootstrap: cl.Bootstrap,
		Idents:    []*clusterauth.Security{cl.Security},
		Lanes:     make(map[int32]int),
		Security:  cl.Security,
	}
	// Add drops the least recently used key at the bound (counted by
	// findCoordinators); NewLRU fails only for a size below 1.
	u.coords, _ = simplelru.NewLRU[CoordKey, int32](MaxCoordinators, nil)
	kcl, err := cl.Security.NewClient(cl.Bootstrap,
		kgo.ClientID("ferry-control"),
		kgo.DialTimeout(opts.DialTimeout),
		kgo.RetryTimeout(15*time.Second),
		kgo.MetadataMinAge(250*time.Millisecond),
	)
	if err != nil {
		return nil, fmt.Errorf("cluster %q: %w", cl.Name, err)
	}
	u.Client = kcl
	u.controller.Store(-1)
	u.Meta.Store(&Snapshot{Brokers: map[int32]string{}, Topics: map[string]*Topic{}, ByID: map[[16]byte]*Topic{}, byVID: map[[16]byte]*Topic{}})
	return u, nil
}

// start loads the versions and features the brokers advertise and a first
// metadata snapshot. An unreachable cluster is an error here, retried by the caller.
func (u *Cluster) Start(ctx context.Context) error {
	resp, err := (&kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "ferry", ClientSoftwareVersion: "0"}).RequestWith(ctx, u.Client)
	if err != nil {
		return fmt.Errorf("cluster %q: ApiVersions: %w", u.Name, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("cluster %q: ApiVersions: %w", u.Name, err)
	}
	u.Versions = protocol.VersionsFromResponse(resp)
	u.Features = protocol.FeaturesFromResponse(resp)
	_, err = u.Refresh(ctx, true)
	return err
}

// authFailed reports whether err is the cluster refusing Ferry's
// credentials: from franz-go (its own SASL), or from a raw connection's
// (clusterauth).
func AuthFailed(err error) bool {
	return errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.IllegalSaslState) || clusterauth.AuthFailed(err)
}

func (u *Cluster) Close() {
	u.Client.Close()
	u.poolMu.Lock()
	defer u.poolMu.Unlock()
	for _, p := range u.pools {
		p.close()
	}
}

func (u *Cluster) Snapshot() *Snapshot { return u.Meta.Load() }

// refresh loads the metadata of every topic. Unless force is set, a refresh
// that finished in the last 250ms is reused: a burst of routing misses
// causes one request, not one each.
func (u *Cluster) Refresh(ctx context.Context, force bool) (*Snapshot, error) {
	start := time.Now()
	u.refreshMu.Lock()
	defer u.refreshMu.Unlock()
	if !force && u.refreshed.After(start.Add(-250*time.Millisecond)) {
		return u.Snapshot(), nil
	}
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = nil // all
	resp, err := u.AskMetadata(ctx, req)
	if err != nil {
		return u.Snapshot(), fmt.Errorf("cluster %q: metadata: %w", u.Name, err)
	}
	snap := u.Install(resp, true)
	u.refreshed = time.Now()
	return snap, nil
}

// AskMetadata sends req to one broker, the last that answered, or the
// next ones (BrokersFrom) when it fails, and through the client (any
// broker, with its retries) when they do. Not through the client first:
// kgo keeps every Metadata answer that passes through it in a cache of its
// own, maps of every topic and partition, which took a large share of what
// Ferry added to an answer of 10,000 partitions, and kgo refreshes what it
// needs itself (a broker it does not know yet it looks up when asked to
// reach it).
func (u *Cluster) AskMetadata(ctx context.Context, req *kmsg.MetadataRequest) (*kmsg.MetadataResponse, error) {
	r, err := u.askMetadata(ctx, req, req)
	if err != nil {
		return nil, err
	}
	return r.(*kmsg.MetadataResponse), nil
}

// MetadataBody is a broker's answer to a Metadata request as the broker
// encoded it (after the response header), and its version.
type MetadataBody struct {
	Version int16
	Bytes   []byte
}

// AskMetadataSince is AskMetadata for a caller that kept an earlier
// answer's body: when a broker answers with the same bytes, resp is nil
// and nothing is decoded. A broker encodes the same metadata the same way
// from one request to the next, and decoding every partition of a large
// cluster's answer, to find it unchanged, was most of what a member added
// to the answer's time (and its garbage most of the rest). body is the
// new answer's, to keep for the next call; empty when the answer came
// through the client.
func (u *Cluster) AskMetadataSince(ctx context.Context, req *kmsg.MetadataRequest, since MetadataBody) (resp *kmsg.MetadataResponse, body MetadataBody, err error) {
	r, err := u.askMetadata(ctx, bodyMetadataRequest{req, since}, req)
	if err != nil {
		return nil, MetadataBody{}, err
	}
	if a, ok := r.(*bodyMetadataResponse); ok {
		if a.same {
			return nil, since, nil
		}
		return a.MetadataResponse, a.body, nil
	}
	return r.(*kmsg.MetadataResponse), MetadataBody{}, nil // through the client
}

// askMetadata sends direct to one broker, the last that answered, or the
// next ones (BrokersFrom) when it fails, and plain through the client
// when they do; it keeps the controller ID of the answer.
func (u *Cluster) askMetadata(ctx context.Context, direct kmsg.Request, plain *kmsg.MetadataRequest) (kmsg.Response, error) {
	ids := u.BrokerIDs()
	if kept := int32(u.metaBroker.Load()) - 1; slices.Contains(ids, kept) {
		ids = u.BrokersFrom(kept)
	}
	// The kept broker, then the next ones (at most three in all): kgo
	// could pick the one that just failed again.
	for _, id := range ids[:min(3, len(ids))] {
		r, err := u.Client.Broker(int(id)).Request(ctx, direct)
		if err == nil {
			u.metaBroker.Store(int64(id) + 1)
			u.keepController(r)
			return r, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
	}
	u.metaBroker.Store(0)
	r, err := plain.RequestWith(ctx, u.Client)
	if err != nil {
		return nil, err
	}
	u.keepController(r)
	return r, nil
}

// keepController keeps the controller ID a Metadata answer names.
func (u *Cluster) keepController(r kmsg.Response) {
	switch r := r.(type) {
	case *bodyMetadataResponse:
		u.controller.Store(r.ControllerID)
	case *kmsg.MetadataResponse:
		u.controller.Store(r.ControllerID)
	}
}

// Controller is the controller ID the cluster's last Metadata answer
// named, or -1.
func (u *Cluster) Controller() int32 { return u.controller.Load() }

// bodyMetadataRequest is a Metadata request whose answer keeps its bytes
// and is not decoded when they are since's.
type bodyMetadataRequest struct {
	*kmsg.MetadataRequest
	since MetadataBody
}

func (r bodyMetadataRequest) ResponseKind() kmsg.Response {
	// kmsg's answer, at the request's version.
	return &bodyMetadataResponse{MetadataResponse: r.MetadataRequest.ResponseKind().(*kmsg.MetadataResponse), since: r.since}
}

type bodyMetadataResponse struct {
	*kmsg.MetadataResponse
	since MetadataBody
	body  MetadataBody
	same  bool // the bytes are since's: nothing decoded
}

func (r *bodyMetadataResponse) ReadFrom(b []byte) error {
	v := r.GetVersion()
	if len(b) == len(r.since.Bytes) { // otherwise not since's: no need to look
		if at, ok := metadataControllerAt(b, v); ok && sameMetadataBody(r.since, v, b, at) {
			r.same, r.ControllerID = true, int32(binary.BigEndian.Uint32(b[at:]))
			return nil
		}
	}
	// A copy: b is kgo's, which need not stay as it is once read.
	r.body = MetadataBody{Version: v, Bytes: bytes.Clone(b)}
	return r.MetadataResponse.ReadFrom(b)
}

// sameMetadataBody reports whether b, an answer at version v whose
// controller ID is at at, is since's bytes but for that ID: a KRaft broker
// names a random live broker as the controller in each answer (the
// controller itself is not reachable by clients), so that two answers of
// an unchanged cluster differ there.
func sameMetadataBody(since MetadataBody, v int16, b []byte, at int) bool {
	s := since.Bytes
	return len(s) > 0 && since.Version == v && len(s) == len(b) &&
		bytes.Equal(s[:at], b[:at]) && bytes.Equal(s[at+4:], b[at+4:])
}

// metadataControllerAt returns where a Metadata answer's body at version v
// (v1+) holds its controller ID: after the throttle time, the brokers and
// the cluster ID.
func metadataControllerAt(b []byte, v int16) (int, bool) {
	if v < 1 {
		return 0, false
	}
	flexible := v >= 9
	r := kbin.Reader{Src: b}
	str := func(nullable bool) { // skips a string
		var n int
		if flexible {
			n = int(r.Uvarint()) - 1
		} else {
			n = int(r.Int16())
		}
		if n < 0 && nullable {
			return
		}
		r.Span(n)
	}
	if v >= 3 {
		r.Int32() // throttle
	}
	var brokers int32
	if flexible {
		brokers = r.CompactArrayLen()
	} else {
		brokers = r.ArrayLen()
	}
	for range max(brokers, 0) {
		r.Int32() // node ID
		str(false)
		r.Int32() // port
		str(true) // rack
		if flexible {
			for range r.Uvarint() { // tags
				r.Uvarint()
				r.Span(int(r.Uvarint()))
			}
		}
		if !r.Ok() {
			return 0, false
		}
	}
	if v >= 2 {
		str(true) // cluster ID
	}
	if !r.Ok() || len(r.Src) < 4 {
		return 0, false
	}
	return len(b) - len(r.Src), true
}

// install builds a snapshot from a metadata response. A full response
// replaces the topic set; a partial one updates the topics it names.
func (u *Cluster) Install(resp *kmsg.MetadataResponse, full bool) *Snapshot {
	for {
		old := u.Snapshot()
		s := &Snapshot{
			Brokers: make(map[int32]string, len(resp.Brokers)),
			Topics:  make(map[string]*Topic, len(resp.Topics)),
		}
		for _, b := range resp.Brokers {
			s.Brokers[b.NodeID] = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
		}
		if len(s.Brokers) == 0 {
			s.Brokers = old.Brokers
		}
		if !full {
			for n, t := range old.Topics {
				s.Topics[n] = t
			}
		}
		for i := range resp.Topics {
			rt := &resp.Topics[i]
			if rt.Topic == nil {
				continue
			}
			if rt.ErrorCode == kerr.UnknownTopicOrPartition.Code {
				delete(s.Topics, *rt.Topic)
				continue
			}
			t := &Topic{Name: *rt.Topic, ID: rt.TopicID, VID: routing.VirtualTopicID(u.ClusterID, *rt.Topic), Err: rt.ErrorCode, Internal: rt.IsInternal}
			t.Parts = make([]partInfo, 0, len(rt.Partitions)) // partitions 0…n-1, in most answers
			for _, p := range rt.Partitions {
				if p.Partition < 0 || p.Partition > 1<<20 {
					continue
				}
				for int(p.Partition) >= len(t.Parts) {
					t.Parts = append(t.Parts, partInfo{})
				}
				t.Parts[p.Partition] = partInfo{Exists: true, Err: p.ErrorCode, Leader: p.Leader, Epoch: p.LeaderEpoch, Replicas: p.Replicas, ISR: p.ISR, Offline: p.OfflineReplicas}
			}
			s.Topics[t.Name] = t
		}
		s.ByID = make(map[[16]byte]*Topic, len(s.Topics))
		s.byVID = make(map[[16]byte]*Topic, len(s.Topics))
		s.leaders = make(map[int32]bool, len(s.Brokers))
		for _, t := range s.Topics {
			if t.ID != ([16]byte{}) {
				s.ByID[t.ID] = t
			}
			s.byVID[t.VID] = t
			for _, p := range t.Parts {
				if p.Exists && p.Leader >= 0 {
					s.leaders[p.Leader] = true
				}
			}
		}
		if u.Meta.CompareAndSwap(old, s) {
			return s
		}
	}
}

// refreshSoon refreshes the metadata in the background, once however many
// ask while it runs: an answer said a leader moved (NOT_LEADER, a fenced
// epoch), and the next request must find the new one. Clients that follow
// KIP-951 leader hints do not ask Metadata themselves, so Ferry must.
func (u *Cluster) RefreshSoon() {
	if u.Spawn == nil || !u.refreshing.CompareAndSwap(false, true) {
		return
	}
	if !u.Spawn(func() {
		defer u.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := u.Refresh(ctx, false); err != nil {
			u.log.Info("metadata refresh after a moved leader failed", zap.Error(err))
		}
	}) {
		u.refreshing.Store(false)
	}
}

// leaderMoved reports whether a partition error means Ferry's view of its
// leader is stale.
func LeaderMoved(code int16) bool {
	switch code {
	case kerr.NotLeaderForPartition.Code, kerr.LeaderNotAvailable.Code, kerr.FencedLeaderEpoch.Code,
		kerr.UnknownLeaderEpoch.Code, kerr.UnknownTopicOrPartition.Code, kerr.KafkaStorageError.Code:
		return true
	}
	return false
}

// partition returns the routing facts for a partition, refreshing the cache
// once when it does not know them.
func (u *Cluster) Partition(ctx context.Context, topic string, p int32) (partInfo, bool) {
	if pi, ok := u.Snapshot().partition(topic, p); ok && pi.Leader >= 0 {
		return pi, true
	}
	s, _ := u.Refresh(ctx, false)
	return s.partition(topic, p)
}

func (s *Snapshot) partition(topic string, p int32) (partInfo, bool) {
	t := s.Topics[topic]
	if t == nil || p < 0 || int(p) >= len(t.Parts) || !t.Parts[p].Exists {
		return partInfo{}, false
	}
	return t.Parts[p], true
}

// topicByVID resolves a virtual topic ID to its topic, refreshing once.
func (u *Cluster) TopicByVID(ctx context.Context, vid [16]byte) *Topic {
	if t := u.Snapshot().byVID[vid]; t != nil {
		return t
	}
	s, _ := u.Refresh(ctx, false)
	return s.byVID[vid]
}

// topicByID resolves a physical topic ID, refreshing once.
func (u *Cluster) TopicByID(ctx context.Context, id [16]byte) *Topic {
	if t := u.Snapshot().ByID[id]; t != nil {
		return t
	}
	s, _ := u.Refresh(ctx, false)
	return s.ByID[id]
}

// anyBroker picks a live broker for requests any broker can answer
// (KRaft brokers forward controller requests themselves).
func (u *Cluster) AnyBroker() (int32, error) {
	s := u.Snapshot()
	best := int32(-1)
	for id := range s.Brokers {
		if best < 0 || id < best {
			best = id
		}
	}
	if best < 0 {
		return -1, fmt.Errorf("cluster %q: %w", u.Name, ErrNoBrokers)
	}
	return best, nil
}

// reapIdle closes the upstream connections idle since before cutoff
// (beyond the number kept warm) and returns how many are in use and idle.
func (u *Cluster) ReapIdle(cutoff time.Time) (inUse, idle int) {
	u.poolMu.Lock()
	defer u.poolMu.Unlock()
	for _, p := range u.pools {
		l, i := p.reapIdle(cutoff)
		inUse += l
		idle += i
	}
	return inUse, idle
}

// leaderWait is how long an answer for the partitions of an unreachable
// leader waits for the cluster to move them: half the request's own
// timeout where it has one (a produce), at most 5 s, so the client has its
// answer well before it gives up on the request.
func LeaderWait(kr kmsg.Request) time.Duration {
	if p, ok := kr.(*kmsg.ProduceRequest); ok && p.TimeoutMillis > 0 {
		return min(5*time.Second, time.Duration(p.TimeoutMillis)*time.Millisecond/2)
	}
	return 5 * time.Second
}

// waitLeaderMoved returns once the cluster's metadata no longer names
// broker as the leader of any partition (or no longer lists it), when
// wait has passed, or when ctx ends; it asks for fresh metadata as it
// waits.
func (u *Cluster) WaitLeaderMoved(ctx context.Context, broker int32, wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		u.RefreshSoon()
		if !u.Snapshot().Leads(broker) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-tick.C:
		}
	}
}

// Leads reports whether broker is listed and Leads a partition: every
// request waiting on a dead leader asks it four times a second, so the
// answer is worked out once per snapshot (install).
func (s *Snapshot) Leads(broker int32) bool {
	_, listed := s.Brokers[broker]
	return listed && s.leaders[broker]
}

// brokerIDs lists the cluster's brokers as last seen, in ID order.
func (u *Cluster) BrokerIDs() []int32 {
	s := u.Snapshot()
	ids := make([]int32, 0, len(s.Brokers))
	for id := range s.Brokers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// brokersFrom lists the cluster's brokers as last seen, first ahead of the
// others (which follow in ID order).
func (u *Cluster) BrokersFrom(first int32) []int32 {
	ids := u.BrokerIDs()
	if i := slices.Index(ids, first); i > 0 {
		copy(ids[1:i+1], ids[:i])
		ids[0] = first
	} else if i < 0 {
		ids = append([]int32{first}, ids...)
	}
	return ids
}

var ErrNoBrokers = errors.New("no live brokers known")

// lookupTimeout bounds what a client's request waits on Ferry's own
// upstream lookups (metadata, coordinators): well below every client's
// request timeout (franz-go's is 10 s over the request's own, Java's and
// kafkajs' 30 s), so that a cluster that does not answer gets the client
// Ferry's retriable answer, not a timed-out connection.
const LookupTimeout = 5 * time.Second

// lookup is one FindCoordinator in flight, shared by every caller that
// missed the cache for one of its keys meanwhile.
type lookup struct {
	done chan struct{}
	res  map[string]kmsg.FindCoordinatorResponseCoordinator // by key, once done
	err  error
}

// coordinator returns the physical coordinator of a group (typ 0) or
// transactional ID (typ 1), asking the cluster when it is not cached.
func (u *Cluster) Coordinator(ctx context.Context, typ int8, key string) (int32, error) {
	res, err := u.Coordinators(ctx, typ, []string{key})
	if err != nil {
		return -1, err
	}
	if err := kerr.ErrorForCode(res[0].ErrorCode); err != nil {
		return -1, err
	}
	return res[0].NodeID, nil
}

// coordinators returns the physical coordinator of each key: cached, or
// from the cluster.
//
// The lookup runs on the asking connection's reader, which waits for it as
// a broker makes a connection's next request wait for the one it serves.
// Connections that miss the same key at once (every member of a group when
// its coordinator moved, every client right after a switch) share one
// FindCoordinator: the cluster is asked once per key, not once per
// connection. A waiter whose ctx ends leaves; the lookup goes on for the
// others, bounded by lookupTimeout.
func (u *Cluster) Coordinators(ctx context.Context, typ int8, keys []string) ([]kmsg.FindCoordinatorResponseCoordinator, error) {
	out := make([]kmsg.FindCoordinatorResponseCoordinator, len(keys))
	waits := make([]*lookup, len(keys))
	var mine *lookup
	var missing []string
	u.coordMu.Lock()
	for i, key := range keys {
		k := CoordKey{typ, key}
		if id, ok := u.coords.Get(k); ok {
			out[i] = kmsg.FindCoordinatorResponseCoordinator{Key: key, NodeID: id}
			continue
		}
		l, ok := u.lookups[k]
		if !ok {
			if mine == nil {
				mine = &lookup{done: make(chan struct{})}
			}
			l = mine
			u.lookups[k] = l
			missing = append(missing, key)
		}
		waits[i] = l
	}
	u.coordMu.Unlock()
	if mine != nil && (u.Spawn == nil || !u.Spawn(func() { u.lookUp(typ, missing, mine) })) {
		u.lookUp(typ, missing, mine) // not tracked (closing, or a bare upstream): here
	}
	for i, l := range waits {
		if l == nil {
			continue
		}
		select {
		case <-l.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if l.err != nil {
			return nil, l.err
		}
		out[i] = l.res[keys[i]]
	}
	return out, nil
}

// lookUp asks the cluster for the coordinators of keys on behalf of every
// waiter of l.
func (u *Cluster) lookUp(typ int8, keys []string, l *lookup) {
	ctx, cancel := context.WithTimeout(context.Background(), LookupTimeout)
	defer cancel()
	res, err := u.FindCoordinators(ctx, typ, keys)
	l.err = err
	l.res = make(map[string]kmsg.FindCoordinatorResponseCoordinator, len(res))
	for i, r := range res {
		r.Key = keys[i]
		l.res[keys[i]] = r
	}
	u.coordMu.Lock()
	for _, key := range keys {
		if k := (CoordKey{typ, key}); u.lookups[k] == l {
			delete(u.lookups, k)
		}
	}
	u.coordMu.Unlock()
	close(l.done)
}

// findCoordinators asks the cluster for the coordinators of keys and caches
// what it learns.
func (u *Cluster) FindCoordinators(ctx context.Context, typ int8, keys []string) ([]kmsg.FindCoordinatorResponseCoordinator, error) {
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorType = typ
	req.CoordinatorKeys = keys
	shards := u.Client.RequestSharded(ctx, req)
	byKey := make(map[string]kmsg.FindCoordinatorResponseCoordinator, len(keys))
	var firstErr error
	for _, sh := range shards {
		if sh.Err != nil {
			firstErr = sh.Err
			continue
		}
		resp := sh.Resp.(*kmsg.FindCoordinatorResponse)
		if len(resp.Coordinators) == 0 { // v0-3 answer, single key
			c := kmsg.FindCoordinatorResponseCoordinator{ErrorCode: resp.ErrorCode, ErrorMessage: resp.ErrorMessage, NodeID: resp.NodeID, Host: resp.Host, Port: resp.Port}
			if len(keys) == 1 {
				c.Key = keys[0]
			}
			resp.Coordinators = append(resp.Coordinators, c)
		}
		for _, c := range resp.Coordinators {
			byKey[c.Key] = c
		}
	}
	out := make([]kmsg.FindCoordinatorResponseCoordinator, len(keys))
	u.coordMu.Lock()
	defer u.coordMu.Unlock()
	for i, k := range keys {
		c, ok := byKey[k]
		if !ok {
			if firstErr != nil {
				return nil, fmt.Errorf("cluster %q: find coordinator: %w", u.Name, firstErr)
			}
			c = kmsg.FindCoordinatorResponseCoordinator{Key: k, ErrorCode: kerr.CoordinatorNotAvailable.Code, NodeID: -1}
		}
		if c.ErrorCode == 0 && c.NodeID >= 0 && u.coords.Add(CoordKey{typ, k}, c.NodeID) && u.CoordsEvicted != nil {
			u.CoordsEvicted.Inc()
		}
		out[i] = c
	}
	return out, nil
}

// forgetCoordinator drops a cached coordinator after NOT_COORDINATOR or a
// dead connection.
func (u *Cluster) ForgetCoordinator(typ int8, key string) {
	u.coordMu.Lock()
	u.coords.Remove(CoordKey{typ, key})
	u.coordMu.Unlock()
}

// forgetCoordinatorsOn drops every cached coordinator on a broker.
func (u *Cluster) ForgetCoordinatorsOn(broker int32) {
	u.coordMu.Lock()
	for _, k := range u.coords.Keys() {
		if id, ok := u.coords.Peek(k); ok && id == broker {
			u.coords.Remove(k)
		}
	}
	u.coordMu.Unlock()
}

// pool returns the connection pool of a broker for an identity (0: the
// service identity; see poolIdentity).
func (u *Cluster) Pool(broker, ident int32) (*brokerPool, error) {
	addr, ok := u.Snapshot().Brokers[broker]
	if !ok {
		return nil, fmt.Errorf("cluster %q: broker %d is not in metadata", u.Name, broker)
	}
	u.poolMu.Lock()
	defer u.poolMu.Unlock()
	k := poolKey{broker, ident}
	p := u.pools[k]
	if p == nil || p.addr != addr {
		if p != nil {
			p.close()
		}
		p = newBrokerPool(u, broker, addr, ident)
		u.pools[k] = p
	}
	return p, nil
}

// clusterOpsTTL is how long the cluster's answer about authorized
// operations is reused: they change only with ACLs.
const clusterOpsTTL = 5 * time.Second

// clusterOperations asks the cluster which operations Ferry's principal may
// perform on it (DescribeCluster with IncludeClusterAuthorizedOperations),
// reusing an answer younger than clusterOpsTTL (or older, when the cluster
// cannot be reached). Only ErrorCode, ErrorMessage and
// ClusterAuthorizedOperations of the answer are meant.
func (u *Cluster) ClusterOperations(ctx context.Context) (*kmsg.DescribeClusterResponse, error) {
	u.opsMu.Lock()
	defer u.opsMu.Unlock()
	if u.ops != nil && time.Since(u.opsAt) < clusterOpsTTL {
		return u.ops, nil
	}
	req := kmsg.NewPtrDescribeClusterRequest()
	req.IncludeClusterAuthorizedOperations = true
	resp, err := req.RequestWith(ctx, u.Client)
	if err != nil {
		if u.ops != nil {
			return u.ops, nil // the cluster cannot answer now: its last answer
		}
		return nil, fmt.Errorf("cluster %q: describe cluster: %w", u.Name, err)
	}
	msg := resp.ErrorMessage
	if msg != nil {
		m := *msg
		msg = &m
	}
	u.ops = &kmsg.DescribeClusterResponse{ErrorCode: resp.ErrorCode, ErrorMessage: msg, ClusterAuthorizedOperations: resp.ClusterAuthorizedOperations}
	u.opsAt = time.Now()
	return u.ops, nil
}

// lane returns the lane of a physical broker, giving it one on first sight.
func (u *Cluster) Lane(broker int32, lanes int) int {
	if broker < 0 || lanes <= 1 {
		return 0
	}
	u.laneMu.Lock()
	defer u.laneMu.Unlock()
	if l, ok := u.Lanes[broker]; ok {
		return l % lanes
	}
	// Give every broker known now a lane, in ID order, so that a fresh
	// Ferry assigns the same lanes as one that has run for a while.
	ids := []int32{broker}
	for id := range u.Snapshot().Brokers {
		if _, ok := u.Lanes[id]; !ok && id != broker {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		u.Lanes[id] = len(u.Lanes)
	}
	return u.Lanes[broker] % lanes
}

// poolIdentity is the identity whose pools carry the requests of a client
// of identity number id on this cluster: id when the cluster maps it, else
// the service identity.
func (u *Cluster) PoolIdentity(id int32) int32 {
	if id > 0 && int(id) < len(u.Idents) && u.Idents[id] != nil {
		return id
	}
	return 0
}

// brokerAddrs are the addresses to check credentials on: the brokers last
// seen in metadata, else the bootstrap addresses.
func (u *Cluster) BrokerAddrs() []string {
	var addrs []string
	for _, id := range u.BrokerIDs() {
		addrs = append(addrs, u.Snapshot().Brokers[id])
	}
	if len(addrs) == 0 {
		addrs = append(addrs, u.bootstrap...)
	}
	return addrs
}

// partitionCount is how many partitions t has; 0 for nil (unknown).
func (t *Topic) PartitionCount() int32 {
	if t == nil {
		return 0
	}
	return int32(len(t.Parts))
}

// UpstreamAuthFailure is the last failed authentication of one identity
// towards one cluster, until a connection of that identity authenticates.
type AuthFailure struct {
	Cluster string `json:"cluster"`
	// Principal is the mapped client principal, "" for Ferry's own
	// (service) identity.
	Principal string    `json:"principal,omitempty"`
	Broker    int32     `json:"broker"`
	At        time.Time `json:"at"`
	Error     string    `json:"error"`
}

// upstreamAuthFailures are an upstream's current failures, by principal.
type upstreamAuthFailures struct {
	mu    sync.Mutex
	fails map[string]AuthFailure
}

// note records the outcome of a dial of principal's identity: a failure,
// or nil, which clears it.
func (f *upstreamAuthFailures) note(cluster, principal string, broker int32, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fails, principal)
		return
	}
	if f.fails == nil {
		f.fails = map[string]AuthFailure{}
	}
	f.fails[principal] = AuthFailure{Cluster: cluster, Principal: principal, Broker: broker, At: time.Now().UTC(), Error: err.Error()}
}

func (f *upstreamAuthFailures) List() []AuthFailure {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]AuthFailure, 0, len(f.fails))
	for _, e := range f.fails {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b AuthFailure) int { return strings.Compare(a.Principal, b.Principal) })
	return out
}

// CoordinatorKeys are the keys of the coordinator cache, the least
// recently used first (at most MaxCoordinators).
func (u *Cluster) CoordinatorKeys() []CoordKey {
	u.coordMu.Lock()
	defer u.coordMu.Unlock()
	return u.coords.Keys()
}

// CachedCoordinator reports whether the coordinator of key (of type typ)
// is cached, without making it the most recently used.
func (u *Cluster) CachedCoordinator(typ int8, key string) bool {
	u.coordMu.Lock()
	defer u.coordMu.Unlock()
	_, ok := u.coords.Peek(CoordKey{typ, key})
	return ok
}

// AuthFailures are the identities the cluster refuses now, by principal.
func (u *Cluster) AuthFailures() []AuthFailure { return u.authFails.List() }
