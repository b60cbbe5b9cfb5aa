package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/routing"
)

// mirrorRunner owns the member's mirror: at most one mirror.Mirror at a
// time, from one configured cluster to the other. Follow points it the way
// the routing state says (active → standby); Stop stops it. The switchover
// stops it while the clusters trade places and follows the new state
// after; nothing here knows about switchovers.
//
// Each mirror registers its ferry_mirror_* metrics on the member's registry
// through a registerer that remembers them, so that Stop can unregister
// them and the next mirror (the other way round) can register its own.
type mirrorRunner struct {
	log      *zap.Logger
	reg      prometheus.Registerer
	clusters map[string][]string              // name → bootstrap
	opts     []mirror.Option                  // from the mirror section of the config
	security map[string]*clusterauth.Security // by cluster name; nil entries: plaintext

	// routes, when set, is the member's routing state: the sync loop of a
	// mirror whose source is not the active cluster writes nothing
	// (mirror.WithSyncGate).
	routes func() routing.State
	// gate is the write gate given to newMirrorRunner (nil: always open).
	gate func() bool

	mu     sync.Mutex // serialises Start, Stop and Close; guards closed
	closed bool
	cur    atomic.Pointer[runningMirror] // written under mu; read without it

	// listers list end offsets when a switch stops the mirror
	// (positions), one client per cluster, kept between switches and
	// warmed by each drain (warmListers): a client made at the stop cost
	// a connection and a metadata request first, four round trips to a
	// cluster a region away, with every write held.
	listersMu     sync.Mutex
	listers       map[string]*kgo.Client
	listersClosed bool
	warming       atomic.Bool
}

// runningMirror is one mirror.Mirror and the goroutine running it.
type runningMirror struct {
	m              *mirror.Mirror
	source, target string
	metrics        *trackingRegisterer
	cancel         context.CancelFunc
	done           chan struct{} // closed when Run returned
}

// newMirrorRunner returns the member's mirror runner; secs is each
// cluster's TLS and SASL (config.security), own says which partitions this
// member writes and gate when it may append (both nil: a member on its own
// writes every partition, always).
func newMirrorRunner(cfg *Config, log *zap.Logger, reg prometheus.Registerer, secs map[string]*clusterauth.Security, own mirror.Ownership, gate func() bool) *mirrorRunner {
	r := &mirrorRunner{log: log, reg: reg, clusters: map[string][]string{}, security: secs, gate: gate}
	for _, c := range cfg.Clusters {
		r.clusters[c.Name] = c.Bootstrap
	}
	mc := cfg.Mirror
	r.opts = []mirror.Option{
		// The filters first: SetFilters replaces them.
		mirror.Topics(mc.Topics.Include, mc.Topics.Exclude),
		mirror.Groups(mc.Groups.Include, mc.Groups.Exclude),
		mirror.SyncInterval(mc.SyncInterval),
		mirror.InFlight(mc.InFlight),
		mirror.ConnectionBudget(mirrorConnBudget(mc.MaxConnections, fdLimit())),
		mirror.SyncGroups(*mc.SyncGroups),
		mirror.SyncACLs(*mc.SyncACLs),
		mirror.RecompressCompacted(*mc.RecompressCompacted),
	}
	if own != nil {
		r.opts = append(r.opts, mirror.WithOwnership(own))
	}
	if gate != nil {
		r.opts = append(r.opts, mirror.WithWriteGate(gate))
	}
	return r
}

// mirrorConnBudget is the mirror's connection budget: configured, or a
// quarter of the descriptor limit (clients and the proxy's broker
// connections need the rest), or none when the limit is unknown.
func mirrorConnBudget(configured int, fds uint64) int {
	if configured > 0 {
		return configured
	}
	return int(min(fds/4, 1<<30))
}

// client builds a franz-go client of the named cluster, with its TLS and
// SASL.
func (r *mirrorRunner) client(cluster string, opts ...kgo.Opt) (*kgo.Client, error) {
	return r.security[cluster].NewClient(r.clusters[cluster], opts...)
}

// standbyOf returns the configured cluster that is not active.
func (r *mirrorRunner) standbyOf(active string) (string, error) {
	if _, ok := r.clusters[active]; !ok {
		return "", fmt.Errorf("mirror: active cluster %q is not configured", active)
	}
	for name := range r.clusters {
		if name != active {
			return name, nil
		}
	}
	return "", errors.New("mirror: no standby cluster configured")
}

// Follow makes the mirror run from the routing state's active cluster to
// the other one: it does nothing if it already does, and otherwise stops
// the current mirror (if any) and starts one in that direction.
func (r *mirrorRunner) Follow(st routing.State) error {
	target, err := r.standbyOf(st.Active)
	if err != nil {
		return err
	}
	return r.Start(st.Active, target)
}

// Start runs a mirror from source to target (cluster names), stopping one
// that runs in another direction first.
func (r *mirrorRunner) Start(source, target string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return mirror.ErrClosed
	}
	if c := r.cur.Load(); c != nil {
		if c.source == source && c.target == target {
			return nil
		}
		r.stopLocked()
	}
	return r.startLocked(source, target)
}

// startLocked starts a mirror from source to target; r.mu is held and none
// runs.
func (r *mirrorRunner) startLocked(source, target string) error {
	src, ok1 := r.clusters[source]
	dst, ok2 := r.clusters[target]
	if !ok1 || !ok2 || source == target {
		return fmt.Errorf("mirror: cannot mirror %q to %q: two different configured clusters are needed", source, target)
	}
	tr := &trackingRegisterer{reg: r.reg}
	// "from" and "to": the mirror's own lines carry "source" and "target"
	// (bootstrap addresses).
	log := r.log.With(zap.String("from", source), zap.String("to", target))
	m, err := mirror.New(append([]mirror.Option{
		mirror.WithSyncGate(r.syncGate(source)),
		mirror.WithGroupSyncGate(r.groupSyncGate()),
		mirror.Source(src...),
		mirror.Target(dst...),
		mirror.SourceSecurity(r.security[source]),
		mirror.TargetSecurity(r.security[target]),
		mirror.Logger(log),
		mirror.Registerer(tr),
	}, r.opts...)...)
	if err != nil {
		tr.unregisterAll()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &runningMirror{m: m, source: source, target: target, metrics: tr, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if err := m.Run(ctx); err != nil && !errors.Is(err, mirror.ErrClosed) && !errors.Is(err, context.Canceled) {
			log.Error("mirror stopped", zap.Error(err))
		}
	}()
	r.cur.Store(c)
	log.Info("mirror started")
	return nil
}

// syncGate is the sync gate of a mirror from source: open while source is
// the active cluster (after a switch's install it is not, until this
// mirror stops), no switch is flipping and, in a fleet, the write gate is
// open (a member paused or restarted through a switch may still mirror
// the old direction, its lease lapsed). A draining switch keeps it open:
// the target is still the standby, and the drain may need the topics the
// sync creates there.
func (r *mirrorRunner) syncGate(source string) func() bool {
	return func() bool {
		if r.routes != nil {
			if st := r.routes(); st.Active != source || st.Phase == routing.PhaseSwitching {
				return false
			}
		}
		return r.gate == nil || r.gate()
	}
}

// groupSyncGate is the gate of the periodic copy of group offsets: shut
// while a switch runs (it copies them itself, commits held; a round that
// read the source's offsets before the hold would write them over its
// copy, and the group would resume below its commits).
func (r *mirrorRunner) groupSyncGate() func() bool {
	return func() bool { return r.routes == nil || r.routes().Phase == routing.PhaseServing }
}

// SetFilters changes the topics mirrored and the groups whose offsets are
// copied (a configuration reload). A running mirror is restarted in the
// same direction to take them: its writers stop between appends and the
// new one resumes each partition at the standby's end offset, so nothing
// is copied twice or skipped. A topic taken out of the selection keeps
// what was copied of it.
func (r *mirrorRunner) SetFilters(topics, groups Selection) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return mirror.ErrClosed
	}
	r.opts[0] = mirror.Topics(topics.Include, topics.Exclude)
	r.opts[1] = mirror.Groups(groups.Include, groups.Exclude)
	c := r.cur.Load()
	if c == nil {
		return nil
	}
	r.stopLocked()
	return r.startLocked(c.source, c.target)
}

// Stop stops the mirror, if one runs, and waits until it has; its metrics
// are unregistered. Safe to call when none runs.
func (r *mirrorRunner) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked()
}

// stopLocked stops the current mirror, in order: close it (which ends Run,
// stops every partition writer and closes its clients), wait for Run's
// goroutine, then unregister its metrics.
func (r *mirrorRunner) stopLocked() {
	c := r.cur.Swap(nil)
	if c == nil {
		return
	}
	c.m.Close()
	c.cancel()
	<-c.done
	c.metrics.unregisterAll()
	r.log.Info("mirror stopped", zap.String("from", c.source), zap.String("to", c.target))
}

// Close stops the mirror and refuses to start another; safe to call more
// than once.
func (r *mirrorRunner) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	r.stopLocked()
	r.listersMu.Lock()
	r.listersClosed = true
	for _, cl := range r.listers {
		cl.Close()
	}
	r.listers = nil
	r.listersMu.Unlock()
}

// lister returns cluster's lister client (listers), made at the first
// call.
func (r *mirrorRunner) lister(cluster string) (*kgo.Client, error) {
	r.listersMu.Lock()
	defer r.listersMu.Unlock()
	if r.listersClosed {
		return nil, mirror.ErrClosed
	}
	if cl := r.listers[cluster]; cl != nil {
		return cl, nil
	}
	cl, err := r.client(cluster, kgo.ClientID("ferry-switch"))
	if err != nil {
		return nil, err
	}
	if r.listers == nil {
		r.listers = map[string]*kgo.Client{}
	}
	r.listers[cluster] = cl
	return cl, nil
}

// warmListers has the listers of the running mirror's two clusters ask
// for the mirrored topics' metadata, in the background: their
// connections open and the leaders known (kgo keeps them for a few
// seconds) when the switch's stop lists the ends. One warm at a time.
func (r *mirrorRunner) warmListers() {
	c := r.cur.Load()
	if c == nil || !r.warming.CompareAndSwap(false, true) {
		return
	}
	topics := map[string]bool{}
	for _, st := range c.m.Status() {
		topics[st.Topic] = true
	}
	if len(topics) == 0 {
		r.warming.Store(false) // nothing to warm; a request naming no topic would ask for all
		return
	}
	go func() {
		defer r.warming.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, cluster := range []string{c.source, c.target} {
			cl, err := r.lister(cluster)
			if err != nil {
				continue
			}
			wg.Go(func() {
				req := kmsg.NewPtrMetadataRequest()
				for t := range topics {
					rt := kmsg.NewMetadataRequestTopic()
					rt.Topic = kmsg.StringPtr(t)
					req.Topics = append(req.Topics, rt)
				}
				if _, err := req.RequestWith(ctx, cl); err != nil {
					r.log.Debug("warming the switch's listing of end offsets", zap.String("cluster", cluster), zap.Error(err))
				}
			})
		}
		wg.Wait()
	}()
}

// Info is the mirror as /status reports it. It never waits for a Start or
// Stop in progress: a mirror being stopped is already reported stopped.
func (r *mirrorRunner) Info() admin.MirrorInfo {
	info := admin.MirrorInfo{Enabled: true}
	if c := r.cur.Load(); c != nil {
		info.Running, info.Source, info.Target = true, c.source, c.target
		info.Partitions = c.m.Status()
	}
	return info
}

// WaitCaughtUp waits until the running mirror has copied everything the
// source held when it was called (see mirror.Mirror.WaitCaughtUp). It
// fails at once when no mirror runs.
func (r *mirrorRunner) WaitCaughtUp(ctx context.Context, topics ...string) error {
	c := r.cur.Load()
	if c == nil {
		return errors.New("mirror: not running")
	}
	return c.m.WaitCaughtUp(ctx, topics...)
}

// trackingRegisterer registers collectors on reg and remembers them, so
// that they can all be unregistered when their mirror stops.
type trackingRegisterer struct {
	reg prometheus.Registerer
	mu  sync.Mutex
	cs  []prometheus.Collector
}

var _ prometheus.Registerer = (*trackingRegisterer)(nil)

func (t *trackingRegisterer) Register(c prometheus.Collector) error {
	if err := t.reg.Register(c); err != nil {
		return err
	}
	t.mu.Lock()
	t.cs = append(t.cs, c)
	t.mu.Unlock()
	return nil
}

func (t *trackingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			panic(err)
		}
	}
}

func (t *trackingRegisterer) Unregister(c prometheus.Collector) bool {
	t.mu.Lock()
	for i, have := range t.cs {
		if have == c {
			t.cs = append(t.cs[:i], t.cs[i+1:]...)
			break
		}
	}
	t.mu.Unlock()
	return t.reg.Unregister(c)
}

func (t *trackingRegisterer) unregisterAll() {
	t.mu.Lock()
	cs := t.cs
	t.cs = nil
	t.mu.Unlock()
	for _, c := range cs {
		t.reg.Unregister(c)
	}
}
