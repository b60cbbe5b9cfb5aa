package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/listen"
	"github.com/ferry-gw/ferry/internal/logsample"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// Server is one Ferry member's Kafka listener: the virtual cluster.
type Server struct {
	cfg     config
	log     *zap.Logger
	routes  *routing.Table
	brokers routing.BrokerSet
	// ups are the configured clusters by name. Retire replaces the map
	// rather than changing it, so a reader takes it once (clusters,
	// cluster) and never locks.
	ups     atomic.Pointer[map[string]*upstream.Cluster]
	metrics *metrics
	mem     *upstream.Budget
	// connMetrics count accept errors and closes by reason.
	connMetrics *connMetrics
	// clientMetrics count by client_id and software; connIDs numbers the
	// connections; closedConns keeps the latest closed (connz.go).
	clientMetrics *connstats.ClientMetrics
	connIDs       atomic.Uint64
	closedConns   connstats.Ring
	acceptLog     listen.Log
	// refusalLogs samples the log lines about refused requests and
	// frames.
	refusalLogs *logsample.Sampler
	// policy says which classes of request clients may send.
	policy policy
	// internal are Ferry's own topics, hidden from clients
	// (internal_topics.go).
	internal internalTopics
	// metaAnswers keeps the last answer for every topic
	// (metadata_answers.go).
	metaAnswers metadataAnswers
	// tls and auth secure the listeners, when configured (tls.go,
	// auth.go); authMetrics count authentications.
	tls         *clientauth.TLSServer
	auth        *clientauth.Authenticator
	authMetrics *clientauth.Metrics

	// writes counts client writes in flight (hold.go).
	writes atomic.Int64
	// draining is set by Shutdown: connections read no new request. drainc
	// is closed then, to wake fetches parked upstream.
	draining  atomic.Bool
	drainc    chan struct{}
	drainOnce sync.Once
	// settings are the limits and timeouts in force (limits.go).
	settings atomic.Pointer[Settings]

	// lanes is how many virtual brokers each member presents.
	lanes int

	// versions is what Ferry advertises: what it can parse, intersected
	// with what every configured cluster supports (set by Start, and
	// again when a cluster is retired).
	versions atomic.Pointer[protocol.Versions]
	// features is what Ferry advertises of the clusters' feature flags:
	// what every cluster reached so far finalizes (features.go).
	features advertisedFeatures

	// remapped, txns and txnTimeouts serve clients holding a producer ID
	// of an earlier generation (producer_ids.go); txnTimeouts holds the
	// transaction timeout each transactional ID last initialised with
	// (the most recent maxTxnTimeouts).
	remapped remappedPIDs
	txns     txnRemaps
	// nativeFirsts: whether an idempotent producer's first batch in a
	// partition was written (native_firsts.go).
	nativeFirsts nativeFirsts
	// genSince is when this member took the generation in force
	// (group_member.go).
	genSince    atomic.Pointer[genStart]
	txnTimeouts *lru.Cache[string, int32]
	// carried and switchFences: the transactional IDs this member's
	// clients name, and those a switch's drain fenced (switch_fence.go).
	carried      carriedTxns
	switchFences switchFences

	// idents numbers the client principals the clusters map
	// (principals.go).
	idents identities

	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	lns   map[net.Listener]struct{}
	conns map[*clientConn]struct{}
	// connsByIP counts the open connections by source IP (limits.go);
	// unauthByIP those not authenticated yet on a listener with SASL,
	// held to auth.cfg.PreAuth.MaxPerIP (preauth.go).
	connsByIP  map[string]int
	unauthByIP map[string]int
	closed     bool
	wg         sync.WaitGroup
}

// New builds a server. Start must succeed before it serves.
func New(opts ...Option) (*Server, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.log,
		routes:  cfg.routes,
		brokers: cfg.brokers,
		lns:     make(map[net.Listener]struct{}),
		conns:   make(map[*clientConn]struct{}),

		connsByIP:  make(map[string]int),
		unauthByIP: make(map[string]int),
		drainc:     make(chan struct{}),

		refusalLogs: logsample.New(cfg.refusalLogEvery),
		policy:      cfg.policy,
		internal:    newInternalTopics(cfg.clusterID, cfg.internalTopics),
	}
	s.settings.Store(&s.cfg.settings)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	m, err := newMetrics(cfg.reg)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.txns.evicted = m.evictions.WithLabelValues(stateTxnMappings)
	s.remapped.evicted = m.evictions.WithLabelValues(statePIDMappings)
	s.txns.full = func(key int16) { m.refused(key, reasonTxnMappingsFull) }
	if s.txnTimeouts, err = lru.New[string, int32](maxTxnTimeouts); err != nil {
		return nil, err
	}
	s.mem = upstream.NewBudget(s.cfg.processBufferBudget, s.cfg.connBufferBudget, m.buffered, m.readPauses)
	if s.connMetrics, err = newConnMetrics(cfg.reg); err != nil {
		return nil, err
	}
	if s.clientMetrics, err = connstats.NewClientMetrics(cfg.reg, cfg.clientMetricsLimit); err != nil {
		return nil, err
	}
	if err := s.initClientSecurity(); err != nil {
		return nil, err
	}
	s.idents = newIdentities(cfg.clusters)
	ups := make(map[string]*upstream.Cluster, len(cfg.clusters))
	s.ups.Store(&ups)
	for _, cl := range cfg.clusters {
		u, err := upstream.New(upstream.Options{ClusterID: s.cfg.clusterID, Log: s.cfg.log, DialTimeout: s.cfg.dialTimeout, MaxConnsPerBroker: s.cfg.maxConnsPerBroker, IdleConnsPerBroker: s.cfg.idleConnsPerBroker, MaxResponseSize: s.cfg.maxResponseSize}, cl)
		if err != nil {
			s.Close()
			return nil, err
		}
		u.Idents, u.Names = s.idents.securities(cl), s.idents.names
		u.Spawn = s.goTracked
		u.CoordsEvicted = m.evictions.WithLabelValues(stateCoordinators)
		ups[cl.Name] = u
	}
	return s, nil
}

// Start connects to the clusters, learns the API versions they support and
// loads their metadata. It retries the active cluster until ctx ends,
// logging why it is unreachable: Ferry cannot serve without it. Should the
// routing state name another active cluster meanwhile (a member restarted
// while its fleet switches away from a dead cluster learns the switch from
// the clusters), it waits for that one instead. The other
// clusters are waited for as long as WithStandbyWait allows, then connected
// in the background: a standby that is down must not keep clients from the
// active one. The versions advertised are those of the clusters reached in
// time.
func (s *Server) Start(ctx context.Context) error {
	active, err := s.startActive(ctx)
	if err != nil {
		return err
	}
	sets := []protocol.Versions{protocol.KmsgVersions().Only(clientKeys()...)}
	s.learnFeatures(s.cluster(active), false)
	for name, u := range s.clusters() {
		if name == active {
			sets = append(sets, u.Versions)
			continue
		}
		// With the versions saved at the last switch, a cluster that
		// does not answer at once is not waited for long: it is the
		// one a forced failover left, most likely.
		wait := s.cfg.standbyWait
		if savedVersions(s.routes.Current()) != nil {
			wait = min(wait, savedStandbyWait)
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		err := s.startCluster(wctx, u)
		cancel()
		if err == nil {
			sets = append(sets, u.Versions)
			s.learnFeatures(u, false)
			continue
		}
		if ctx.Err() != nil {
			return err
		}
		if saved := savedVersions(s.routes.Current()); saved != nil {
			// What was advertised when the routing state was saved,
			// every cluster reached then: the cluster that is down
			// narrows the versions still.
			sets = append(sets, saved)
			s.log.Warn("serving without a cluster that is unreachable: advertising no more than the API versions saved with the routing state; connecting in the background",
				zap.String("cluster", name), zap.Error(err))
		} else {
			s.log.Error("serving without a cluster that is unreachable: its API versions are not known, so a switch to it may fail clients that use versions it lacks; connecting in the background",
				zap.String("cluster", name), zap.Error(err))
		}
		s.goTracked(func() {
			if err := s.startCluster(s.ctx, u); err == nil {
				s.checkLateVersions(u)
				s.learnFeatures(u, true)
			}
		})
	}
	s.setVersions(protocol.Intersect(sets...))
	s.lanes = s.cfg.lanes
	if s.lanes == 0 {
		// As many lanes as the largest cluster has brokers: each
		// physical leader gets a virtual broker of its own.
		for _, u := range s.clusters() {
			s.lanes = max(s.lanes, len(u.Snapshot().Brokers))
		}
	}
	s.lanes = min(max(s.lanes, 1), laneStride)
	s.goTracked(s.refreshLoop)
	s.goTracked(s.giveBackLoop)
	s.goTracked(s.warmLoop)
	s.goTracked(s.forcedLoop)
	return nil
}

// startActive connects to the active cluster, retrying until ctx ends, and
// returns its name: the routing state's active cluster when it answered.
func (s *Server) startActive(ctx context.Context) (string, error) {
	for {
		active := s.routes.Current().Active
		actx, cancel := context.WithCancel(ctx)
		go func() {
			for {
				changed := s.routes.Changed()
				if s.routes.Current().Active != active {
					cancel()
					return
				}
				select {
				case <-changed:
				case <-actx.Done():
					return
				}
			}
		}()
		err := s.startCluster(actx, s.cluster(active))
		cancel()
		if err == nil {
			return active, nil
		}
		if ctx.Err() != nil {
			return "", err
		}
		s.log.Info("the routing state names another active cluster; connecting to it", zap.String("was", active),
			zap.Stringer("routing", s.routes.Current()))
	}
}

// savedStandbyWait bounds the wait at start for a cluster that is not the
// active one when the routing state carries the API versions to advertise
// without it.
const savedStandbyWait = 3 * time.Second

// startCluster connects to one cluster, retrying until ctx ends or the
// cluster is retired.
func (s *Server) startCluster(ctx context.Context, u *upstream.Cluster) error {
	for attempt := 0; ; attempt++ {
		if s.cluster(u.Name) != u {
			return fmt.Errorf("cluster %q retired", u.Name)
		}
		err := u.Start(ctx)
		if err == nil {
			u.Started.Store(true)
			return nil
		}
		if upstream.AuthFailed(err) {
			s.log.Error("authentication to the cluster failed; retrying", zap.String("cluster", u.Name),
				zap.String("security", u.Security.Describe()), zap.Error(err))
		} else {
			s.log.Warn("cluster unreachable; retrying", zap.String("cluster", u.Name), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster %q unreachable: %w", u.Name, err)
		case <-time.After(min(time.Duration(attempt+1)*500*time.Millisecond, 5*time.Second)):
		}
	}
}

// checkLateVersions logs what a cluster reached after Ferry started serving
// lacks of the versions clients were offered.
func (s *Server) checkLateVersions(u *upstream.Cluster) {
	missing := s.advertised().Only(clientKeys()...).Missing(u.Versions) // not SaslHandshake: Ferry answers it
	if len(missing) == 0 {
		s.log.Info("cluster reached; it supports every API version Ferry advertises", zap.String("cluster", u.Name))
		return
	}
	s.log.Error("cluster reached late supports fewer API versions than Ferry advertises: clients using them would fail after a switch to it; restart Ferry to advertise what both support",
		zap.String("cluster", u.Name), zap.Strings("missing", missing))
}

// refreshLoop refreshes upstream metadata periodically.
func (s *Server) refreshLoop() {
	t := time.NewTicker(s.cfg.metadataInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			for name, u := range s.clusters() {
				ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
				if _, err := u.Refresh(ctx, true); err != nil {
					s.log.Warn("metadata refresh failed", zap.String("cluster", name), zap.Error(err))
				}
				cancel()
			}
		}
	}
}

// goTracked runs f on a goroutine that Close waits for; after Close it does
// not start it.
func (s *Server) goTracked(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// Serve accepts client connections on ln until Close.
func (s *Server) Serve(ln net.Listener) error { return s.ServeLane(ln, -1) }

// ServeLane accepts client connections on ln, the listener of one lane (a
// virtual broker; 0 up to Lanes()-1), until Close. A produce that reaches a
// lane for a partition whose leader is another lane is refused
// NOT_LEADER_OR_FOLLOWER, as a broker that is not the leader refuses it, so
// that a client's batches for one partition always travel one connection
// and reach the broker in the order sent. Serve is ServeLane for a listener
// of no particular lane.
func (s *Server) ServeLane(ln net.Listener, lane int) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	// Out of file descriptors and the like: retried, serving the open
	// connections meanwhile (internal/listen).
	rl := listen.New(ln, s.log, "a client", func(reason string) { s.connMetrics.acceptErrors(reason).Inc() }, &s.acceptLog, s.ctx.Done())
	for {
		nc, err := rl.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || s.ctx.Err() != nil {
				return ErrServerClosed
			}
			return err
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		ip := remoteIP(nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return ErrServerClosed
		}
		if reason := s.admitConn(ip); reason != "" {
			s.mu.Unlock()
			s.refuseConn(nc, ip, reason)
			continue
		}
		c := s.newClientConn(nc)
		c.lane, c.ip = lane, ip
		c.unauth.Store(s.auth != nil) // counted by admitConn
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.releaseConn(ip)
			s.leaveUnauthLocked(c)
			s.mu.Unlock()
			s.retire(c)
		}()
	}
}

// Shutdown stops the server gracefully, like nats-server's lame-duck mode:
// it stops accepting, and reads no new request. Each connection finishes
// the requests it has read (their answers written) and closes; one idle
// meanwhile is closed at its turn, the turns spread evenly over the
// lame-duck period (WithLameDuck), so that its clients do not all
// reconnect to the other members at the same moment. A request not yet
// read, or read only in part, gets no answer, and its client sends it again
// through another member after a metadata refresh. When ctx ends first,
// what remains is closed as by Close. Close follows in any case.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	start, period := time.Now(), s.settings.Load().LameDuck
	i, n := 0, len(s.conns)
	// A few connections have no herd to spread: turns at most
	// lameDuckMaxGap apart, the period used only from as many
	// connections as fill it at that pace.
	period = min(period, time.Duration(n)*s.cfg.lameDuckMaxGap)
	for c := range s.conns { // map order: the turns in no particular order
		c.drainAt.Store(start.Add(period * time.Duration(i) / time.Duration(n)).UnixNano())
		i++
	}
	s.draining.Store(true)
	s.drainOnce.Do(func() { close(s.drainc) })
	for ln := range s.lns {
		ln.Close()
	}
	s.mu.Unlock()
	if n > 0 {
		s.log.Info("shutdown: closing client connections as they finish, idle ones spread over the lame-duck period",
			zap.Int("connections", n), zap.Duration("lame_duck", period))
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		n := len(s.conns)
		// A reader blocked on an idle connection wakes at its turn. Again
		// at each tick: a reader that had checked draining just before
		// may have set a later deadline since.
		now := time.Now().UnixNano()
		for c := range s.conns {
			if c.drainAt.Load() <= now {
				c.nc.SetReadDeadline(time.Unix(1, 0))
			}
		}
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			s.log.Warn("shutdown: closing connections with answers still owed", zap.Int("connections", n))
			return s.Close()
		case <-t.C:
		}
	}
	return s.Close()
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("ferry: server closed")

// errDraining ends a connection's reader during Shutdown.
var errDraining = fmt.Errorf("%w: shutting down", ErrServerClosed)

// Close stops the server; safe to call more than once. In order: stop
// accepting, close every client connection (in-flight requests end with
// them, as with a broker that stops), wait for every goroutine, then close
// the upstream clients.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.close(ErrServerClosed)
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	for _, u := range s.clusters() {
		u.Close()
	}
	return nil
}

// Connections is how many client connections are open.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Lanes is how many virtual brokers each member presents, known after
// Start: the caller serves that many listeners and advertises their ports
// in the fleet (routing.Broker.LanePorts).
func (s *Server) Lanes() int { return s.lanes }

// Versions returns the API versions Ferry advertises.
func (s *Server) Versions() protocol.Versions { return s.advertised() }

// advertised is the API versions Ferry advertises now; nil before Start.
func (s *Server) advertised() protocol.Versions {
	if v := s.versions.Load(); v != nil {
		return *v
	}
	return nil
}

// setVersions advertises the intersection vs (and SASL's, Ferry's own).
func (s *Server) setVersions(vs protocol.Versions) {
	v := s.withSASL(vs)
	s.versions.Store(&v)
}

// clusters is the configured clusters by name, as of this call. The map
// is never changed: do not change it.
func (s *Server) clusters() map[string]*upstream.Cluster { return *s.ups.Load() }

// cluster is the configured cluster name, or nil.
func (s *Server) cluster(name string) *upstream.Cluster { return s.clusters()[name] }

// Retire removes a cluster from the ones this member serves, while it
// runs: the migration's last step, once the way back is not wanted. The
// API versions and feature levels advertised are computed again from the
// clusters left, so the connections opened from now on are offered what
// those support (the newer cluster's, after a migration from an older
// one); the connections already open keep what they negotiated, which
// the clusters left support too. The cluster's connections are closed.
// Refused, changing nothing, while the cluster is the active one or a
// switch is under way (the caller also keeps switches from starting).
func (s *Server) Retire(name string) error {
	if s.cluster(name) == nil {
		return fmt.Errorf("cluster %q is not configured", name)
	}
	if st := s.routes.Current(); st.Active == name || st.Phase != routing.PhaseServing {
		return fmt.Errorf("cluster %q cannot be retired now: the routing state is %s", name, st)
	}
	s.mu.Lock() // one Retire at a time
	old := s.clusters()
	u := old[name]
	if u == nil {
		s.mu.Unlock()
		return fmt.Errorf("cluster %q is not configured", name)
	}
	next := make(map[string]*upstream.Cluster, len(old)-1)
	for n, c := range old {
		if n != name {
			next[n] = c
		}
	}
	s.ups.Store(&next)
	s.mu.Unlock()

	sets := []protocol.Versions{protocol.KmsgVersions().Only(clientKeys()...)}
	for _, c := range next {
		if c.Started.Load() {
			sets = append(sets, c.Versions)
		} else if saved := savedVersions(s.routes.Current()); saved != nil {
			sets = append(sets, saved) // as Start: no more than saved
		}
	}
	s.setVersions(protocol.Intersect(sets...))
	s.forgetFeatures(name)
	u.Close()
	s.log.Info("cluster retired: advertising the API versions and feature levels of the clusters left to the connections opened from now on",
		zap.String("cluster", name), zap.Int("clusters_left", len(next)))
	return nil
}

// SavedVersions is what Versions says, in the form the routing state saves
// (routing.State.APIVersions), or nil while a configured cluster has not
// been reached: a narrower set than every cluster's must not be saved as
// theirs.
func (s *Server) SavedVersions() map[int16][2]int16 {
	for _, u := range s.clusters() {
		if !u.Started.Load() {
			return nil
		}
	}
	vs := s.advertised()
	out := make(map[int16][2]int16, len(vs))
	for k, r := range vs {
		out[k] = [2]int16{r.Min, r.Max}
	}
	return out
}

// savedVersions is the API versions a routing state carries, or nil.
func savedVersions(st routing.State) protocol.Versions {
	if len(st.APIVersions) == 0 {
		return nil
	}
	out := make(protocol.Versions, len(st.APIVersions))
	for k, r := range st.APIVersions {
		out[k] = protocol.VersionRange{Min: r[0], Max: r[1]}
	}
	return out
}
