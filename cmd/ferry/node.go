package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/fleetswitch"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// node is one Ferry member as the binary runs it: the proxy (the virtual
// cluster's Kafka listener), the mirror (when enabled) and the admin API,
// sharing a routing table, a fleet and a metrics registry. serve and demo
// both run one. The proxy and the mirror never see each other; the node
// wires both to the routing table.
//
// Lifecycle: newNode binds both listeners (so a taken port fails at once;
// the Kafka one is let go again until start can serve on it) and starts the
// admin API; start connects to the clusters, retrying until
// its context ends, then serves clients and starts the mirror from the
// active cluster to the standby; Close stops everything.
type node struct {
	log    *zap.Logger
	reg    *prometheus.Registry
	routes *routing.Table
	// solo is the fleet of a member on its own (no fleet section); fleet
	// is the gossip fleet otherwise. Exactly one is set.
	solo   *routing.StaticBrokerSet
	fleet  *fleetRole
	proxy  *proxy.Server
	mirror *mirrorRunner // nil when the mirror is disabled
	// failover is automatic failover (nil when off).
	failover *failoverRole
	// switcher runs switches of the active cluster (POST /switchover).
	switcher *routing.Switcher
	// store keeps the routing state on the clusters (__ferry_routing).
	store *routing.KafkaStore
	// storeCtx ends when the node closes (it bounds Prepare).
	storeCtx    context.Context
	storeCancel context.CancelFunc
	admin       *admin.Server
	ln          net.Listener // Kafka clients, lane 0, bound once the proxy can serve (guarded by mu)
	// listenAddr is where ln binds: the configured listen address with
	// the port it got when newNode first bound it.
	listenAddr string
	mu         sync.Mutex
	lanes      []net.Listener // lanes 1 and up, bound once the lane count is known
	cfg        *Config
	adminLn    net.Listener
	started    atomic.Bool

	// bootstrap is host:port as clients are told to use it.
	bootstrap string

	wg        sync.WaitGroup
	errc      chan error // the first listener that fails for a reason other than Close
	closeOnce sync.Once
}

// newNode builds a member from a validated configuration.
// A listener that cannot be bound is a usageError (exit status 2) naming
// its key: a taken port is the operator's to fix, like a bad key.
func newNode(cfg *Config, log *zap.Logger) (*node, error) {
	// n is not a named result: "return nil, err" must not hand the
	// deferred Close a nil node.
	n := &node{log: log, errc: make(chan error, 2), cfg: cfg}
	n.storeCtx, n.storeCancel = context.WithCancel(context.Background())
	var err error
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	// The Kafka port is bound now, so that a taken one fails at once, and
	// let go again until the proxy can serve: a bound listener nobody
	// accepts on lets clients connect and then hear nothing (the kernel
	// completes their handshakes), where a closed port tells them to
	// retry. start binds it again, at the port found here.
	if n.ln, err = listen("listen", cfg.Listen); err != nil {
		return nil, err
	}
	n.listenAddr = n.ln.Addr().String()
	n.ln.Close()
	if n.adminLn, err = listen("admin_listen", cfg.AdminListen); err != nil {
		return nil, err
	}
	port := cfg.AdvertisedPort
	if port == 0 {
		port = n.ln.Addr().(*net.TCPAddr).Port
	}
	n.bootstrap = net.JoinHostPort(cfg.AdvertisedHost, strconv.Itoa(port))

	n.reg = newRegistry()
	n.routes = routing.NewTable(routing.State{Generation: 0, Active: cfg.Active})
	var brokers routing.BrokerSet
	if cfg.Fleet == nil {
		n.solo = routing.NewStaticBrokerSet(routing.Broker{NodeID: cfg.NodeID, Host: cfg.AdvertisedHost, Port: int32(port)})
		brokers = n.solo
	} else {
		// The fleet's calls are answered by the proxy, the mirror and the
		// admin API built below; it joins nobody until start.
		n.fleet = &fleetRole{}
		brokers = n.fleet
	}
	// TLS and SASL towards each cluster: one Security per cluster, for
	// the proxy, the mirror and the routing store alike.
	secs, err := cfg.security()
	if err != nil {
		return nil, usageError{err}
	}
	// Client principals mapped to their own credentials, per cluster.
	mapped, err := cfg.principals(secs)
	if err != nil {
		return nil, usageError{err}
	}
	clusters := make([]upstream.Config, len(cfg.Clusters))
	for i, c := range cfg.Clusters {
		// With two clusters each is the mirror's target in some
		// generation (the mirror may run on another member), so
		// either may hold fillers once a switch happened.
		clusters[i] = upstream.Config{Name: c.Name, Bootstrap: c.Bootstrap, MirrorTarget: len(cfg.Clusters) > 1, Security: secs[c.Name], Principals: mapped[c.Name]}
		if secs[c.Name].Enabled() {
			log.Info("cluster security", zap.String("cluster", c.Name), zap.String("security", secs[c.Name].Describe()))
		}
		if len(c.Principals) > 0 {
			log.Info("client principals mapped to their own credentials", zap.String("cluster", c.Name), zap.Int("principals", len(c.Principals)))
		}
	}
	bootstraps := make(map[string][]string, len(cfg.Clusters))
	storeOpts := []routing.StoreOption{routing.StoreLogger(log.Named("routing"))}
	for _, c := range cfg.Clusters {
		bootstraps[c.Name] = c.Bootstrap
		storeOpts = append(storeOpts, routing.StoreClusterSecurity(c.Name, secs[c.Name]))
	}
	if n.store, err = routing.NewKafkaStore(cfg.ClusterID, bootstraps, storeOpts...); err != nil {
		return nil, err
	}
	if n.fleet != nil {
		if err = n.fleet.init(n, cfg, port, n.reg); err != nil {
			return nil, err
		}
	}
	proxyOpts := []proxy.Option{
		proxy.WithClusterID(cfg.ClusterID),
		proxy.WithClusters(clusters...),
		proxy.WithBrokerSet(brokers),
		proxy.WithRoutingTable(n.routes),
		proxy.WithLogger(log.Named("proxy")),
		proxy.WithRegisterer(n.reg),
		proxy.WithMaxRequestSize(int32(cfg.MaxRequestSize)),
		proxy.WithMetadataInterval(cfg.MetadataRefreshInterval),
		proxy.WithLanes(cfg.Lanes),
		proxy.WithMaxConnsPerBroker(cfg.UpstreamMaxConnsPerBroker),
		proxy.WithIdleConnsPerBroker(*cfg.UpstreamIdleConnsPerBroker),
		proxy.WithSpliceFetches(*cfg.SpliceFetches),
		proxy.WithSpliceProduces(*cfg.SpliceProduces),
		proxy.WithConnectionStats(*cfg.ConnectionStats),
		proxy.WithClientMetricsLimit(*cfg.ClientMetricsLimit),
		proxy.WithBufferBudget(cfg.BufferBudgetPerConnection, cfg.BufferBudget),
		proxy.WithConnectionsMaxIdle(cfg.ConnectionsMaxIdle),
		proxy.WithRequestReadTimeout(cfg.RequestReadTimeout),
		proxy.WithWriteTimeout(cfg.ClientWriteTimeout),
		proxy.WithConnectionLimits(cfg.MaxConnections, cfg.MaxConnectionsPerIP, cfg.MaxConnectionsPerIPOverrides),
		proxy.WithLameDuck(*cfg.LameDuckDuration),
		proxy.WithDialTimeout(cfg.UpstreamDialTimeout),
		proxy.WithRequestPolicy(cfg.Policy.Allow, cfg.Policy.Deny),
		// The routing state's topic: a client that could write or
		// delete it could steer or reset the next start.
		proxy.WithInternalTopics(n.store.Topic()),
	}
	if n.fleet != nil {
		proxyOpts = append(proxyOpts, proxy.WithWriteLease(n.fleet.lease), proxy.WithPeers(n.fleet))
	}
	if cfg.TLS != nil {
		proxyOpts = append(proxyOpts, proxy.WithClientTLS(cfg.TLS.proxyTLS()))
	}
	if cfg.SASL != nil {
		proxyOpts = append(proxyOpts, proxy.WithClientSASL(cfg.SASL.proxySASL()))
	}
	if cfg.UnmappedPrincipals == "refuse" {
		proxyOpts = append(proxyOpts, proxy.WithRefuseUnmapped(true))
	}
	if n.proxy, err = proxy.New(proxyOpts...); err != nil {
		return nil, err
	}
	var sm routing.Mirror
	if cfg.Mirror.enabled() {
		var own mirror.Ownership
		var gate func() bool
		if n.fleet != nil {
			own, gate = n.fleet, n.fleet.mayMirror
		}
		n.mirror = newMirrorRunner(cfg, log.Named("mirror"), n.reg, secs, own, gate)
		n.mirror.routes = n.routes.Current
		// The drain fences only transactions Ferry's clients write.
		n.mirror.opts = append(n.mirror.opts, mirror.WithTxnCarrier(n.txnCarrier))
		sm = switchMirror{n.mirror}
		if n.fleet != nil {
			sm = fleetswitch.NewMirror(n.fleet.ctx, n.fleet.m, switchMirror{n.mirror}, n.fleet.halted, log.Named("switch"))
		}
	}
	names := make([]string, len(cfg.Clusters))
	for i, c := range cfg.Clusters {
		names[i] = c.Name
	}
	var members routing.Members = routing.Local{Table: n.routes, Settled: n.proxy.Settled}
	if n.fleet != nil {
		members = fleetswitch.NewMembers(n.fleet.m, n.routes, log.Named("switch"))
	}
	n.switcher = routing.NewSwitcher(n.routes, members, sm, n.store, names, log.Named("switch"))
	n.switcher.SkewClock(clockSkew(log))
	n.switcher.SaveVersions(n.proxy.SavedVersions)
	n.switcher.SaveFeatures(n.proxy.SavedFeatures)
	if len(mapped) > 0 {
		// Before a switch holds or flips anything: every mapped
		// principal must authenticate on the target.
		n.switcher.CheckPrincipals(func(ctx context.Context, cluster string) ([]string, error) {
			fails, err := n.proxy.CheckPrincipals(ctx, cluster)
			out := make([]string, len(fails))
			for i, f := range fails {
				out[i] = f.String()
			}
			return out, err
		})
	}
	if cfg.Failover.Automatic {
		n.failover = n.newFailover(cfg)
	}
	adminOpts := []admin.Option{
		admin.WithVersion(version()),
		admin.WithNode(admin.Node{
			ID:         cfg.NodeID,
			ClusterID:  cfg.ClusterID,
			Advertised: n.bootstrap,
			Listen:     n.listenAddr,
			Admin:      n.adminLn.Addr().String(),
		}),
		admin.WithRoutes(n.routes),
		admin.WithClusters(clusters...),
		admin.WithBrokerSet(brokers),
		admin.WithGatherer(n.reg),
		admin.WithRegisterer(n.reg),
		admin.WithSwitch(n.switchover),
		admin.WithToken(cfg.adminToken),
		admin.WithPublicRead(cfg.AdminPublicRead),
		admin.WithMaxConnections(cfg.AdminMaxConnections, cfg.AdminMaxConnectionsPerIP),
		admin.WithStarted(n.started.Load),
		admin.WithMirror(n.mirrorInfo),
		admin.WithConnections(n.proxy.Connz),
		admin.WithAuth(func() admin.AuthStatus {
			return admin.AuthStatus{OAuthKeys: n.proxy.OAuthKeys(), UpstreamFailures: n.proxy.UpstreamAuthFailures()}
		}, n.proxy.AuthReady),
		admin.WithLogger(log.Named("admin")),
	}
	if n.mirror != nil {
		adminOpts = append(adminOpts, admin.WithMirrorRestart(n.mirrorRestart), admin.WithMirrorHalt(n.mirrorHalt))
	}
	if n.failover != nil {
		adminOpts = append(adminOpts, admin.WithFailover(n.failover.status), admin.WithFailoverPause(n.failoverPause))
	}
	if n.fleet != nil {
		n.switcher.SetWriteLease(cfg.Fleet.WriteLease)
		adminOpts = append(adminOpts,
			admin.WithMembers(n.fleet.members),
			admin.WithReadiness(n.fleet.ready),
			admin.WithFleetMirror(n.fleet.mirrorStatus))
	}
	scheme := "http"
	if t := cfg.AdminTLS; t != nil {
		tc, err := clientauth.ServerTLSConfig(t.proxyTLS(), log.Named("admin"))
		if err != nil {
			return nil, fmt.Errorf("admin_%w", err)
		}
		adminOpts = append(adminOpts, admin.WithTLS(tc))
		scheme = "https"
	}
	if n.admin, err = admin.New(adminOpts...); err != nil {
		return nil, err
	}
	n.goServe("admin", func() error { return n.admin.Serve(n.adminLn) })
	log.Info("admin API listening", zap.String("admin", n.adminLn.Addr().String()), zap.String("scheme", scheme))
	return n, nil
}

// newRegistry returns the registry everything registers on: Go runtime and
// process collectors, and ferry_build_info.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "ferry", Name: "build_info",
		Help: "Always 1; the labels say which Ferry version runs.",
	}, []string{"version"})
	info.WithLabelValues(version()).Set(1)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		info,
	)
	return reg
}

// start connects to the clusters, retrying (and logging why) until ctx
// ends, then serves Kafka clients in the background.
func (n *node) start(ctx context.Context) error {
	// The saved routing state says which cluster is active: read it
	// before connecting. When no cluster answers, the proxy waits for the
	// configured one; the state is read again before serving anyone.
	loaded, err := n.loadRouting(ctx, false)
	if err != nil {
		return err
	}
	// While the proxy waits for the active cluster, the routing state is
	// read again: a member restarted while its fleet switches away from a
	// dead cluster learns the switch from the clusters (its lease and
	// gossip run only once it serves), and the proxy then waits for the
	// new active cluster.
	rctx, stopRereading := context.WithCancel(ctx)
	var rereading sync.WaitGroup
	rereading.Go(func() { n.rereadRouting(rctx) })
	err = n.proxy.Start(ctx)
	stopRereading()
	rereading.Wait()
	if err != nil {
		return err
	}
	if !loaded {
		if _, err := n.loadRouting(ctx, true); err != nil {
			return err
		}
	}
	ln, err := listen("listen", n.listenAddr)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.ln = ln
	n.mu.Unlock()
	if err := n.listenLanes(); err != nil {
		return err
	}
	if n.fleet != nil {
		n.fleet.run()
	}
	n.started.Store(true)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.store.Prepare(n.storeCtx)
	}()
	n.goServe("kafka", func() error { return n.proxy.ServeLane(n.ln, 0) })
	for i, ln := range n.lanes {
		n.goServe("kafka", func() error { return n.proxy.ServeLane(ln, i+1) })
	}
	n.log.Info("serving Kafka clients",
		zap.String("listen", n.ln.Addr().String()),
		zap.String("bootstrap", n.bootstrap),
		zap.Stringer("routing", n.routes.Current()))
	if n.mirror != nil {
		if err := n.mirror.Follow(n.routes.Current()); err != nil {
			return err
		}
	}
	n.runFailover()
	return nil
}

// rereadRouting reads the routing state from the clusters every few
// seconds until ctx ends, installing a newer generation.
func (n *node) rereadRouting(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		st, ok, err := n.store.Load(ctx)
		if err != nil || !ok || !n.configured(st.Active) {
			continue // loadRouting said why at first; the proxy's wait says the rest
		}
		if n.routes.Advance(st) {
			n.log.Info("routing state loaded from the clusters while waiting for the active one", zap.Stringer("routing", st))
		}
	}
}

// configured reports whether cluster is one of the configured clusters.
func (n *node) configured(cluster string) bool {
	return slices.ContainsFunc(n.cfg.Clusters, func(c ClusterConfig) bool { return c.Name == cluster })
}

// loadRouting reads the routing state saved on the clusters and installs it
// when it is newer than the table's: a member restarted after a switch
// routes where the switch left it, whatever `active` says. A cluster that
// does not answer within the store's timeout is skipped, as after a forced
// failover from it. When none answers, loadRouting reports false, or with
// retry keeps trying until one does or ctx ends.
func (n *node) loadRouting(ctx context.Context, retry bool) (bool, error) {
	for {
		st, ok, err := n.store.Load(ctx)
		if err == nil {
			if !ok {
				return true, nil
			}
			if !n.configured(st.Active) {
				return false, usageError{fmt.Errorf("the routing state saved on the clusters (%s) names cluster %q, which is not configured: configure it, or delete the %s topic on every cluster to start again from generation 0", st, st.Active, n.store.Topic())}
			}
			if n.routes.Advance(st) {
				n.log.Info("routing state loaded from the clusters", zap.Stringer("routing", st))
			}
			return true, nil
		}
		if !retry {
			n.log.Warn("no cluster answered with the routing state; connecting to the configured active cluster, and reading it again before serving", zap.Error(err))
			return false, nil
		}
		n.log.Warn("reading the routing state from the clusters; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("reading the routing state: %w", err)
		case <-time.After(time.Second):
		}
	}
}

// mirrorInfo is the mirror as /status reports it.
func (n *node) mirrorInfo() admin.MirrorInfo {
	if n.mirror == nil {
		return admin.MirrorInfo{}
	}
	return n.mirror.Info()
}

// listenLanes binds a listener for each lane after the first, at the ports
// after listen's (any free port when listen's is 0), and advertises them.
func (n *node) listenLanes() error {
	host, portS, _ := net.SplitHostPort(n.cfg.Listen)
	base, _ := strconv.Atoi(portS)
	first := n.ln.Addr().(*net.TCPAddr).Port
	advBase := n.cfg.AdvertisedPort
	ports := []int32{int32(first)}
	if advBase != 0 {
		ports[0] = int32(advBase)
	}
	for l := 1; l < n.proxy.Lanes(); l++ {
		port := 0
		if base != 0 {
			port = base + l
		}
		ln, err := listen(fmt.Sprintf("listen (lane %d, the port after listen's)", l), net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		n.lanes = append(n.lanes, ln)
		adv := int32(ln.Addr().(*net.TCPAddr).Port)
		if advBase != 0 {
			adv = int32(advBase + l)
		}
		ports = append(ports, adv)
	}
	if n.fleet != nil {
		n.fleet.setPorts(ports)
		return nil
	}
	b := n.solo.Brokers()[0]
	b.LanePorts = ports
	n.solo.Set([]routing.Broker{b})
	return nil
}

// listen binds a TCP listener for the configuration key named key. Its
// error is a usageError that names the key and the address and ends with
// the system's reason, e.g. "admin_listen 0.0.0.0:9644: address already in
// use".
func listen(key, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	reason := err
	var se *os.SyscallError
	if errors.As(err, &se) {
		reason = se.Err // "address already in use", without "listen tcp ...: bind:"
	}
	return nil, usageError{fmt.Errorf("%s %s: %w", key, addr, reason)}
}

// goServe runs a listener's serve loop; an error other than the one Close
// causes is reported on errc.
func (n *node) goServe(what string, serve func() error) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := serve(); err != nil && !errors.Is(err, proxy.ErrServerClosed) {
			select {
			case n.errc <- fmt.Errorf("%s listener: %w", what, err):
			default:
			}
		}
	}()
}

// wait blocks until ctx ends (nil) or a listener fails (its error).
func (n *node) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-n.errc:
		return err
	}
}

// shutdown stops the member gracefully (SIGTERM): it leaves the fleet, so
// that the other members stop naming it to clients; stops accepting and
// answers every request its connections have read (within ctx); then
// closes as Close does.
func (n *node) shutdown(ctx context.Context) {
	if n.fleet != nil && n.fleet.m != nil {
		n.fleet.close()
	}
	if n.started.Load() {
		if err := n.proxy.Shutdown(ctx); err != nil {
			n.log.Warn("shutdown", zap.Error(err))
		}
	}
	n.Close()
}

// setProxySettings applies reloaded client connection settings.
func (n *node) setProxySettings(st proxy.Settings) error { return n.proxy.SetSettings(st) }

// setMirrorFilters applies reloaded mirror filters, unless a switchover is
// in progress (false).
func (n *node) setMirrorFilters(topics, groups Selection) (bool, error) {
	if n.routes.Current().Phase != routing.PhaseServing {
		return false, nil
	}
	if n.mirror == nil {
		return true, nil
	}
	return true, n.mirror.SetFilters(topics, groups)
}

// retireCluster stops serving a cluster, while the member runs: the
// migration's last step (SIGHUP with the cluster taken out of `clusters`).
// Refused, changing nothing, before the member serves, while a switch
// runs, and for the active cluster. Then no switch can go to it
// (unknown_cluster), automatic failover and the mirror stop (one cluster
// is left, neither has anything to do), the routing state is kept on the
// clusters left only, and the proxy offers new connections the API
// versions and feature levels of the clusters left (proxy.Retire).
func (n *node) retireCluster(name string) error {
	if !n.started.Load() {
		return errors.New("the member is not serving yet")
	}
	return n.switcher.Retire(name, func() error {
		// The proxy first: it refuses should a switch another member
		// runs hold this one's writes by now, and nothing is changed.
		if err := n.proxy.Retire(name); err != nil {
			return err
		}
		if n.failover != nil {
			n.failover.retire(name)
		}
		if n.mirror != nil {
			n.mirror.Close()
		}
		if err := n.store.Retire(name); err != nil {
			n.log.Warn("the routing state is still kept on the retired cluster", zap.String("cluster", name), zap.Error(err))
		}
		n.admin.RetireCluster(name)
		n.log.Info("cluster retired: no switch can go to it, the mirror and automatic failover stopped, new connections are offered the versions of the clusters left",
			zap.String("cluster", name), zap.Stringer("routing", n.routes.Current()))
		return nil
	})
}

// Close stops the member; safe to call more than once. In order: the fleet
// (left), the mirror
// (its writers stop between appends; the standby's end offset is the
// position, so nothing is lost), the proxy (stop accepting, close client
// connections, close upstream clients), the Kafka listener if the proxy
// never served it, the admin API, then wait for the serve loops.
func (n *node) Close() {
	n.closeOnce.Do(func() {
		if n.fleet != nil && n.fleet.m != nil {
			n.fleet.close()
		}
		if n.failover != nil {
			n.failover.close()
		}
		if n.mirror != nil {
			n.mirror.Close()
		}
		if n.proxy != nil {
			n.proxy.Close()
		}
		n.mu.Lock()
		if n.ln != nil {
			n.ln.Close()
		}
		n.mu.Unlock()
		for _, ln := range n.lanes {
			ln.Close()
		}
		n.storeCancel()
		if n.store != nil {
			n.store.Close()
		}
		if n.admin != nil {
			n.admin.Close()
		} else if n.adminLn != nil {
			n.adminLn.Close()
		}
		n.wg.Wait()
	})
}

// newLogger builds the production JSON logger at level, on stderr.
func newLogger(level string) (*zap.Logger, error) {
	log, _, err := newLeveledLogger(level)
	return log, err
}

// newLeveledLogger is newLogger, with the level it can be changed by
// (SIGHUP reloads log_level).
func newLeveledLogger(level string) (*zap.Logger, zap.AtomicLevel, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, zap.AtomicLevel{}, err
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil
	log, err := zc.Build()
	return log, zc.Level, err
}
