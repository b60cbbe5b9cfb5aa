package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// maxHandlers bounds the handlers running at once for calls from other
// members of the kinds set by Handle; maxControlHandlers, apart, those of
// the kinds set by HandleControl, so that a switch's hold or install never
// waits behind (nor is refused for) transactional forwarding. A request
// beyond its lane's bound is answered busy (ErrBusy) at once.
const (
	maxHandlers        = 64
	maxControlHandlers = 16
)

// Fleet is this member's view of the fleet of Ferry processes, and its way
// to call them.
type Fleet struct {
	cfg     Config
	log     *zap.Logger
	metrics *metrics
	name    string // node name: the node ID in decimal
	id      int32

	ml       *memberlist.Memberlist
	up       atomic.Bool // ml is set: messages may be served
	live     liveness
	selfAddr string // advertised gossip host:port
	selfIP   net.IP
	bindIP   net.IP
	ports    [2]int // advertised and bound gossip ports
	refresh  time.Duration

	updMu sync.Mutex // orders SetGeneration's meta updates

	mu       sync.Mutex
	meta     Meta
	metaJSON []byte
	view     map[string]viewEntry // from memberlist's events, for the delegates
	ready    bool
	reason   string
	changed  chan struct{}
	handlers map[string]Handler
	control  map[string]bool // kinds served on the control lane
	closed   bool

	pendMu  sync.Mutex
	pending map[uint64]pendingCall
	nextID  atomic.Uint64
	sem     chan struct{}  // the lane of the kinds set by Handle
	ctlSem  chan struct{}  // the lane of the kinds set by HandleControl
	serving sync.WaitGroup // handler goroutines, added to under mu while !closed

	running atomic.Bool
	kick    chan struct{} // an event happened: the watcher looks again
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	watched chan struct{} // closed when the watcher has stopped

	closeOnce sync.Once
	closeErr  error
}

// New starts gossiping on cfg.Bind (so that others can join this member)
// but joins no one: Run does.
func New(cfg Config, meta Meta, log *zap.Logger, reg prometheus.Registerer) (*Fleet, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if err := meta.Validate(); err != nil {
		return nil, fmt.Errorf("membership: %v", err)
	}
	cfg = cfg.withDefaults()
	meta = meta.clone()
	meta.Heartbeats = true
	name := strconv.Itoa(int(meta.NodeID))
	mc, err := memberlistConfig(cfg, name)
	if err != nil {
		return nil, fmt.Errorf("membership: %v", err)
	}
	mx, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("membership: metrics: %v", err)
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("membership: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{
		cfg:      cfg,
		log:      log,
		metrics:  mx,
		name:     name,
		id:       meta.NodeID,
		meta:     meta,
		metaJSON: metaJSON,
		view:     make(map[string]viewEntry),
		reason:   "not joined to the fleet yet",
		changed:  make(chan struct{}),
		handlers: make(map[string]Handler),
		pending:  make(map[uint64]pendingCall),
		control:  make(map[string]bool),
		sem:      make(chan struct{}, maxHandlers),
		ctlSem:   make(chan struct{}, maxControlHandlers),
		kick:     make(chan struct{}, 1),
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
		watched:  make(chan struct{}),
		refresh:  mc.ProbeInterval / 2,
		live:     newLiveness(mc),
	}
	f.nextID.Store(randomID())
	d := delegate{f}
	mc.Delegate, mc.Events, mc.Merge, mc.Alive = d, d, d, d
	mc.Logger = newMemberlistLogger(log.Named("memberlist"))
	ml, err := memberlist.Create(mc)
	if err != nil {
		cancel()
		if strings.Contains(err.Error(), "address already in use") {
			return nil, fmt.Errorf("%w: gossip address %s is already in use (another Ferry member on this host? give each its own gossip port)", ErrBind, cfg.Bind)
		}
		return nil, fmt.Errorf("membership: gossip on %s: %v", cfg.Bind, err)
	}
	f.ml = ml
	local := ml.LocalNode()
	f.selfAddr, f.selfIP = local.Address(), local.Addr
	f.bindIP = net.ParseIP(mc.BindAddr)
	f.ports = [2]int{int(local.Port), mc.BindPort} // memberlist wrote the port it picked for 0
	f.up.Store(true)
	go f.watch()
	go f.heartbeats()
	log.Info("gossiping", zap.String("addr", f.selfAddr), zap.Int32("node_id", f.id),
		zap.Bool("encrypted", cfg.Key != nil), zap.Strings("seeds", cfg.Seeds))
	return f, nil
}

// Run joins the seeds, retrying with a growing wait while none lets this
// member in, then keeps looking for seeds that are not among the live
// members and joins them again (this heals a partition that outlasted
// memberlist's gossip to the dead). Without seeds this member is the first
// of the fleet. Run returns when ctx ends or Close is called.
func (f *Fleet) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errors.New("membership: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(f.ctx, cancel)
	defer stop()

	if len(f.cfg.Seeds) == 0 {
		f.setReady(true, "")
		f.log.Info("first member of the fleet (no seeds)")
	} else if !f.joinLoop(ctx) {
		return nil
	}
	t := time.NewTicker(f.cfg.RejoinInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		before := len(f.Alive())
		n, tried, _, err := f.joinSeeds(ctx)
		switch {
		case n > 0 && len(f.Alive()) > before:
			f.log.Info("joined seeds that were not live members (a partition healed, or they came back)",
				zap.Strings("seeds", tried), zap.Int("members", len(f.Alive())))
		case n > 0:
			// A seed address that is no member's gossip address (a
			// load balancer, NAT): a push/pull with whoever is behind it.
			f.log.Debug("joined seeds again", zap.Strings("seeds", tried))
		case err != nil && ctx.Err() == nil:
			f.log.Debug("seeds that are not live members are still unreachable", zap.Strings("seeds", tried), zap.Error(err))
		}
	}
}

// joinLoop joins the seeds, backing off, until one lets this member in or
// another member joined it. It returns false if ctx ended first.
func (f *Fleet) joinLoop(ctx context.Context) bool {
	wait := f.cfg.JoinBackoff
	for attempt := 1; ; attempt++ {
		n, tried, onlySelf, err := f.joinSeeds(ctx)
		switch {
		case ctx.Err() != nil:
			return false
		case n > 0:
			f.setReady(true, "")
			f.log.Info("joined the fleet", zap.Strings("seeds", tried), zap.Int("joined", n), zap.Int("members", len(f.Alive())))
			return true
		case onlySelf:
			f.setReady(true, "")
			f.log.Info("first member of the fleet (the seeds name only this member)")
			return true
		case f.othersLive():
			f.setReady(true, "")
			f.log.Info("joined the fleet (another member joined this one)", zap.Int("members", len(f.Alive())))
			return true
		}
		if err == nil {
			err = errors.New("the seeds resolve to no address")
		}
		reason := "not joined to the fleet: " + err.Error()
		f.setReady(false, reason)
		f.log.Warn("cannot join the fleet yet; retrying", zap.String("reason", reason),
			zap.Strings("seeds", f.cfg.Seeds), zap.Int("attempt", attempt), zap.Duration("retry_in", wait))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, f.cfg.JoinBackoffMax)
	}
}

// joinSeeds joins the seeds' addresses that are neither this member nor a
// live member. tried is the addresses it tried; onlySelf says the seeds
// named no one but this member.
func (f *Fleet) joinSeeds(ctx context.Context) (n int, tried []string, onlySelf bool, err error) {
	addrs, self, err := f.resolveSeeds(ctx)
	if len(addrs) == 0 {
		return 0, nil, self && err == nil, err
	}
	live := make(map[string]bool)
	for _, e := range f.table() {
		if e.state == Alive || e.state == Suspect {
			live[e.node.Address()] = true
		}
	}
	for _, a := range addrs {
		if !live[a] {
			tried = append(tried, a)
		}
	}
	if len(tried) == 0 {
		return 0, nil, false, nil
	}
	type result struct {
		n   int
		err error
	}
	ch := make(chan result, 1)
	// Join does not take a context: it is left to finish on its own (each
	// address bounded by the TCP timeout).
	go func() {
		n, err := f.ml.Join(tried)
		ch <- result{n, err}
	}()
	select {
	case r := <-ch:
		return r.n, tried, false, flatten(r.err)
	case <-ctx.Done():
		return 0, tried, false, ctx.Err()
	}
}

// resolveSeeds resolves the seeds to host:port addresses, without this
// member's own. self says one of them was this member.
func (f *Fleet) resolveSeeds(ctx context.Context) (addrs []string, self bool, err error) {
	var errs []string
	seen := make(map[string]bool)
	for _, s := range f.cfg.Seeds {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			errs = append(errs, fmt.Sprintf("seed %q: %v", s, err))
			continue
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			errs = append(errs, fmt.Sprintf("seed %s: %v", s, err))
			continue
		}
		for _, ip := range ips {
			a := net.JoinHostPort(ip, port)
			switch {
			case f.isSelf(ip, port):
				self = true
			case !seen[a]:
				seen[a] = true
				addrs = append(addrs, a)
			}
		}
	}
	if len(errs) > 0 {
		err = errors.New(strings.Join(errs, "; "))
	}
	return addrs, self, err
}

func (f *Fleet) isSelf(host, port string) bool {
	p, err := strconv.Atoi(port)
	ip := net.ParseIP(host)
	if err != nil || ip == nil || (p != f.ports[0] && p != f.ports[1]) {
		return false
	}
	if ip.Equal(f.selfIP) || ip.Equal(f.bindIP) {
		return true
	}
	if f.bindIP == nil || p != f.ports[1] {
		return false
	}
	// "localhost" resolves to 127.0.0.1 and ::1: both are this member
	// when it listens on a loopback address or all of them.
	if ip.IsLoopback() && (f.bindIP.IsLoopback() || f.bindIP.IsUnspecified()) {
		return true
	}
	if !f.bindIP.IsUnspecified() {
		return false
	}
	ifAddrs, _ := net.InterfaceAddrs()
	for _, a := range ifAddrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// flatten turns memberlist's multi-line multierror into one line.
func flatten(err error) error {
	var me interface{ WrappedErrors() []error }
	if err == nil || !errors.As(err, &me) {
		return err
	}
	var parts []string
	for _, e := range me.WrappedErrors() {
		parts = append(parts, e.Error())
	}
	return errors.New(strings.Join(parts, "; "))
}

func (f *Fleet) othersLive() bool {
	for _, e := range f.table() {
		if e.node.Name != f.name && (e.state == Alive || e.state == Suspect) {
			return true
		}
	}
	return false
}

func (f *Fleet) setReady(ready bool, reason string) {
	f.mu.Lock()
	f.ready, f.reason = ready, reason
	f.mu.Unlock()
}

// Ready says whether this member has joined the fleet (or is its first
// member), and if not, why (for /readyz). Once joined it stays ready: a
// member cut off from the others still serves its clients.
func (f *Fleet) Ready() (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false, "left the fleet"
	}
	return f.ready, f.reason
}

// Local is this member.
func (f *Fleet) Local() Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := Alive
	if f.closed {
		st = Left
	}
	return Member{Meta: f.meta.clone(), Addr: f.selfAddr, State: st, Self: true}
}

// Members is every member this member knows (alive, suspect, dead, left:
// memberlist forgets dead and left ones after GossipToTheDeadTime), sorted
// by node ID.
func (f *Fleet) Members() []Member {
	es := f.table()
	out := make([]Member, 0, len(es))
	for _, e := range es {
		meta, err := parseMeta(e.node.Name, e.node.Meta)
		if err != nil {
			continue // NotifyAlive lets no such node in
		}
		out = append(out, Member{Meta: meta, Addr: e.node.Address(), State: e.state, Self: e.node.Name == f.name})
	}
	slices.SortFunc(out, func(a, b Member) int { return int(a.NodeID) - int(b.NodeID) })
	return out
}

// Alive is the members in state Alive, sorted by node ID.
func (f *Fleet) Alive() []Member {
	return slices.DeleteFunc(f.Members(), func(m Member) bool { return m.State != Alive })
}

// member is the node of a live (alive or suspect) member.
func (f *Fleet) member(id int32) (memberlist.Node, bool) {
	name := strconv.Itoa(int(id))
	for _, e := range f.table() {
		if e.node.Name == name && (e.state == Alive || e.state == Suspect) {
			return e.node, true
		}
	}
	return memberlist.Node{}, false
}

// Changed returns a channel that is closed at the next change of
// membership, of a member's state or of its metadata (this member's
// included). Call it again for the change after.
func (f *Fleet) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *Fleet) notifyChanged() {
	f.mu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// watch closes Changed when the table changes. Events and messages wake
// it; the ticker catches what nothing announces (a member's heartbeats
// stopping).
func (f *Fleet) watch() {
	defer close(f.watched)
	t := time.NewTicker(f.refresh)
	defer t.Stop()
	last := "" // the first look sets it without a change to announce
	for first := true; ; first = false {
		ms := f.Members()
		var sb strings.Builder
		for _, m := range ms {
			fmt.Fprintf(&sb, "%d|%s|%d|%d|%s|%v|%s|%s\n", m.NodeID, m.Addr, m.State, m.Generation, m.Host, m.Ports, m.Admin, m.Version)
		}
		if sig := sb.String(); sig != last {
			last = sig
			f.metrics.setMembers(ms)
			if !first {
				f.notifyChanged()
			}
		}
		select {
		case <-f.done:
			return
		case <-f.kick:
		case <-t.C:
		}
	}
}

// ErrBind is wrapped by New's error when the gossip address is taken.
var ErrBind = errors.New("membership: gossip address in use")

// SetGeneration sets the routing generation this member serves and
// gossips it.
func (f *Fleet) SetGeneration(g uint32) {
	f.update(func(m *Meta) { m.Generation = g })
}

// SetStarting says whether this member decides automatic failovers yet
// (Meta.Starting) and gossips it.
func (f *Fleet) SetStarting(starting bool) {
	f.update(func(m *Meta) { m.Starting = starting })
}

// SetPorts sets the client ports this member advertises (its lanes, once
// they are bound) and gossips them. Ports that would make the metadata too
// large are refused.
func (f *Fleet) SetPorts(ports []int32) error {
	next := f.Local().Meta
	next.Ports = append([]int32(nil), ports...)
	if err := next.Validate(); err != nil {
		return fmt.Errorf("membership: %v", err)
	}
	f.update(func(m *Meta) { m.Ports = next.Ports })
	return nil
}

// update changes the local metadata and gossips it.
func (f *Fleet) update(change func(*Meta)) {
	f.updMu.Lock()
	defer f.updMu.Unlock()
	f.mu.Lock()
	change(&f.meta)
	f.metaJSON, _ = json.Marshal(f.meta) // Validate checked its size
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return
	}
	// UpdateNode applies the new metadata and queues its broadcast before
	// it waits for the broadcast to go out; the broadcast goes on after the
	// wait, so there is no need to wait.
	_ = f.ml.UpdateNode(time.Nanosecond)
}

// Close leaves the fleet (waiting at most LeaveTimeout for the others to
// hear it) and stops gossiping. Handlers still running get their context
// cancelled. Calling it again does nothing.
func (f *Fleet) Close() error { return f.stop(true) }

// stop is Close; without leave it is a crash as the others see it (tests).
func (f *Fleet) stop(leave bool) error {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		f.closed = true // no handler starts after this
		f.mu.Unlock()
		f.cancel()
		close(f.done)
		if leave {
			f.sayLeaving(f.cfg.LeaveTimeout / 2)
			if err := f.ml.Leave(f.cfg.LeaveTimeout); err != nil {
				f.log.Warn("leaving the fleet", zap.Error(err))
			}
		}
		f.closeErr = f.ml.Shutdown()
		<-f.watched
		served := make(chan struct{})
		go func() { f.serving.Wait(); close(served) }()
		select {
		case <-served:
		case <-time.After(f.cfg.LeaveTimeout):
			f.log.Warn("fleet call handlers still running after Close")
		}
		f.notifyChanged()
		f.log.Info("left the fleet")
	})
	return f.closeErr
}

// delegate is the Fleet as memberlist's delegates. Apart from NotifyMsg,
// memberlist calls them holding its node lock (or about to take it): they
// must neither block nor call memberlist.
type delegate struct{ f *Fleet }

func (d delegate) NodeMeta(limit int) []byte {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	if len(d.f.metaJSON) > limit {
		return nil // Validate makes this impossible
	}
	return d.f.metaJSON
}

func (d delegate) NotifyMsg(b []byte) { d.f.onMessage(b) }

func (d delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d delegate) LocalState(join bool) []byte                { return nil }
func (d delegate) MergeRemoteState(buf []byte, join bool)     {}

func (d delegate) NotifyJoin(n *memberlist.Node)   { d.f.see(n, false) }
func (d delegate) NotifyUpdate(n *memberlist.Node) { d.f.see(n, false) }
func (d delegate) NotifyLeave(n *memberlist.Node)  { d.f.see(n, true) }

// NotifyMerge refuses a join (either side's) that would bring in a live
// member whose node ID a live member at another address holds, or a node
// that is not a Ferry member.
func (d delegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, p := range peers {
		if p.State != memberlist.StateAlive && p.State != memberlist.StateSuspect {
			continue
		}
		// memberlist logs the refusal on the side that was joined, and
		// the joiner's Join fails with it (Run logs it, Ready says it).
		if err := d.f.admit(p); err != nil {
			return err
		}
	}
	return nil
}

// NotifyAlive does the same for news of a member gossiped later.
// memberlist logs the refusal.
func (d delegate) NotifyAlive(p *memberlist.Node) error { return d.f.admit(p) }

func (f *Fleet) admit(p *memberlist.Node) error {
	if _, err := parseMeta(p.Name, p.Meta); err != nil {
		return err
	}
	f.mu.Lock()
	e, ok := f.view[p.Name]
	f.mu.Unlock()
	if !ok || e.gone || (e.node.Addr.Equal(p.Addr) && e.node.Port == p.Port) {
		return nil
	}
	if p.Name == f.name {
		return fmt.Errorf("node ID %s is held by a live member at %s: this member (%s) cannot join with the same node ID; give each Ferry member its own",
			p.Name, p.Address(), e.node.Address())
	}
	return fmt.Errorf("node ID %s is held by the live member at %s: the member at %s cannot join with the same node ID; give each Ferry member its own",
		p.Name, e.node.Address(), p.Address())
}
