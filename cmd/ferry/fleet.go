package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/fleetswitch"
	"github.com/ferry-gw/ferry/membership"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
)

// fleetRole is this member's part in a fleet (the fleet section): the members
// gossip knows (membership), the brokers clients see (routing.BrokerSet), the
// switch's steps carried to every live member (fleetswitch), the write
// lease (routing.Lease), and the mirror's partitions spread over the
// members (mirror.Ownership).
type fleetRole struct {
	n     *node
	m     *membership.Fleet
	lease *routing.Lease
	log   *zap.Logger

	brokers atomic.Pointer[[]routing.Broker] // the alive members, as brokers
	ports   atomic.Pointer[[]int32]          // this member's advertised lane ports

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Fleet calls between members.
// (The switch's own, hold, install and the mirror's stop and start, are
// fleetswitch's.)
const (
	callMirrorStatus = "mirror.status"
	// callMirrorRestart: each member restarts the halted writers it runs
	// (POST /mirror/restart on any member reaches every one).
	callMirrorRestart = "mirror.restart"
	callInfo          = "member.info"
)

// memberInfo is what a member answers about its load (callInfo), and the
// generation it serves: fresher than the one its gossiped metadata carries,
// which memberlist v0.7.0 can leave a push-pull interval (5 s) behind
// (its broadcast queue drops a queued update under a key collision:
// hashicorp/memberlist#263). Nil from a member that does not say.
type memberInfo struct {
	Connections      int     `json:"connections"`
	MirrorPartitions int     `json:"mirror_partitions"`
	Generation       *uint32 `json:"generation,omitempty"`
}

// init builds the member's side of the fleet; it joins nobody until run.
func (f *fleetRole) init(n *node, cfg *Config, port int, reg prometheus.Registerer) error {
	fc := cfg.Fleet
	var key []byte
	if fc.KeyFile != "" {
		var err error
		if key, err = membership.LoadKey(fc.KeyFile); err != nil {
			return usageError{fmt.Errorf("fleet.key_file: %w", err)}
		}
	}
	log := n.log.Named("fleet")
	f.n, f.log = n, log
	f.ctx, f.cancel = context.WithCancel(context.Background())
	ports := []int32{int32(port)}
	f.ports.Store(&ports)
	transport, err := gossipTransport(fc.Bind, log)
	if err != nil {
		return fmt.Errorf("fleet.bind %s: %w", fc.Bind, err)
	}
	m, err := membership.New(membership.Config{
		Bind:      fc.Bind,
		Advertise: fc.Advertise,
		Seeds:     fc.Seeds,
		Key:       key,
		Transport: transport,
	}, membership.Meta{
		NodeID:     cfg.NodeID,
		Host:       cfg.AdvertisedHost,
		Ports:      ports,
		Admin:      n.adminLn.Addr().String(),
		Version:    version(),
		Generation: n.routes.Current().Generation,
		Starting:   true, // until its failover runner runs (runFailover)
	}, log, reg)
	if err != nil {
		if transport != nil {
			transport.Shutdown() // memberlist never took it over
		}
		if errors.Is(err, membership.ErrBind) {
			return usageError{fmt.Errorf("fleet.bind %s: %w", fc.Bind, err)}
		}
		return err
	}
	f.m = m
	f.lease = routing.NewLease(n.routes, n.store, fc.WriteLease, n.log.Named("lease"))
	if reg != nil {
		// A member cut off from the active cluster stops writing when its
		// lease lapses: this is how an operator sees which one did.
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ferry_write_lease_remaining_seconds",
			Help: "How long this member's write lease holds without a renewal; 0: lapsed, and the member's writes wait.",
		}, func() float64 { return max(f.lease.Left().Seconds(), 0) }))
	}
	f.refreshBrokers()
	return nil
}

// run answers the other members' calls, joins the fleet, and keeps the
// brokers, the generation gossiped and the mirror's direction up to date,
// until close.
func (f *fleetRole) run() {
	f.handle()
	f.wg.Go(func() {
		if err := f.m.Run(f.ctx); err != nil && f.ctx.Err() == nil {
			f.log.Error("gossip stopped", zap.Error(err))
		}
	})
	f.wg.Go(func() { f.lease.Run(f.ctx) })
	f.wg.Go(f.watchMembers)
	f.wg.Go(f.followRoutes)
}

// followRoutes gossips the generation this member serves, and points its
// mirror the way each new generation says: a member that learns a switch
// late (from the clusters, lease.go) starts its writers the new way too.
func (f *fleetRole) followRoutes() {
	var last routing.State
	for {
		ch := f.n.routes.Changed()
		st := f.n.routes.Current()
		if st.Generation != last.Generation {
			f.m.SetGeneration(st.Generation)
		}
		if f.n.mirror != nil && st.Phase == routing.PhaseServing && (st.Generation != last.Generation || st.Active != last.Active) {
			if err := f.n.mirror.Follow(st); err != nil {
				f.log.Error("pointing the mirror the way the routing state says", zap.Stringer("routing", st), zap.Error(err))
			}
		}
		last = st
		select {
		case <-f.ctx.Done():
			return
		case <-ch:
		}
	}
}

// watchMembers rebuilds the broker list at every membership change.
func (f *fleetRole) watchMembers() {
	for {
		ch := f.m.Changed()
		f.refreshBrokers()
		select {
		case <-f.ctx.Done():
			return
		case <-ch:
		}
	}
}

// refreshBrokers lists the alive members as the brokers clients see. This
// member is always among them: it serves whatever gossip says of it.
func (f *fleetRole) refreshBrokers() {
	self := f.n.cfg.NodeID
	var out []routing.Broker
	hasSelf := false
	for _, m := range f.m.Alive() {
		if len(m.Ports) == 0 {
			continue
		}
		hasSelf = hasSelf || m.NodeID == self
		out = append(out, routing.Broker{NodeID: m.NodeID, Host: m.Host, Port: m.Ports[0], LanePorts: m.Ports})
	}
	if !hasSelf {
		ports := *f.ports.Load()
		out = append(out, routing.Broker{NodeID: self, Host: f.n.cfg.AdvertisedHost, Port: ports[0], LanePorts: ports})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NodeID < out[j].NodeID })
	f.brokers.Store(&out)
}

// Brokers implements routing.BrokerSet.
func (f *fleetRole) Brokers() []routing.Broker { return *f.brokers.Load() }

// Owner implements routing.BrokerSet.
func (f *fleetRole) Owner(key string) int32 { return routing.Rendezvous(f.Brokers(), key) }

// setPorts advertises this member's lane ports, once the lanes are bound.
func (f *fleetRole) setPorts(ports []int32) {
	ps := append([]int32(nil), ports...)
	f.ports.Store(&ps)
	if err := f.m.SetPorts(ps); err != nil {
		f.log.Error("the lane ports do not fit in the gossiped metadata; the others see lane 0 only", zap.Error(err))
	}
	f.refreshBrokers()
}

// Self implements proxy.Peers.
func (f *fleetRole) Self() int32 { return f.n.cfg.NodeID }

// Call implements proxy.Peers.
func (f *fleetRole) Call(ctx context.Context, to int32, kind string, body []byte) ([]byte, error) {
	return f.m.Call(ctx, to, kind, body)
}

// Unreachable implements proxy.Peers: the members gossip suspects or takes
// for dead (not those that left).
func (f *fleetRole) Unreachable() []int32 {
	var out []int32
	for _, m := range f.m.Members() {
		if !m.Self && (m.State == membership.Suspect || m.State == membership.Dead) {
			out = append(out, m.NodeID)
		}
	}
	return out
}

// Owns implements mirror.Ownership: the partition's writer runs on the
// member that rendezvous hashing of the partition picks among the alive
// members.
func (f *fleetRole) Owns(topic string, partition int32) bool {
	return f.Owner("mirror\x00"+topic+"\x00"+strconv.Itoa(int(partition))) == f.n.cfg.NodeID
}

// Syncs implements mirror.Ownership: one member runs the metadata sync.
func (f *fleetRole) Syncs() bool { return f.Owner("mirror\x00sync") == f.n.cfg.NodeID }

// mayMirror is the mirror's write gate: open while the write lease holds,
// or while a switch this member knows of runs (it drains the mirror,
// and leases are not renewed then). A member that was cut off through a
// switch finds its lease lapsed and its phase serving: its writers, which
// copy towards what is now the active cluster, wait until it has learnt
// the new generation and turned its mirror around.
func (f *fleetRole) mayMirror() bool {
	return f.n.routes.Current().Phase != routing.PhaseServing || f.lease.Valid()
}

// Changed implements mirror.Ownership.
func (f *fleetRole) Changed() <-chan struct{} { return f.m.Changed() }

// handle answers the other members' calls: the switch's control on
// handler slots of its own (fleetswitch.Register), so that transactional
// forwarding cannot crowd it out, and the rest.
func (f *fleetRole) handle() {
	n := f.n
	var sm fleetswitch.LocalMirror
	if n.mirror != nil {
		sm = switchMirror{n.mirror}
	}
	fleetswitch.Register(f.m, routing.Local{Table: n.routes, Settled: n.proxy.Settled, Clusters: n.switcher.Clusters}, sm)
	f.m.Handle(callMirrorStatus, func(context.Context, int32, []byte) ([]byte, error) {
		return json.Marshal(n.admin.LocalMirror())
	})
	f.m.Handle(callMirrorRestart, n.handleMirrorRestart)
	f.m.Handle(callMirrorHalt, n.handleMirrorHalt)
	f.m.Handle(proxy.TxnCallKind, n.proxy.HandleTxnCall)
	f.m.Handle(proxy.SwitchFenceCallKind, n.proxy.HandleSwitchFencing)
	f.m.Handle(callInfo, func(context.Context, int32, []byte) ([]byte, error) {
		gen := n.routes.Current().Generation
		info := memberInfo{Connections: n.proxy.Connections(), Generation: &gen}
		if n.mirror != nil {
			info.MirrorPartitions = len(n.mirror.Info().Partitions)
		}
		return json.Marshal(info)
	})
}

// callLive calls every alive member and waits for each to answer, or to
// stop being alive (membership.CallAll, membership.Split).
func (f *fleetRole) callLive(ctx context.Context, kind string, body []byte) (answers map[int32][]byte, failed map[int32]error, unreached []int32) {
	return membership.Split(f.log, kind, f.m.CallAll(ctx, kind, body))
}

// halted lists the halted mirror partitions of every alive member.
func (f *fleetRole) halted() []string {
	var out []string
	for _, p := range f.mirrorStatus(context.Background()).Partitions {
		if p.State == "halted" {
			out = append(out, fmt.Sprintf("%s[%d]: %s (member %d)", p.Topic, p.Partition, p.Error, p.Owner))
		}
	}
	sort.Strings(out)
	return out
}

// mirrorStatus is the fleet's mirror: every alive member's partitions.
func (f *fleetRole) mirrorStatus(ctx context.Context) admin.MirrorStatus {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	answers, failed, _ := f.callLive(ctx, callMirrorStatus, nil)
	for id, err := range failed {
		f.log.Debug("a member's mirror status", zap.Int32("member", id), zap.Error(err))
	}
	parts := make([]admin.MirrorStatus, 0, len(answers))
	for _, b := range answers {
		var ms admin.MirrorStatus
		if err := json.Unmarshal(b, &ms); err == nil {
			parts = append(parts, ms)
		}
	}
	return admin.MergeMirror(parts...)
}

// members lists every member gossip knows, with what each answered of its
// load.
func (f *fleetRole) members(ctx context.Context) []admin.Member {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	answers, _, _ := f.callLive(ctx, callInfo, nil)
	var out []admin.Member
	for _, m := range f.m.Members() {
		am := admin.Member{
			NodeID: m.NodeID, State: m.State.String(), Self: m.Self,
			Host: m.Host, Ports: m.Ports, Gossip: m.Addr, Admin: m.Admin,
			Version: m.Version, Generation: m.Generation, GossipGeneration: m.Generation,
			Connections: -1, MirrorPartitions: -1, Starting: m.Starting,
		}
		var info memberInfo
		if b, ok := answers[m.NodeID]; ok && json.Unmarshal(b, &info) == nil {
			am.Connections, am.MirrorPartitions = info.Connections, info.MirrorPartitions
			if info.Generation != nil {
				am.Generation = *info.Generation
			}
		}
		out = append(out, am)
	}
	return out
}

// ready is the fleet's part of /readyz: joined. (The write lease is not
// part of it: every member lacks it while a switch holds writes, and a
// fleet unready all at once would be taken out of its Service.)
func (f *fleetRole) ready() error {
	if ok, why := f.m.Ready(); !ok {
		return fmt.Errorf("fleet: %s", why)
	}
	return nil
}

// close leaves the fleet (the others stop naming this member to clients)
// and stops the background work; safe to call more than once.
func (f *fleetRole) close() {
	f.cancel()
	f.m.Close()
	f.wg.Wait()
}
