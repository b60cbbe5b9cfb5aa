// Package admin serves one Ferry member's HTTP admin API: Prometheus metrics,
// liveness and readiness probes, a JSON status page, and the switchover.
//
// Monitoring follows the nats-server pattern: a method returns the data
// (Status, Ready) and a thin handler encodes it (HandleStatus, HandleReadyz),
// so the data can be used and tested without HTTP.
//
//	GET  /                the status page (HTML, embedded: ui/), which reads /status and /connections
//	GET  /metrics         Prometheus exposition of the registry passed in
//	GET  /healthz         200 while the process serves HTTP at all
//	GET  /readyz          200 once the proxy has started and the active cluster is reachable, else 503
//	GET  /status          JSON: version, node, routing state, clusters, fleet, mirror, process (fds)
//	GET  /status/mirror   JSON: the mirror section of /status alone
//	GET  /status/routing  JSON: the routing state in full, with the fences of ended generations
//	GET  /connections     JSON: client connections, open and recently closed (WithConnections); personal fields need the token
//	POST /switchover      switch the active cluster (WithSwitch); needs the token (WithToken)
//	POST /mirror/restart  restart halted mirror partitions (WithMirrorRestart); needs the token
//	POST /mirror/halt     halt mirror partitions, to copy a topic again (WithMirrorHalt); needs the token
//	GET  /failover        JSON: automatic failover as this member sees it (WithFailover); 404 when off
//	POST /failover/pause  hold automatic failover off, fleet-wide and durably (WithFailoverPause); needs the token
//	POST /failover/resume let it act again; needs the token
//
// Endpoints that read are open; those that change something need
// "Authorization: Bearer <token>" when a token is configured, and so do the
// clients' principals, addresses and close errors in GET /connections
// (emptied without it, unless WithPublicRead). Wrong tokens are limited per
// source address (429 past the allowance), and the open connections are
// bounded in all and per address (WithMaxConnections), so that the admin
// port cannot take the descriptors the Kafka listeners need.
//
// /readyz is about serving clients only: a halted mirror partition shows in
// /status and in the ferry_mirror_* metrics, and does not make a member
// unready.
package admin

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/internal/listen"
	"github.com/ferry-gw/ferry/internal/logsample"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// Node describes this Ferry member.
type Node struct {
	ID int32 `json:"id"`
	// ClusterID is the virtual cluster's ID, the one clients see.
	ClusterID string `json:"cluster_id"`
	// Advertised is the host:port clients are told to connect to.
	Advertised string `json:"advertised"`
	// Listen is the address the Kafka listener is bound to.
	Listen string `json:"listen"`
	// Admin is the address this admin API is bound to.
	Admin string `json:"admin"`
}

// ClusterCheck reports whether a physical cluster can be reached; nil means
// it can.
type ClusterCheck func(ctx context.Context, c upstream.Config) error

type config struct {
	version  string
	node     Node
	routes   *routing.Table
	clusters []upstream.Config
	brokers  routing.BrokerSet
	gatherer prometheus.Gatherer
	started  func() bool
	check    ClusterCheck
	mirror   func() MirrorInfo
	failover func() failover.Status
	pauseFn  FailoverPauseFunc
	// fleetMirror, members and readiness come from the fleet, when the
	// member is in one.
	fleetMirror func(ctx context.Context) MirrorStatus
	members     func(ctx context.Context) []Member
	readiness   func() error
	log         *zap.Logger
	now         func() time.Time
	probeTTL    time.Duration // how long a cluster check's result is reused
	idle        time.Duration // keep-alive connections idle this long are closed

	connz     ConnzFunc
	switchFn  SwitchFunc
	restartFn MirrorRestartFunc
	haltFn    MirrorHaltFunc
	token     string
	// publicRead shows principals, client addresses and close errors
	// without the token too.
	publicRead bool
	// maxConns bounds the open connections; tokenBurst and tokenInterval
	// the wrong tokens of one address.
	maxConns      int
	maxConnsPerIP int
	tokenBurst    int
	tokenInterval time.Duration
	registerer    prometheus.Registerer
	// tls, when set, serves the API over TLS; with client certificates
	// verified (its ClientAuth), a verified one stands for the token.
	tls *tls.Config

	// auth and authReady are the proxy's authentication state (WithAuth).
	auth      func() AuthStatus
	authReady func() error
}

// Option configures a Server.
type Option func(*config)

// WithVersion sets the version reported by /status.
func WithVersion(v string) Option { return func(c *config) { c.version = v } }

// WithNode describes this member.
func WithNode(n Node) Option { return func(c *config) { c.node = n } }

// WithRoutes sets the routing table whose state /status reports (required).
func WithRoutes(t *routing.Table) Option { return func(c *config) { c.routes = t } }

// WithClusters sets the configured physical clusters (required).
func WithClusters(cs ...upstream.Config) Option { return func(c *config) { c.clusters = cs } }

// WithBrokerSet sets the members, as brokers, that /status lists (required).
func WithBrokerSet(f routing.BrokerSet) Option { return func(c *config) { c.brokers = f } }

// WithGatherer sets what /metrics exposes (required).
func WithGatherer(g prometheus.Gatherer) Option { return func(c *config) { c.gatherer = g } }

// WithStarted sets how the server learns that the proxy has started (its
// Start returned): until it reports true, /readyz answers 503.
func WithStarted(f func() bool) Option { return func(c *config) { c.started = f } }

// WithClusterCheck sets how reachability of a cluster is probed for /readyz
// and /status (default: a TCP dial to any bootstrap server).
func WithClusterCheck(f ClusterCheck) Option { return func(c *config) { c.check = f } }

// WithIdleTimeout closes a keep-alive connection that has waited this long
// for its next request (default 2 minutes, longer than common scrape
// intervals, so a scraper keeps its connection).
func WithIdleTimeout(d time.Duration) Option { return func(c *config) { c.idle = d } }

// WithMembers sets how /status lists the fleet's members with their
// state. Without it /status lists the brokers of WithFleet only.
func WithMembers(f func(ctx context.Context) []Member) Option {
	return func(c *config) { c.members = f }
}

// WithReadiness adds a check to /readyz: a non-nil error makes the member
// unready, with the error as the reason (the fleet not joined, no write
// lease).
func WithReadiness(f func() error) Option { return func(c *config) { c.readiness = f } }

// AuthStatus is the state of authentication that /status reports.
type AuthStatus struct {
	// OAuthKeys is OAUTHBEARER's key set, nil without OAUTHBEARER.
	OAuthKeys *clientauth.OAuthKeysStatus `json:"oauth_keys,omitempty"`
	// UpstreamFailures are the identities a cluster refuses now: Ferry's
	// own, or a mapped principal's.
	UpstreamFailures []upstream.AuthFailure `json:"upstream_failures,omitempty"`
}

// WithAuth sets how /status shows the state of authentication, and how
// /readyz learns that clients cannot authenticate (OAUTHBEARER's keys not
// fetched yet).
func WithAuth(status func() AuthStatus, ready func() error) Option {
	return func(c *config) { c.auth, c.authReady = status, ready }
}

// WithLogger sets the logger.
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.log = l } }

// ErrConfig is wrapped by every configuration error of New.
var ErrConfig = errors.New("invalid admin configuration")

// ErrNotReady is wrapped by the error Ready returns while the member cannot
// serve clients.
var ErrNotReady = errors.New("not ready")

func (c *config) validate() error {
	switch {
	case c.routes == nil:
		return fmt.Errorf("%w: a routing table is required", ErrConfig)
	case len(c.clusters) == 0:
		return fmt.Errorf("%w: at least one cluster is required", ErrConfig)
	case c.brokers == nil:
		return fmt.Errorf("%w: a fleet is required", ErrConfig)
	case c.gatherer == nil:
		return fmt.Errorf("%w: a metrics gatherer is required", ErrConfig)
	case c.idle <= 0:
		return fmt.Errorf("%w: the idle timeout must be positive", ErrConfig)
	case c.maxConns < 1 || c.maxConnsPerIP < 1:
		return fmt.Errorf("%w: the connection bounds must be at least 1", ErrConfig)
	case c.tokenBurst < 1 || c.tokenInterval <= 0:
		return fmt.Errorf("%w: the wrong-token allowance must be at least 1 per positive interval", ErrConfig)
	}
	return nil
}

// Server is the admin HTTP server of one Ferry member.
type Server struct {
	cfg     config
	mux     *http.ServeMux
	srv     *http.Server
	started time.Time

	// probes caches cluster checks briefly, so that a probe storm does not
	// become a dial storm.
	probeMu sync.Mutex
	probes  map[string]probe

	// clusters are the configured clusters, those retired taken out
	// (RetireCluster replaces the slice).
	clusters atomic.Pointer[[]upstream.Config]

	metrics *switchMetrics // nil without WithRegisterer
	// acceptErrors counts the accept errors retried (Serve).
	acceptErrors *prometheus.CounterVec
	// tokens limits wrong tokens per address; authFailures counts refused
	// requests by reason, connsRefused the connections over the bound;
	// refusalLogs samples the lines about both.
	tokens       *clientauth.TokenBuckets
	authFailures *prometheus.CounterVec
	connsRefused *prometheus.CounterVec
	refusalLogs  *logsample.Sampler
}

type probe struct {
	at  time.Time
	err error
}

// New builds an admin server.
func New(opts ...Option) (*Server, error) {
	cfg := config{
		version:  "dev",
		log:      zap.NewNop(),
		started:  func() bool { return true },
		check:    DialCheck(time.Second),
		now:      time.Now,
		probeTTL: 2 * time.Second,
		idle:     2 * time.Minute,

		maxConns:      DefaultMaxConnections,
		maxConnsPerIP: DefaultMaxConnectionsPerIP,
		tokenBurst:    DefaultTokenFailureBurst,
		tokenInterval: DefaultTokenFailureInterval,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), started: cfg.now(), probes: map[string]probe{},
		tokens: clientauth.NewTokenBuckets(cfg.tokenBurst, cfg.tokenInterval, tokenGuardMax, nil), refusalLogs: logsample.New(refusalLogInterval)}
	s.clusters.Store(&cfg.clusters)
	// ContinueOnError: a collector that fails (the process collector
	// cannot open /proc files when the process is out of descriptors) must
	// not hide every other metric when they are most needed.
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.gatherer, promhttp.HandlerOpts{ErrorLog: zap.NewStdLog(cfg.log), ErrorHandling: promhttp.ContinueOnError}))
	s.mux.HandleFunc("GET /healthz", s.HandleHealthz)
	s.mux.HandleFunc("GET /readyz", s.HandleReadyz)
	s.mux.HandleFunc("GET /status", s.HandleStatus)
	s.mux.HandleFunc("GET /status/mirror", s.HandleMirror)
	s.mux.HandleFunc("GET /status/routing", s.HandleRouting)
	s.handleUI()
	s.handleProfiles()
	if cfg.connz != nil {
		s.mux.HandleFunc("GET /connections", s.HandleConnections)
	}
	if cfg.switchFn != nil {
		s.HandleMutating(http.MethodPost, "/switchover", http.HandlerFunc(s.HandleSwitchover))
	}
	if cfg.restartFn != nil {
		s.HandleMutating(http.MethodPost, "/mirror/restart", http.HandlerFunc(s.HandleMirrorRestart))
	}
	if cfg.haltFn != nil {
		s.HandleMutating(http.MethodPost, "/mirror/halt", http.HandlerFunc(s.HandleMirrorHalt))
	}
	s.mux.HandleFunc("GET /failover", s.HandleFailover)
	if cfg.pauseFn != nil {
		s.HandleMutating(http.MethodPost, "/failover/pause", s.HandleFailoverPause(true))
		s.HandleMutating(http.MethodPost, "/failover/resume", s.HandleFailoverPause(false))
	}
	s.acceptErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "admin_accept_errors_total",
		Help: "Errors accepting an admin API connection that were retried (out of file descriptors and the like), by reason."}, []string{"reason"})
	s.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "admin_auth_failures_total",
		Help: "Admin API requests refused for their token, by reason: no_token, invalid_token, rate_limited (too many wrong tokens from the address)."}, []string{"reason"})
	for _, r := range []string{authNoToken, authInvalidToken, ReasonRateLimited} {
		s.authFailures.WithLabelValues(r)
	}
	s.connsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "admin_connections_refused_total",
		Help: "Admin API connections closed as soon as accepted, by the bound they were over: max_connections (admin_max_connections open), max_connections_per_ip (admin_max_connections_per_ip open from the address)."}, []string{"reason"})
	for _, r := range []string{refusedMax, refusedPerIP} {
		s.connsRefused.WithLabelValues(r)
	}
	if cfg.registerer != nil {
		s.metrics = newSwitchMetrics(cfg.routes)
		if err := cfg.registerer.Register(s.metrics); err != nil {
			return nil, fmt.Errorf("%w: registering the switchover metrics: %v", ErrConfig, err)
		}
		for _, c := range []prometheus.Collector{s.acceptErrors, s.authFailures, s.connsRefused} {
			if err := cfg.registerer.Register(c); err != nil {
				return nil, fmt.Errorf("%w: registering the admin metrics: %v", ErrConfig, err)
			}
		}
	}
	// Timeouts, so that a client that stops reading or writing, or keeps a
	// connection open doing nothing, does not hold a descriptor for ever.
	// The write timeout is generous: /status probes clusters and /metrics
	// of a large mirror is big. Accept errors (out of descriptors) are
	// retried by Serve's listener.
	s.srv = &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
		IdleTimeout:       cfg.idle,
		ErrorLog:          zap.NewStdLog(cfg.log),
	}
	return s, nil
}

// Handle adds an endpoint that only reads (HandleMutating for one that
// changes something). Call it before Serve.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the admin API as an http.Handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve answers admin requests on ln until Close; it returns nil after
// Close.
func (s *Server) Serve(ln net.Listener) error {
	// Out of file descriptors: retried like the Kafka listener's, counted
	// and logged once per interval (net/http would log every retry).
	ln = listen.New(ln, s.cfg.log, "an admin API", func(reason string) { s.acceptErrors.WithLabelValues(reason).Inc() }, nil, nil)
	// Bounded below the process's descriptors, so that the admin port
	// cannot take those the Kafka listeners need.
	ln = newLimitListener(ln, s.cfg.maxConns, s.cfg.maxConnsPerIP, s.refuseConn)
	if s.cfg.tls != nil {
		ln = tls.NewListener(ln, s.cfg.tls)
	}
	err := s.srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the server; safe to call more than once. In order: stop
// accepting, then give requests in progress a second to finish, then close
// what is left.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return s.srv.Close()
	}
	return nil
}

// HandleHealthz answers 200 while the process serves HTTP at all.
func (s *Server) HandleHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// Ready returns nil when this member can serve clients: the proxy has
// started and the active cluster is reachable. Otherwise the error says
// why and wraps ErrNotReady.
func (s *Server) Ready(ctx context.Context) error {
	if !s.cfg.started() {
		return fmt.Errorf("%w: proxy not started (waiting for the clusters)", ErrNotReady)
	}
	if s.cfg.readiness != nil {
		if err := s.cfg.readiness(); err != nil {
			return fmt.Errorf("%w: %v", ErrNotReady, err)
		}
	}
	if s.cfg.authReady != nil {
		if err := s.cfg.authReady(); err != nil {
			return fmt.Errorf("%w: %v", ErrNotReady, err)
		}
	}
	active := s.cfg.routes.Current().Active
	for _, c := range *s.clusters.Load() {
		if c.Name == active {
			if err := s.checkCluster(ctx, c); err != nil {
				return fmt.Errorf("%w: active cluster %q unreachable: %v", ErrNotReady, c.Name, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: active cluster %q is not configured", ErrNotReady, active)
}

// RetireCluster takes a cluster out of those /status lists and /readyz may
// check: the member no longer serves it.
func (s *Server) RetireCluster(name string) {
	next := slices.DeleteFunc(slices.Clone(*s.clusters.Load()), func(c upstream.Config) bool { return c.Name == name })
	s.clusters.Store(&next)
}

// HandleReadyz answers 200 "ready" or 503 with the reason.
func (s *Server) HandleReadyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := s.Ready(r.Context()); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	fmt.Fprintln(w, "ready")
}

// Status is what /status reports.
type Status struct {
	Version  string          `json:"version"`
	Node     Node            `json:"node"`
	Ready    bool            `json:"ready"`
	NotReady string          `json:"not_ready,omitempty"`
	Routing  RoutingStatus   `json:"routing"`
	Clusters []ClusterStatus `json:"clusters"`
	Fleet    []Broker        `json:"fleet"`
	Members  []Member        `json:"members,omitempty"`
	Mirror   MirrorStatus    `json:"mirror"`
	// Failover is automatic failover as this member sees it; absent when
	// it is off.
	Failover      *failover.Status `json:"failover,omitempty"`
	Process       Process          `json:"process"`
	StartedAt     time.Time        `json:"started_at"`
	UptimeSeconds float64          `json:"uptime_seconds"`

	// Auth is the state of authentication: OAUTHBEARER's keys, the
	// identities a cluster refuses now.
	Auth *AuthStatus `json:"auth,omitempty"`
	// Redacted names the fields emptied for a reader without the admin
	// token (StatusRedactedFields).
	Redacted []string `json:"redacted,omitempty"`
}

// StatusRedactedFields are what GET /status empties without the admin
// token (unless WithPublicRead): the client principals a cluster refuses,
// and the errors, which name the upstream user mapped to each. As with
// GET /connections, who uses Ferry is behind the token.
var StatusRedactedFields = []string{"auth.upstream_failures.principal", "auth.upstream_failures.error"}

// ClusterStatus is one configured physical cluster.
type ClusterStatus struct {
	Name      string   `json:"name"`
	Bootstrap []string `json:"bootstrap"`
	Active    bool     `json:"active"`
	Reachable bool     `json:"reachable"`
	Error     string   `json:"error,omitempty"`
	// Security is how Ferry connects to it: PLAINTEXT, SSL, SASL_SSL
	// SCRAM-SHA-512 as <user>... Never a secret.
	Security string `json:"security"`
	// AuthFailed says the cluster refused Ferry's credentials (or they
	// could not be read): Error says which and where.
	AuthFailed bool `json:"auth_failed,omitempty"`
}

// Broker is one member of the virtual cluster as clients see it.
type Broker struct {
	NodeID int32   `json:"node_id"`
	Host   string  `json:"host"`
	Port   int32   `json:"port"`
	Rack   *string `json:"rack,omitempty"`
}

// Member is one member of the fleet as gossip knows it.
type Member struct {
	NodeID int32 `json:"node_id"`
	// State is alive, suspect, dead or left.
	State string `json:"state"`
	Self  bool   `json:"self,omitempty"`
	// Host and Ports are where clients reach it (its lanes).
	Host  string  `json:"host"`
	Ports []int32 `json:"ports"`
	// Gossip and Admin are its gossip and admin addresses.
	Gossip  string `json:"gossip"`
	Admin   string `json:"admin,omitempty"`
	Version string `json:"version,omitempty"`
	// Generation is the routing generation it serves, as it answered
	// (as its gossip says when it did not answer).
	Generation uint32 `json:"generation"`
	// GossipGeneration is the generation its gossiped metadata carries:
	// the same, or behind while gossip catches up.
	GossipGeneration uint32 `json:"gossip_generation"`
	// Connections and MirrorPartitions are its client connections and the
	// mirrored partitions it writes, as it last answered (-1: it did not).
	Connections      int `json:"connections"`
	MirrorPartitions int `json:"mirror_partitions"`
	// Starting: it gossips that it does not decide automatic failovers
	// (still starting, or automatic failover off there).
	Starting bool `json:"starting,omitempty"`
}

// Alive returns the node IDs of the members s lists alive, in order.
func (s Status) Alive() []int32 {
	var ids []int32
	for _, m := range s.Members {
		if m.State == "alive" {
			ids = append(ids, m.NodeID)
		}
	}
	slices.Sort(ids)
	return ids
}

// Status returns this member's view of itself, the routing state, the
// clusters, the fleet and the mirror.
func (s *Server) Status(ctx context.Context) Status {
	st := s.cfg.routes.Current()
	out := Status{
		Version:       s.cfg.version,
		Node:          s.cfg.node,
		Routing:       routingStatus(st),
		Clusters:      []ClusterStatus{},
		Fleet:         []Broker{},
		Mirror:        s.Mirror(ctx),
		Process:       processStatus(),
		StartedAt:     s.started.UTC(),
		UptimeSeconds: s.cfg.now().Sub(s.started).Seconds(),
	}
	if s.cfg.failover != nil {
		fs := s.cfg.failover()
		out.Failover = &fs
	}
	if err := s.Ready(ctx); err != nil {
		out.NotReady = err.Error()
	} else {
		out.Ready = true
	}
	for _, c := range *s.clusters.Load() {
		cs := ClusterStatus{Name: c.Name, Bootstrap: c.Bootstrap, Active: c.Name == st.Active, Reachable: true, Security: c.Security.Describe()}
		if err := s.checkCluster(ctx, c); err != nil {
			cs.Reachable, cs.Error, cs.AuthFailed = false, err.Error(), clusterauth.AuthFailed(err)
		}
		out.Clusters = append(out.Clusters, cs)
	}
	for _, b := range s.cfg.brokers.Brokers() {
		out.Fleet = append(out.Fleet, Broker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack})
	}
	if s.cfg.members != nil {
		out.Members = s.cfg.members(ctx)
	}
	if s.cfg.auth != nil {
		a := s.cfg.auth()
		out.Auth = &a
	}
	return out
}

// HandleStatus answers Status as indented JSON, with the
// StatusRedactedFields emptied for a reader without the token.
func (s *Server) HandleStatus(w http.ResponseWriter, r *http.Request) {
	cred, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	st := s.Status(r.Context())
	if s.redacts(cred) && st.Auth != nil && len(st.Auth.UpstreamFailures) > 0 {
		a := *st.Auth
		a.UpstreamFailures = slices.Clone(a.UpstreamFailures)
		for i := range a.UpstreamFailures {
			a.UpstreamFailures[i].Principal, a.UpstreamFailures[i].Error = "", ""
		}
		st.Auth, st.Redacted = &a, StatusRedactedFields
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(st); err != nil {
		s.cfg.log.Debug("writing /status", zap.Error(err))
	}
}

// HandleRouting answers the routing state in force as indented JSON, in
// full: besides what /status shows, the fences (each partition's end offset
// on the cluster that took over, for every generation that ended, the last
// MaxFences of them) and the voided generations. After a forced switch the
// last fence is where the old cluster's copy of each partition stops being
// the new one's: what the old cluster holds beyond it, once it is back, is
// what the switch lost, including what its last_switch.lost could not see.
func (s *Server) HandleRouting(w http.ResponseWriter, _ *http.Request) {
	st := s.cfg.routes.Current()
	if st.Phase == "" {
		st.Phase = routing.PhaseServing
	}
	writeJSON(w, http.StatusOK, st)
}

// checkCluster runs the cluster check, reusing a recent result.
func (s *Server) checkCluster(ctx context.Context, c upstream.Config) error {
	now := s.cfg.now()
	s.probeMu.Lock()
	p, ok := s.probes[c.Name]
	s.probeMu.Unlock()
	if ok && now.Sub(p.at) < s.cfg.probeTTL {
		return p.err
	}
	err := s.cfg.check(ctx, c)
	s.probeMu.Lock()
	s.probes[c.Name] = probe{at: now, err: err}
	s.probeMu.Unlock()
	return err
}

// DialCheck returns a ClusterCheck that succeeds when a connection to any
// of the cluster's bootstrap servers opens within timeout: TCP, and with
// TLS or SASL configured the handshake and authentication too, so that
// refused credentials show.
func DialCheck(timeout time.Duration) ClusterCheck {
	return func(ctx context.Context, c upstream.Config) error {
		d := timeout
		if c.Security.Enabled() {
			// A handshake and a login take longer than a TCP connect.
			d = max(d, 5*time.Second)
		}
		return c.Security.Check(ctx, d, c.Bootstrap)
	}
}
