package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol/clusterauth"
)

// DefaultStoreTopic is the topic that holds the routing state on each
// physical cluster. Its name starts with "__" so that the mirror never copies
// it (mirror/config.go, mirrorTopic): each cluster's copy is written by Ferry
// directly, and a mirrored copy would both overwrite the standby's newer
// state and collide with Ferry's own writes there.
const DefaultStoreTopic = "__ferry_routing"

// DefaultStoreTimeout bounds each attempt to reach one cluster: the writes to
// the clusters a state does not make active, and every read.
const DefaultStoreTimeout = 10 * time.Second

// storeFormat is the version of the record value's format. A record of any
// other version is not read: a later Ferry that changes the format bumps it.
const storeFormat = 1

// maxStateBytes bounds a state record (the topic's max.message.bytes and the
// producer's batch size): the fences of MaxFences generations list every
// mirrored partition's end offset, more than Kafka's 1 MiB default for a large
// cluster.
const maxStateBytes = 8 << 20

// retryBackoff is the pause between attempts on one cluster.
const retryBackoff = 200 * time.Millisecond

// stableBackoff is the first pause of a read waiting for the log to be
// stable (read); it doubles up to retryBackoff.
const stableBackoff = 10 * time.Millisecond

// storeTxnTimeout is the transaction timeout of a state write: a write
// whose member died mid-way is aborted by the next writer, or at the
// latest after this.
const storeTxnTimeout = time.Minute

// StoreTransactionalID is the transactional ID under which every member
// writes the routing state of the virtual cluster clusterID to topic: one
// for the fleet, so that each write fences the others (writeIf). The
// proxy refuses clients' InitProducerId for it.
func StoreTransactionalID(topic, clusterID string) string { return topic + "/" + clusterID }

// rewriteMaxBackoff bounds the pause between the background attempts to
// write a state to a cluster that missed it (Save): it starts at a second
// and doubles up to this.
const rewriteMaxBackoff = 10 * time.Second

// StoreOption configures a KafkaStore.
type StoreOption func(*storeConfig)

type storeConfig struct {
	log     *zap.Logger
	topic   string
	timeout time.Duration
	// security is each cluster's TLS and SASL (StoreClusterSecurity).
	security map[string]*clusterauth.Security
	// clientOpts go to every client the store makes (tests: hooks).
	clientOpts []kgo.Opt
}

// StoreLogger sets the logger (default: none).
func StoreLogger(l *zap.Logger) StoreOption { return func(c *storeConfig) { c.log = l } }

// StoreTopic sets the state topic's name (default DefaultStoreTopic). It must
// start with "__": the mirror never copies such topics.
func StoreTopic(name string) StoreOption { return func(c *storeConfig) { c.topic = name } }

// StoreClusterSecurity sets the named cluster's TLS and SASL, which every
// client of the store to that cluster uses (default: plaintext).
func StoreClusterSecurity(name string, sec *clusterauth.Security) StoreOption {
	return func(c *storeConfig) {
		if c.security == nil {
			c.security = map[string]*clusterauth.Security{}
		}
		c.security[name] = sec
	}
}

// StoreTimeout sets how long one cluster is tried (default
// DefaultStoreTimeout).
func StoreTimeout(d time.Duration) StoreOption { return func(c *storeConfig) { c.timeout = d } }

// KafkaStore keeps the routing state in a compacted topic on every physical
// cluster, one record per virtual cluster, keyed by the virtual cluster ID:
// two Ferry deployments in front of the same physical clusters never read
// each other's state.
type KafkaStore struct {
	key     []byte // the virtual cluster ID
	topic   string
	txnID   string // every member's writes' transactional ID (writeIf)
	timeout time.Duration
	log     *zap.Logger
	// clusters are every configured cluster, never changed after
	// NewKafkaStore; live names those not retired, sorted (Retire
	// replaces it).
	clusters map[string]*storeCluster
	live     atomic.Pointer[[]string]
	retireMu sync.Mutex

	// bg ends at Close: the writes of a state to the clusters that
	// missed it (rewriteLater).
	bg       context.Context
	stopBg   context.CancelFunc
	bgMu     sync.Mutex // bgClosed, and bgWG.Add against Close's Wait
	bgClosed bool
	bgWG     sync.WaitGroup

	closeOnce sync.Once

	// beforeCommit, set by tests, runs in writeIf once the condition has
	// accepted what a cluster holds and before the write commits: where
	// another member's write can come between.
	beforeCommit func(cluster string)
}

var _ Store = (*KafkaStore)(nil)

type storeCluster struct {
	name  string
	addrs []string              // bootstrap
	sec   *clusterauth.Security // nil: plaintext
	opts  []kgo.Opt             // for the producer of each write, besides the security
	cl    *kgo.Client           // metadata, topic creation, reads
	log   *zap.Logger

	// ensuring serialises ensureTopic, within each caller's ctx: a warm
	// stuck on a cluster that does not answer must not hold a save's
	// write there past the write's own time.
	ensuring chan struct{}
	ready    atomic.Bool // the topic was seen with a leader

	// kept is the transactional producer of the last write that
	// committed, for the next write to this cluster (takeProducer): a
	// producer made for each write costs its connections, the
	// coordinator's lookup and InitProducerId, a dozen round trips, which
	// a cluster a region away turns into most of a second of a switch's
	// held writes. Nil when none is kept, or while a write uses it.
	keptMu     sync.Mutex
	kept       *kgo.Client
	keptClosed bool          // Close ran: nothing more is kept
	warming    chan struct{} // closed when the warm under way ends (Warm); nil: none

	// where is what the last read learnt of the topic (readOnce), so
	// that the next read is one Fetch; nil after any failure, and on a
	// cluster without topic IDs (a topic recreated under the same name
	// would be read from the old log start).
	where atomic.Pointer[readPosition]

	rewriteMu sync.Mutex
	rewrite   *rewrite // the state this cluster missed, written again in the background
}

// readPosition is where a read of the state topic starts: the topic's ID,
// its partition's leader and log start when it was last read.
type readPosition struct {
	topicID  [16]byte
	leader   int32
	logStart int64
}

// rewrite is a background write of a state to a cluster that missed it.
type rewrite struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// storedState is a record's value: the state, with the format's version so
// that a later format can be told apart.
type storedState struct {
	Format int   `json:"format"`
	State  State `json:"state"`
}

// NewKafkaStore returns a store for the virtual cluster clusterID over the
// given physical clusters (name → bootstrap addresses). It connects to none
// of them until Save or Load.
func NewKafkaStore(clusterID string, clusters map[string][]string, opts ...StoreOption) (*KafkaStore, error) {
	cfg := storeConfig{log: zap.NewNop(), topic: DefaultStoreTopic, timeout: DefaultStoreTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case clusterID == "":
		return nil, errors.New("routing store: empty cluster ID")
	case len(clusters) == 0:
		return nil, errors.New("routing store: no clusters")
	case !strings.HasPrefix(cfg.topic, "__") || len(cfg.topic) < 3:
		return nil, fmt.Errorf("routing store: topic %q: the name must start with \"__\" so that the mirror never copies it", cfg.topic)
	case cfg.timeout <= 0:
		return nil, fmt.Errorf("routing store: timeout %v: must be positive", cfg.timeout)
	}
	if cfg.log == nil {
		cfg.log = zap.NewNop()
	}
	s := &KafkaStore{
		key:      []byte(clusterID),
		topic:    cfg.topic,
		txnID:    StoreTransactionalID(cfg.topic, clusterID),
		timeout:  cfg.timeout,
		log:      cfg.log.With(zap.String("topic", cfg.topic)),
		clusters: make(map[string]*storeCluster, len(clusters)),
	}
	s.bg, s.stopBg = context.WithCancel(context.Background())
	var names []string
	s.live.Store(&names) // names as it grows: a Close on the way out closes those made
	for name, addrs := range clusters {
		if len(addrs) == 0 {
			s.Close()
			return nil, fmt.Errorf("routing store: cluster %q has no bootstrap addresses", name)
		}
		opts := append([]kgo.Opt{
			kgo.ClientID("ferry-routing"),
			kgo.MetadataMinAge(250 * time.Millisecond),
		}, cfg.clientOpts...)
		sec := cfg.security[name]
		cl, err := sec.NewClient(addrs, opts...)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("routing store: cluster %q: %w", name, err)
		}
		s.clusters[name] = &storeCluster{name: name, addrs: addrs, sec: sec, opts: opts, cl: cl, log: s.log.With(zap.String("cluster", name)), ensuring: make(chan struct{}, 1)}
		names = append(names, name)
	}
	slices.Sort(names)
	return s, nil
}

// Clusters names the clusters, sorted.
func (s *KafkaStore) Clusters() []string { return slices.Clone(s.liveNames()) }

// liveNames is the clusters not retired, sorted. Never change it.
func (s *KafkaStore) liveNames() []string { return *s.live.Load() }

// liveCluster is the named cluster, or nil when it is not configured or
// was retired.
func (s *KafkaStore) liveCluster(name string) *storeCluster {
	if !slices.Contains(s.liveNames(), name) {
		return nil
	}
	return s.clusters[name]
}

// Retire stops keeping the routing state on a cluster: from now on it is
// neither read nor written, and its client is closed. The caller makes
// sure the routing state in force does not name it (a switch to it is
// refused from now on by the switcher); what it holds is left there.
func (s *KafkaStore) Retire(name string) error {
	s.retireMu.Lock()
	defer s.retireMu.Unlock()
	names := s.liveNames()
	if !slices.Contains(names, name) {
		return fmt.Errorf("routing store: %q is not one of the clusters %v", name, names)
	}
	if len(names) == 1 {
		return fmt.Errorf("routing store: %q is the only cluster", name)
	}
	next := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == name })
	s.live.Store(&next)
	c := s.clusters[name]
	c.stopRewrite()
	c.closeKept()
	c.cl.Close()
	return nil
}

// Topic is the state topic's name, on every cluster.
func (s *KafkaStore) Topic() string { return s.topic }

// Close stops the background writes and closes the clients. It is safe to
// call more than once.
func (s *KafkaStore) Close() {
	s.closeOnce.Do(func() {
		s.bgMu.Lock()
		s.bgClosed = true
		s.bgMu.Unlock()
		s.stopBg()
		s.bgWG.Wait()
		for _, name := range s.liveNames() { // the retired were closed then
			c := s.clusters[name]
			c.closeKept()
			c.cl.Close()
		}
	})
}

// Save writes st to the cluster st makes active, within ctx, and then to every
// other cluster, each within the store's timeout; it fails unless the active
// cluster has it. It first reads every cluster and writes nothing if one
// holds a state st must not replace (a newer generation, or another
// switch's state of the same generation: supersedes); the error then wraps
// ErrSuperseded. Each write checks again, in the transaction that writes
// (writeIf): a state another member saved between the check and the
// write is never replaced, on the active cluster (Save then fails with
// ErrSuperseded) or another (skipped, as is one the check found holding
// such a state). A failure on another cluster does not fail Save (a forced
// switch finds the old cluster dead): st is written there again in the
// background (rewriteLater) until that cluster holds st's generation or a
// newer one, the store closes, or a later Save writes to it.
//
// The other clusters get the state too because a member that restarts and
// reaches only the old active cluster must not route back to it: after a
// planned switch the old cluster is alive and receives the new generation,
// which names the new active cluster. The active cluster is written first, so
// that a Save that fails leaves the other clusters as they were: none of them
// then holds a generation that names a cluster which does not have it. (A
// write to the active cluster that was sent but not answered within ctx may
// still have landed there; Kafka cannot say.)
func (s *KafkaStore) Save(ctx context.Context, st State) error {
	active := s.liveCluster(st.Active)
	if active == nil {
		return fmt.Errorf("routing store: the state makes %q active, which is not one of the clusters %v", st.Active, s.liveNames())
	}
	val, err := json.Marshal(storedState{Format: storeFormat, State: st})
	if err != nil {
		return fmt.Errorf("routing store: encoding the state: %w", err)
	}
	// An older state still being written again in the background must
	// not land after this one.
	active.stopRewrite()
	// Every write is conditional on what the clusters hold: a switch
	// that lost a race (a planned switch's rollback after a forced one
	// flipped, two switches at once) must not put back an older
	// routing state, which would stop every member's write lease and
	// send members restarted later to the old cluster. The check reads
	// every cluster first, so that a Save refused writes nowhere; each
	// write checks again, atomically (writeIf).
	unread, err := s.checkAll(ctx, st)
	if err != nil {
		return err
	}
	unlessSuperseded := func(c *storeCluster) func(State, bool) error {
		return func(held State, found bool) error {
			if found {
				if why := Supersedes(held, st); why != "" {
					return &SupersededError{Cluster: c.name, Held: held, Why: why}
				}
			}
			return nil
		}
	}
	if err := s.writeIf(ctx, active, val, unlessSuperseded(active)); err != nil {
		if errors.Is(err, ErrSuperseded) {
			return err
		}
		return fmt.Errorf("routing store: writing %s to the active cluster %q: %w", st, st.Active, err)
	}
	var wg sync.WaitGroup
	for _, name := range s.liveNames() {
		if name == st.Active {
			continue
		}
		c := s.clusters[name]
		if forced(st) && slices.Contains(unread, name) {
			// A forced switch whose check could not read this cluster
			// (the old active one, gone) does not wait for it a second
			// time: the write goes on in the background, as after a
			// failed write.
			c.stopRewrite()
			c.log.Warn("the routing state was not written to a cluster the forced switch could not read; writing it again in the background until that cluster holds its generation", zap.Stringer("routing", st))
			s.rewriteLater(c, st, val)
			continue
		}
		wg.Go(func() {
			c.stopRewrite()
			cctx, cancel := context.WithTimeout(ctx, s.otherWait(st))
			defer cancel()
			err := s.writeIf(cctx, c, val, unlessSuperseded(c))
			var sup *SupersededError
			switch {
			case err == nil:
			case errors.As(err, &sup):
				c.log.Warn("the routing state was not written to a cluster that holds a newer one", zap.Stringer("routing", st), zap.Error(err))
			default:
				c.log.Warn("the routing state was not written to a cluster it does not make active; writing it again in the background until that cluster holds its generation", zap.Stringer("routing", st), zap.Error(err))
				s.rewriteLater(c, st, val)
			}
		})
	}
	wg.Wait()
	s.log.Info("routing state saved", zap.Stringer("routing", st))
	return nil
}

// forcedOtherWait bounds a forced switch's read and write of the clusters
// it does not make active: the old one is likely gone (or paused, which
// costs a whole timeout each), every member's writes are held meanwhile,
// and a write that misses is made again in the background (rewriteLater).
const forcedOtherWait = 2 * time.Second

// otherWait bounds st's save's read and write of a cluster it does not
// make active.
func (s *KafkaStore) otherWait(st State) time.Duration {
	if forced(st) {
		return min(s.timeout, forcedOtherWait)
	}
	return s.timeout
}

// errSkipped is a cluster the caller of a forced switch's save found
// unreachable (WithUnreachable): not read.
var errSkipped = errors.New("routing store: found unreachable by the switch; not read")

// forced reports whether st is a forced switch's.
func forced(st State) bool { return st.Last != nil && st.Last.Mode == Forced }

// ErrSuperseded is what Save's error wraps (as a *SupersededError) when a
// cluster holds a routing state that st must not replace.
var ErrSuperseded = errors.New("routing store: a cluster holds a newer routing state")

// SupersededError is a Save refused because a cluster holds a state that
// the one saved must not replace (supersedes).
type SupersededError struct {
	Cluster string
	Held    State // what the cluster holds
	Why     string
}

func (e *SupersededError) Error() string {
	return fmt.Sprintf("routing store: cluster %q holds %s, %s: not replaced", e.Cluster, e.Held, e.Why)
}

// Is makes errors.Is(err, ErrSuperseded) hold.
func (e *SupersededError) Is(target error) bool { return target == ErrSuperseded }

// Supersedes says why held, found on a cluster, must not be replaced by
// st, or "" when it may be. A newer generation is never replaced. Within
// one generation, a state is replaced by its own switch's next step, or
// by a switch beginning from it; never by another switch that made the
// same generation (two switches at once), and never by another switch's
// serving state while held is a switch's draining one: that would reopen
// the writes the running switch holds. Either switch ID missing (a state
// saved by a Ferry that did not write IDs): replaced, as before.
func Supersedes(held, st State) string {
	switch {
	case held.Generation > st.Generation:
		return fmt.Sprintf("generation %d, newer than %d", held.Generation, st.Generation)
	case held.Generation < st.Generation:
		return ""
	}
	hid, sid := held.SwitchID(), st.SwitchID()
	if hid == "" || sid == "" || hid == sid {
		return ""
	}
	if held.Last.Outcome == OutcomeSwitched && st.Last.Outcome == OutcomeSwitched {
		return fmt.Sprintf("which switch %s made; switch %s made the same generation", hid, sid)
	}
	if held.Phase != PhaseServing && held.Phase != "" && st.Phase == PhaseServing {
		return fmt.Sprintf("switch %s is running; switch %s would release its held writes", hid, sid)
	}
	return ""
}

// readResult is what one cluster holds (readEach).
type readResult struct {
	name  string
	st    State
	found bool
	err   error
}

// readAll reads every cluster at once, each within the store's timeout.
func (s *KafkaStore) readAll(ctx context.Context) []readResult {
	return readEach(ctx, s.liveNames(), s.LoadFrom)
}

// readEach reads the named clusters at once with load.
func readEach(ctx context.Context, names []string, load func(context.Context, string) (State, bool, error)) []readResult {
	results := make([]readResult, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			st, found, err := load(ctx, name)
			results[i] = readResult{name, st, found, err}
		})
	}
	wg.Wait()
	return results
}

// voidedIn reports whether a state read in results voids gen: a
// generation rolled back from, whose state, should a late write have left
// one on a cluster, is passed over.
func voidedIn(results []readResult, gen uint32) bool {
	return slices.ContainsFunc(results, func(r readResult) bool { return r.err == nil && r.found && r.st.IsVoided(gen) })
}

// checkAll reads every cluster and refuses st if one holds a state st
// must not replace. The active cluster must be read; another that cannot
// be (a forced switch finds the old one dead) is left to its write, and
// named in unread.
func (s *KafkaStore) checkAll(ctx context.Context, st State) (unread []string, err error) {
	var errs []error
	skip := Unreachable(ctx)
	load := func(ctx context.Context, name string) (State, bool, error) {
		if name != st.Active && forced(st) && slices.Contains(skip, name) {
			// Found unreachable by the caller for a while: not
			// waited for (written in the background, as unread).
			return State{}, false, errSkipped
		}
		if name != st.Active {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.otherWait(st))
			defer cancel()
		}
		return s.LoadFrom(ctx, name)
	}
	for _, r := range readEach(ctx, s.liveNames(), load) {
		switch {
		case r.err != nil && r.name == st.Active:
			errs = append(errs, fmt.Errorf("routing store: reading what the active cluster %q holds before writing %s: %w", r.name, st, r.err))
		case r.err != nil:
			unread = append(unread, r.name)
		case r.err == nil && r.found:
			if why := Supersedes(r.st, st); why != "" {
				errs = append(errs, &SupersededError{Cluster: r.name, Held: r.st, Why: why})
			}
		}
	}
	for _, err := range errs {
		if errors.Is(err, ErrSuperseded) {
			return unread, err
		}
	}
	return unread, errors.Join(errs...)
}

// rewriteLater writes st (encoded as val) to c in the background until c
// holds st's generation or a newer one: a planned switch's save that
// missed the old cluster left it holding the old generation draining,
// which members that reach only that cluster would read for good (they do
// not take it for abandoned without reading every cluster, lease.go), and
// a member restarted there would load. A state of the generation c
// already holds (a draining state, a rollback's serving one) is not
// written again: c holds the generation, and only its phase would change.
func (s *KafkaStore) rewriteLater(c *storeCluster, st State, val []byte) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return
	}
	ctx, cancel := context.WithCancel(s.bg)
	rw := &rewrite{cancel: cancel, done: make(chan struct{})}
	c.rewriteMu.Lock()
	if c.rewrite != nil {
		c.rewrite.cancel() // a Save that ran alongside: the later one is written
	}
	c.rewrite = rw
	c.rewriteMu.Unlock()
	s.bgWG.Go(func() {
		defer close(rw.done)
		defer cancel()
		backoff := time.Second
		for attempt := 1; ; attempt++ {
			select {
			case <-ctx.Done():
				if s.bg.Err() != nil {
					c.log.Warn("closing with the routing state a save missed not yet written to a cluster", zap.Stringer("routing", st))
				}
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, rewriteMaxBackoff)
			actx, acancel := context.WithTimeout(ctx, s.timeout)
			err := s.writeIf(actx, c, val, func(held State, found bool) error {
				if found && held.Generation >= st.Generation {
					return &SupersededError{Cluster: c.name, Held: held, Why: fmt.Sprintf("generation %d, not older than %d", held.Generation, st.Generation)}
				}
				return nil
			})
			acancel()
			var sup *SupersededError
			if errors.As(err, &sup) {
				c.log.Info("the routing state a save missed is no longer needed on a cluster: it holds that generation or a newer one", zap.Stringer("routing", st), zap.Stringer("held", sup.Held))
				return
			}
			if err == nil {
				c.log.Info("the routing state a save missed was written to a cluster", zap.Stringer("routing", st), zap.Int("attempt", attempt))
				return
			}
			if ctx.Err() != nil {
				if s.bg.Err() != nil {
					c.log.Warn("closing with the routing state a save missed not yet written to a cluster", zap.Stringer("routing", st))
				}
				return
			}
			c.log.Debug("writing again the routing state a save missed", zap.Stringer("routing", st), zap.Int("attempt", attempt), zap.Error(err))
		}
	})
}

// stopRewrite stops the background write to c, if any, and waits for it
// to end (its producer closed).
func (c *storeCluster) stopRewrite() {
	c.rewriteMu.Lock()
	rw := c.rewrite
	c.rewrite = nil
	c.rewriteMu.Unlock()
	if rw != nil {
		rw.cancel()
		<-rw.done
	}
}

// Prepare creates the state topic on every cluster that lacks it, so that
// the first switch does not wait for topic creation. A cluster that cannot
// be reached is logged and left to Save.
func (s *KafkaStore) Prepare(ctx context.Context) {
	var wg sync.WaitGroup
	for _, name := range s.liveNames() {
		c := s.clusters[name]
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, s.timeout)
			defer cancel()
			if err := c.ensureTopic(cctx, s.topic); err != nil {
				c.log.Info("the routing state topic is not ready on a cluster; the next save creates it", zap.Error(err))
			}
		})
	}
	wg.Wait()
}

// writeIf writes val to c if cond, given what c holds just before the
// write, returns nil; else it writes nothing and returns cond's error.
// Kafka has no conditional append, but a transaction gives one: every
// member writes under one transactional ID (txnID), so each write's
// InitProducerId fences the write of any other member under way, and
// aborts the transaction it left open. The record is sent in a
// transaction, which fences the others; what c held before it is then
// read (read committed: up to the record, which is the last stable
// offset while the transaction is open); the transaction commits only if
// cond accepts that, and only if no later writer fenced this one meanwhile.
// Readers read committed records only, so a write refused, fenced or
// abandoned is never read. A write fenced is tried again, reading again,
// until ctx ends.
func (s *KafkaStore) writeIf(ctx context.Context, c *storeCluster, val []byte, cond func(held State, found bool) error) error {
	if err := c.ensureTopic(ctx, s.topic); err != nil {
		return err
	}
	for {
		err := s.writeOnceIf(ctx, c, val, cond)
		var stale *staleProducerError
		if errors.As(err, &stale) && ctx.Err() == nil {
			// The producer kept from the last write no longer
			// serves (another member's write fenced it, the
			// transactional ID expired, its connections broke): a
			// fresh one, at once.
			c.log.Debug("the producer kept from the last routing state write failed; writing with a new one", zap.Error(stale.err))
			err = s.writeOnceIf(ctx, c, val, cond)
		}
		if err == nil || !fencedWrite(err) {
			return err
		}
		c.log.Debug("a routing state write was fenced by another member's; reading and trying again", zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(retryBackoff):
		}
	}
}

// staleProducerError is a write that failed before its condition was
// asked, with the producer kept from an earlier write (writeOnceIf).
type staleProducerError struct{ err error }

func (e *staleProducerError) Error() string { return e.err.Error() }
func (e *staleProducerError) Unwrap() error { return e.err }

// fencedWrite reports whether a transactional write failed because
// another writer of the same transactional ID started meanwhile, or the
// coordinator aborted it: worth reading again and retrying.
func fencedWrite(err error) bool {
	for _, e := range []error{kerr.ProducerFenced, kerr.InvalidProducerEpoch, kerr.TransactionAbortable, kerr.ConcurrentTransactions, kerr.InvalidTxnState} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *KafkaStore) writeOnceIf(ctx context.Context, c *storeCluster, val []byte, cond func(State, bool) error) error {
	// The producer kept from the last write that committed, else a new
	// one. A producer does not give up a record it may have sent before
	// its broker answers, whatever the record's context says, so a write
	// to a dead cluster would outlive ctx: a write that fails closes its
	// producer (Close fails what it still holds; a transaction it leaves
	// open is never committed: the next writer's InitProducerId, or the
	// transaction timeout, aborts it), and only one that committed is
	// kept. A kept producer whose epoch another member's write has since
	// bumped is fenced at its first request, before anything commits:
	// the fencing writeIf relies on holds for it as for a new one.
	if err := c.warmed(ctx); err != nil {
		return err
	}
	p, reused := c.takeProducer()
	if p == nil {
		var err error
		if p, err = s.newProducer(c); err != nil {
			return err
		}
	}
	committed := false
	defer func() {
		switch {
		case committed:
			c.keepProducer(p)
		case ctx.Err() != nil:
			// A cluster that does not answer (a frozen host, a
			// partition: connections open, nothing answered) holds
			// Close until its requests time out; the write has given
			// up, and so does the caller.
			go p.Close()
		default:
			p.Close()
		}
	}()
	// stale marks a failure before the condition was asked, with a kept
	// producer: writeIf tries a new one.
	stale := func(err error) error {
		if reused && ctx.Err() == nil {
			return &staleProducerError{err}
		}
		return err
	}
	// BeginTransaction takes no context: it waits for the producer ID,
	// which InitProducerId to such a cluster never brings (a forced
	// switch away from a frozen cluster waited 50 s on it for the write
	// that only informs the old cluster).
	began := make(chan error, 1)
	go func() { began <- p.BeginTransaction() }()
	select {
	case err := <-began:
		if err != nil {
			return stale(err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	abort := func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		defer cancel()
		if err := p.EndTransaction(actx, kgo.TryAbort); err != nil {
			c.log.Debug("aborting a routing state write", zap.Error(err))
		}
	}
	rec := &kgo.Record{Topic: s.topic, Partition: 0, Key: s.key, Value: val}
	done := make(chan error, 1)
	p.Produce(ctx, rec, func(_ *kgo.Record, err error) { done <- err })
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		// The topic may have been deleted: look again next time.
		c.ready.Store(false)
		c.where.Store(nil)
		return stale(err)
	}
	held, found, err := s.read(ctx, c, rec.Offset)
	if err == nil {
		err = cond(held, found)
	}
	if err != nil {
		if ctx.Err() == nil {
			// Past ctx the cluster is not answering: the next
			// writer's InitProducerId, or the transaction timeout,
			// aborts what is left open.
			abort()
		}
		return err
	}
	if s.beforeCommit != nil {
		s.beforeCommit(c.name)
	}
	if err := p.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return err
	}
	committed = true
	return nil
}

// Warm readies a write of the state to cluster, ahead of a Save, in the
// background: the topic, where to read it, and the producer the write
// takes, its producer ID fetched (a new producer's connections, the
// coordinator's lookup and InitProducerId are a dozen round trips). A
// planned switch warms every cluster while it drains, so that its save
// costs the writes' own round trips even the first time. A write to the
// cluster meanwhile waits for the warm within its own time (a save's write
// to a cluster it does not make active waits no longer than it would have
// written), so that the two do not each initialise a producer and fence
// each other. A producer already kept is left as it is; a failure is left
// to the write. The warm ends with ctx, or at Close.
func (s *KafkaStore) Warm(ctx context.Context, cluster string) {
	c := s.liveCluster(cluster)
	if c == nil {
		return
	}
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return
	}
	c.keptMu.Lock()
	if c.warming != nil {
		c.keptMu.Unlock()
		return // one at a time
	}
	done := make(chan struct{})
	c.warming = done
	c.keptMu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.bg, cancel) // Close ends it
	s.bgWG.Go(func() {
		defer func() {
			stop()
			cancel()
			c.keptMu.Lock()
			c.warming = nil
			c.keptMu.Unlock()
			close(done)
		}()
		s.warm(wctx, c)
	})
}

func (s *KafkaStore) warm(ctx context.Context, c *storeCluster) {
	if c.ensureTopic(ctx, s.topic) != nil {
		return
	}
	if _, _, err := s.read(ctx, c, -1); err != nil {
		return
	}
	c.keptMu.Lock()
	kept := c.kept != nil
	c.keptMu.Unlock()
	if kept {
		return
	}
	p, err := s.newProducer(c)
	if err != nil {
		return
	}
	// As in writeOnceIf: BeginTransaction waits for the producer ID
	// without a context.
	began := make(chan error, 1)
	go func() { began <- p.BeginTransaction() }()
	select {
	case err = <-began:
	case <-ctx.Done():
		go p.Close()
		return
	}
	if err == nil {
		// Nothing was produced: the transaction ends here, unsent.
		err = p.EndTransaction(ctx, kgo.TryAbort)
	}
	if err != nil {
		c.log.Debug("warming the routing state's write", zap.Error(err))
		p.Close()
		return
	}
	c.keepProducer(p)
}

// warmed waits, within ctx, for a warm of c under way (Warm).
func (c *storeCluster) warmed(ctx context.Context) error {
	c.keptMu.Lock()
	w := c.warming
	c.keptMu.Unlock()
	if w == nil {
		return nil
	}
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newProducer makes a transactional producer of the state to c.
func (s *KafkaStore) newProducer(c *storeCluster) (*kgo.Client, error) {
	return c.sec.NewClient(c.addrs, slices.Concat(c.opts, []kgo.Opt{
		kgo.RecordPartitioner(kgo.ManualPartitioner()), // Load reads partition 0
		kgo.ProducerBatchMaxBytes(maxStateBytes),
		kgo.TransactionalID(s.txnID),
		kgo.TransactionTimeout(storeTxnTimeout),
	})...)
}

// takeProducer returns the producer kept from the last write that
// committed, and true, or nil; the caller has it alone.
func (c *storeCluster) takeProducer() (*kgo.Client, bool) {
	c.keptMu.Lock()
	defer c.keptMu.Unlock()
	p := c.kept
	c.kept = nil
	return p, p != nil
}

// keepProducer keeps p for the next write, unless another is kept (two
// writes at once) or the store closed.
func (c *storeCluster) keepProducer(p *kgo.Client) {
	c.keptMu.Lock()
	if c.kept == nil && !c.keptClosed {
		c.kept, p = p, nil
	}
	c.keptMu.Unlock()
	if p != nil {
		p.Close()
	}
}

// closeKept closes the kept producer and keeps none from now on.
func (c *storeCluster) closeKept() {
	c.keptMu.Lock()
	p := c.kept
	c.kept = nil
	c.keptClosed = true
	c.keptMu.Unlock()
	if p != nil {
		p.Close()
	}
}

// Load returns the state of the highest generation found on the clusters it
// reaches, each read within the store's timeout. A cluster that cannot be read
// is logged and skipped; Load fails only when none can be read.
func (s *KafkaStore) Load(ctx context.Context) (State, bool, error) {
	results := s.readAll(ctx)

	var best *readResult
	var errs []error
	read := 0
	for i := range results {
		r := &results[i]
		if r.err != nil {
			s.log.Warn("the routing state could not be read from a cluster", zap.String("cluster", r.name), zap.Error(r.err))
			errs = append(errs, fmt.Errorf("cluster %q: %w", r.name, r.err))
			continue
		}
		read++
		if !r.found {
			continue
		}
		if voidedIn(results, r.st.Generation) {
			s.log.Warn("passing over a routing state whose generation a rollback voided", zap.String("cluster", r.name), zap.Stringer("routing", r.st))
			continue
		}
		switch {
		case best == nil || r.st.Generation > best.st.Generation:
			best = r
		case r.st.Generation == best.st.Generation:
			if r.st.Active != best.st.Active {
				// Never written so: a generation is saved once, by the
				// one switch that made it.
				s.log.Error("two clusters hold different states of the same generation; taking the later switch",
					zap.String("cluster", best.name), zap.Stringer("routing", best.st),
					zap.String("other_cluster", r.name), zap.Stringer("other_routing", r.st))
			}
			if finished(r.st).After(finished(best.st)) {
				best = r
			}
		}
	}
	if read == 0 {
		return State{}, false, fmt.Errorf("routing store: no cluster could be read: %w", errors.Join(errs...))
	}
	if best == nil {
		return State{}, false, nil
	}
	s.log.Info("routing state loaded", zap.String("cluster", best.name), zap.Stringer("routing", best.st))
	return best.st, true, nil
}

// LoadFrom returns the state saved on one cluster, read within the store's
// timeout (and ctx), and false when it holds none.
func (s *KafkaStore) LoadFrom(ctx context.Context, cluster string) (State, bool, error) {
	c := s.liveCluster(cluster)
	if c == nil {
		return State{}, false, fmt.Errorf("routing store: %q is not one of the clusters %v", cluster, s.liveNames())
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.read(cctx, c, -1)
}

func finished(st State) time.Time {
	if st.Last == nil {
		return time.Time{}
	}
	return st.Last.Finished
}

// read returns the last state committed for this virtual cluster on one
// cluster before offset before (before < 0: the last one). A missing topic
// holds no state. Retriable failures (no leader yet, a broker that does
// not answer, the log not yet stable up to before) are tried again until
// ctx ends.
func (s *KafkaStore) read(ctx context.Context, c *storeCluster, before int64) (State, bool, error) {
	wait := stableWait
	if dl, ok := ctx.Deadline(); ok {
		// Half the read's time at most: then what is committed is read.
		wait = min(wait, time.Until(dl)/2)
	}
	stableBy := time.Now().Add(wait)
	// A transaction's markers land a moment after its EndTxn is
	// answered: a read right after a write (the next switch's check of
	// a cluster the last save wrote) polls briefly, not a whole backoff.
	unstable := stableBackoff
	for {
		st, found, err := s.readOnce(ctx, c, before, time.Now().Before(stableBy))
		if err == nil || !retriable(err) {
			return st, found, err
		}
		backoff := retryBackoff
		if errors.Is(err, errNotStable) {
			backoff, unstable = unstable, min(2*unstable, retryBackoff)
		}
		select {
		case <-ctx.Done():
			return State{}, false, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(backoff):
		}
	}
}

// retriable reports whether an attempt to read or create the topic is worth
// repeating: a Kafka error that says so (or a log start that moved while it
// was read), or a failure to reach a broker.
func retriable(err error) bool {
	if errors.Is(err, errNotStable) {
		return true
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Retriable || ke == kerr.OffsetOutOfRange
	}
	return true
}

// errNotStable is a read before an offset that is not yet stable: a
// transaction opened before it has not ended.
var errNotStable = errors.New("the log is not yet stable up to the write")

// stableWait bounds how long a read waits for the log to be stable up to
// its end: a Save's transaction answered committed has its marker written
// by the coordinator a moment later, and a read in between would take the
// state before it (a member restarted right after a switch routing by the
// generation before; in CI, a fresh store finding nothing). A transaction
// a crashed Save left open is not waited for beyond it: the state before
// it is read, as the writer's fate is unknown.
const stableWait = 5 * time.Second

func (s *KafkaStore) readOnce(ctx context.Context, c *storeCluster, before int64, waitStable bool) (State, bool, error) {
	if pos := c.where.Load(); pos != nil {
		st, found, err := s.readFrom(ctx, c, pos, before, waitStable)
		if err == nil || errors.Is(err, errNotStable) || ctx.Err() != nil {
			return st, found, err
		}
		// The leader moved, the log start advanced, the topic was
		// recreated, or a connection broke: ask again, at once.
		c.where.Store(nil)
		c.log.Debug("reading the routing state where the last read did failed; asking where to read", zap.Error(err))
	}
	pos, err := s.locate(ctx, c)
	if err != nil || pos == nil {
		return State{}, false, err
	}
	st, found, err := s.readFrom(ctx, c, pos, before, waitStable)
	if err == nil && pos.topicID != ([16]byte{}) {
		c.where.Store(pos)
	}
	return st, found, err
}

// locate asks where the state topic's partition is led and where its log
// starts: nil when the topic is missing.
func (s *KafkaStore) locate(ctx context.Context, c *storeCluster) (*readPosition, error) {
	md, err := c.metadata(ctx, s.topic)
	if err != nil {
		return nil, err
	}
	if md.missing {
		return nil, nil
	}
	lreq := kmsg.NewPtrListOffsetsRequest()
	lreq.ReplicaID = -1
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = s.topic
	lp := kmsg.NewListOffsetsRequestTopicPartition()
	lp.Partition = 0
	lp.CurrentLeaderEpoch = -1
	lp.Timestamp = -2 // the log start
	lt.Partitions = append(lt.Partitions, lp)
	lreq.Topics = append(lreq.Topics, lt)
	lresp, err := lreq.RequestWith(ctx, c.cl.Broker(int(md.leader)))
	if err != nil {
		return nil, fmt.Errorf("ListOffsets: %w", err)
	}
	if len(lresp.Topics) != 1 || len(lresp.Topics[0].Partitions) != 1 {
		return nil, errors.New("ListOffsets: the answer does not name partition 0")
	}
	lpr := lresp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(lpr.ErrorCode); err != nil {
		return nil, fmt.Errorf("ListOffsets: %w", err)
	}
	return &readPosition{topicID: md.topicID, leader: md.leader, logStart: lpr.Offset}, nil
}

// readFrom reads the state from pos (readOnce). A log start that has
// moved past pos's fails the first fetch (OFFSET_OUT_OF_RANGE): log
// starts only advance, and a topic recreated has another ID.
func (s *KafkaStore) readFrom(ctx context.Context, c *storeCluster, pos *readPosition, before int64, waitStable bool) (State, bool, error) {
	leader := c.cl.Broker(int(pos.leader))
	// From the log start to the last stable offset the first fetch
	// reports, committed records only (a write that was refused, fenced
	// or abandoned is never read: writeIf): the topic is compacted and
	// holds a record per virtual cluster, so this is a fetch or two.
	var st State
	found := false
	at, end := pos.logStart, int64(-1)
	for end < 0 || at < end {
		rp, err := c.fetch(ctx, leader, s.topic, pos.topicID, at)
		if err != nil {
			return State{}, false, err
		}
		if end < 0 {
			end = rp.LastStableOffset
			if before >= 0 {
				if end < before {
					return State{}, false, errNotStable
				}
				end = before
			} else if waitStable && end < rp.HighWatermark {
				return State{}, false, errNotStable
			}
		}
		fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: at, Topic: s.topic, Partition: 0, IsolationLevel: kgo.ReadCommitted()}, rp, kgo.DefaultDecompressor(), nil)
		if fp.Err != nil {
			return State{}, false, fmt.Errorf("fetch at %d: %w", at, fp.Err)
		}
		for _, r := range fp.Records {
			if r.Offset >= end || string(r.Key) != string(s.key) {
				continue
			}
			if r.Value == nil {
				// A tombstone: someone deleted the state.
				st, found = State{}, false
				continue
			}
			v, err := decodeState(r.Value)
			if err != nil {
				c.log.Error("ignoring a routing state record that does not decode", zap.Int64("offset", r.Offset), zap.Error(err))
				continue
			}
			st, found = v, true
		}
		if at >= end {
			break
		}
		if next <= at {
			return State{}, false, fmt.Errorf("fetch at %d (high watermark %d) brought nothing", at, end)
		}
		at = next
	}
	return st, found, nil
}

func decodeState(v []byte) (State, error) {
	var w storedState
	if err := json.Unmarshal(v, &w); err != nil {
		return State{}, err
	}
	if w.Format != storeFormat {
		return State{}, fmt.Errorf("format %d, this Ferry reads %d", w.Format, storeFormat)
	}
	if w.State.Active == "" {
		return State{}, errors.New("no active cluster")
	}
	return w.State, nil
}

// topicMeta is what one cluster's metadata says of the state topic.
type topicMeta struct {
	missing bool
	topicID [16]byte
	leader  int32 // of partition 0
	brokers int
}

// metadata asks for the topic, uncached: right after its creation the
// client's cache may still say it is missing.
func (c *storeCluster) metadata(ctx context.Context, topic string) (topicMeta, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil {
		return topicMeta{}, fmt.Errorf("Metadata: %w", err)
	}
	md := topicMeta{brokers: len(resp.Brokers), leader: -1}
	if len(resp.Topics) != 1 {
		return topicMeta{}, fmt.Errorf("Metadata: %d topics in the answer, want 1", len(resp.Topics))
	}
	t := resp.Topics[0]
	if t.ErrorCode == kerr.UnknownTopicOrPartition.Code {
		md.missing = true
		return md, nil
	}
	if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
		return topicMeta{}, fmt.Errorf("Metadata of %s: %w", topic, err)
	}
	md.topicID = t.TopicID
	for _, p := range t.Partitions {
		if p.Partition != 0 {
			continue
		}
		if err := kerr.ErrorForCode(p.ErrorCode); err != nil && p.Leader < 0 {
			return topicMeta{}, fmt.Errorf("Metadata of %s[0]: %w", topic, err)
		}
		if p.Leader < 0 {
			return topicMeta{}, fmt.Errorf("Metadata of %s[0]: %w", topic, kerr.LeaderNotAvailable)
		}
		md.leader = p.Leader
		return md, nil
	}
	return topicMeta{}, fmt.Errorf("Metadata of %s: no partition 0: %w", topic, kerr.UnknownTopicOrPartition)
}

func (c *storeCluster) fetch(ctx context.Context, leader *kgo.Broker, topic string, id [16]byte, at int64) (*kmsg.FetchResponseTopicPartition, error) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0 // never wait for more: an empty topic answers at once
	req.MaxBytes = 2 * maxStateBytes
	req.SessionEpoch = -1  // no fetch session
	req.IsolationLevel = 1 // read committed (writeIf)
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic // up to v12
	rt.TopicID = id  // from v13
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = 0
	rp.FetchOffset = at
	rp.CurrentLeaderEpoch = -1
	rp.LastFetchedEpoch = -1
	rp.LogStartOffset = -1
	rp.PartitionMaxBytes = 2 * maxStateBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, leader)
	if err != nil {
		return nil, fmt.Errorf("Fetch: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("Fetch: %w", err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return nil, errors.New("Fetch: the answer does not name partition 0")
	}
	p := &resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		return nil, fmt.Errorf("Fetch at %d: %w", at, err)
	}
	return p, nil
}

// topicSettings are the state topic's replication factor and
// min.insync.replicas on a cluster of the given size: three copies where
// there are three brokers, and a write acknowledged by two of them, so that
// one broker down neither loses the state nor stops a switch.
func topicSettings(brokers int) (rf int16, minISR int) {
	rf = int16(min(3, max(brokers, 1)))
	return rf, min(2, int(rf))
}

// ensureTopic creates the topic if it is missing and returns once partition 0
// has a leader. Another member may be creating it at the same time.
func (c *storeCluster) ensureTopic(ctx context.Context, topic string) error {
	if c.ready.Load() {
		return nil
	}
	select {
	case c.ensuring <- struct{}{}:
		defer func() { <-c.ensuring }()
	case <-ctx.Done():
		return fmt.Errorf("%w (another call was making sure of the topic)", ctx.Err())
	}
	created := false
	for {
		if c.ready.Load() {
			return nil // made ready meanwhile
		}
		md, err := c.metadata(ctx, topic)
		switch {
		case err == nil && !md.missing:
			c.ready.Store(true)
			return nil
		case err == nil && !created:
			if err = c.create(ctx, topic, md.brokers); err == nil {
				created = true
				continue
			}
		}
		// Missing still (brokers learn of a new topic a moment after
		// CreateTopics answers), or a failure.
		if err != nil && !retriable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = kerr.UnknownTopicOrPartition
			}
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(retryBackoff):
		}
	}
}

func (c *storeCluster) create(ctx context.Context, topic string, brokers int) error {
	rf, minISR := topicSettings(brokers)
	configs := map[string]*string{
		"cleanup.policy":      kmsg.StringPtr("compact"),
		"min.insync.replicas": kmsg.StringPtr(strconv.Itoa(minISR)),
		"max.message.bytes":   kmsg.StringPtr(strconv.Itoa(maxStateBytes)),
	}
	resp, err := kadm.NewClient(c.cl).CreateTopic(ctx, 1, rf, configs, topic)
	if err == nil {
		err = resp.Err
	}
	switch {
	case err == nil:
		c.log.Info("created the routing state topic", zap.Int16("replication_factor", rf), zap.Int("min_insync_replicas", minISR))
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return nil // another member created it meanwhile
	default:
		return fmt.Errorf("creating %s: %w", topic, err)
	}
}
