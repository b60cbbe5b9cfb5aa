package proxy

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

type config struct {
	refuseUnmapped     bool
	clusterID          string
	clusters           []upstream.Config
	brokers            routing.BrokerSet
	routes             *routing.Table
	writeLease         WriteLease
	peers              Peers
	heldAnswerAfter    time.Duration
	log                *zap.Logger
	reg                prometheus.Registerer
	maxRequestSize     int32
	maxResponseSize    int32
	metadataInterval   time.Duration
	dialTimeout        time.Duration
	maxConnsPerBroker  int
	lanes              int
	idleConnsPerBroker int
	// upstreamIdleTimeout closes pooled upstream connections unused for
	// that long (beyond idleConnsPerBroker).
	upstreamIdleTimeout time.Duration
	spliceFetches       bool
	spliceProduces      bool
	standbyWait         time.Duration
	connectionsMaxIdle  time.Duration
	// lameDuck spreads Shutdown's closing of idle connections, their turns
	// at most lameDuckMaxGap apart.
	lameDuck, lameDuckMaxGap time.Duration
	requestReadTimeout       time.Duration
	writeTimeout             time.Duration
	// Client connection limits (limits.go); 0: none.
	maxConnections, maxConnectionsPerIP int
	perIPOverrides                      map[string]int
	// settings is what validate built of the fields above, the Server's
	// Settings at start.
	settings Settings
	// policyAllow and policyDeny change the request policy's defaults;
	// validate builds policy from them.
	policyAllow, policyDeny []string
	policy                  policy
	// refusalLogEvery is the sampling interval of refusal log lines: at
	// most one per reason per interval.
	refusalLogEvery time.Duration
	// Memory budgets (upstream.Budget).
	connBufferBudget    int64
	processBufferBudget int64
	// connStats turns on the per-connection counters (connstats.Stats);
	// clientMetricsLimit bounds the per-client series (connstats.ClientMetrics).
	connStats          bool
	clientMetricsLimit int
	// clientTLS and clientSASL secure the Kafka listeners (tls.go,
	// auth.go); nil: plaintext, no authentication.
	clientTLS  *clientauth.TLSConfig
	clientSASL *clientauth.SASLConfig
	// internalTopics are Ferry's own topics, hidden from clients
	// (internal_topics.go).
	internalTopics []string
}

func defaultConfig() config {
	return config{
		log:                 zap.NewNop(),
		maxRequestSize:      protocol.DefaultMaxFrameSize,
		maxResponseSize:     1 << 30,
		metadataInterval:    30 * time.Second,
		dialTimeout:         10 * time.Second,
		maxConnsPerBroker:   4096,
		idleConnsPerBroker:  16,
		connBufferBudget:    upstream.DefaultConnBufferBudget,
		processBufferBudget: upstream.DefaultProcessBufferBudget,
		upstreamIdleTimeout: time.Minute,
		spliceFetches:       true,
		spliceProduces:      true,
		standbyWait:         30 * time.Second,
		heldAnswerAfter:     defaultHeldAnswerAfter,
		connectionsMaxIdle:  defaultConnectionsMaxIdle,
		requestReadTimeout:  defaultRequestReadTimeout,
		writeTimeout:        defaultWriteTimeout,
		lameDuckMaxGap:      defaultLameDuckMaxGap,
		refusalLogEvery:     10 * time.Second,
		connStats:           true,
		clientMetricsLimit:  connstats.DefaultClientMetricsLimit,
	}
}

// Option configures a Server.
type Option func(*config)

// WithClusterID sets the virtual cluster's ID that clients see (required).
func WithClusterID(id string) Option { return func(c *config) { c.clusterID = id } }

// WithClusters sets the physical clusters; the routing table says which is
// active (required). The ApiVersions Ferry advertises work on all of them.
func WithClusters(cs ...upstream.Config) Option { return func(c *config) { c.clusters = cs } }

// WithBrokerSet sets the Ferry members clients see as brokers (required).
func WithBrokerSet(f routing.BrokerSet) Option { return func(c *config) { c.brokers = f } }

// WithRoutingTable sets the routing state (default: generation 0, the first
// cluster active).
func WithRoutingTable(t *routing.Table) Option { return func(c *config) { c.routes = t } }

// WriteLease is a fleet member's permission to write (routing.Lease).
type WriteLease interface {
	// Left is how long writes may still be forwarded from now; 0 or
	// less: not now.
	Left() time.Duration
	// Changed returns a channel closed at the next renewal.
	Changed() <-chan struct{}
}

// WithWriteLease makes writes wait while the lease is not in force, as they
// wait during a switch's hold (default: none, always in force: a member on
// its own).
func WithWriteLease(l WriteLease) Option { return func(c *config) { c.writeLease = l } }

// WithPeers lets this member ask the fleet's other members (txn_fleet.go);
// HandleTxnCall must then answer their calls of kind TxnCallKind (default:
// none, a member on its own).
func WithPeers(p Peers) Option { return func(c *config) { c.peers = p } }

// WithHeldAnswerAfter sets how long a request waits in a switch's hold
// before it is answered with its retriable error (default 10 s, hold.go).
func WithHeldAnswerAfter(d time.Duration) Option { return func(c *config) { c.heldAnswerAfter = d } }

// WithLogger sets the logger.
func WithLogger(l *zap.Logger) Option { return func(c *config) { c.log = l } }

// WithRegisterer registers Ferry's metrics there.
func WithRegisterer(r prometheus.Registerer) Option { return func(c *config) { c.reg = r } }

// WithMaxRequestSize bounds a client's request frame, like Kafka's
// socket.request.max.bytes.
func WithMaxRequestSize(n int32) Option { return func(c *config) { c.maxRequestSize = n } }

// WithMetadataInterval sets how often the upstream metadata cache refreshes
// when nothing forces it.
func WithMetadataInterval(d time.Duration) Option { return func(c *config) { c.metadataInterval = d } }

// WithMaxConnsPerBroker bounds the upstream connections to one broker
// (default 4096). A client holds one only while it has requests in flight
// there, so this bounds the clients busy at once, not those connected; a
// request that finds every one checked out waits up to 2 s for one, then is
// answered with its API's retriable error.
func WithMaxConnsPerBroker(n int) Option { return func(c *config) { c.maxConnsPerBroker = n } }

// WithIdleConnsPerBroker sets how many idle upstream connections per broker
// are kept however long unused (default 16); idle ones beyond that close
// after a minute.
func WithIdleConnsPerBroker(n int) Option { return func(c *config) { c.idleConnsPerBroker = n } }

// WithLanes sets how many virtual brokers each member presents (default:
// as many as the largest configured cluster has brokers at start).
func WithLanes(n int) Option { return func(c *config) { c.lanes = n } }

// WithSpliceFetches sets whether large Fetch answers from one broker are
// streamed to the client with splice(2) (default true); false reads every
// answer whole.
func WithSpliceFetches(on bool) Option { return func(c *config) { c.spliceFetches = on } }

// WithSpliceProduces sets whether the record batches of a large Produce
// move from the client's socket to the broker's through a kernel pipe
// (default true; produce_splice.go); false reads every request whole.
func WithSpliceProduces(on bool) Option { return func(c *config) { c.spliceProduces = on } }

// WithBufferBudget bounds the bytes of client requests and broker answers
// Ferry holds in memory, per client connection and for the whole Server
// (defaults DefaultConnBufferBudget, DefaultProcessBufferBudget). A client
// whose connection, or the process, holds its budget or more is not read
// until bytes are released (the process budget is Kafka's
// queued.max.request.bytes); nothing is refused for it, and a frame larger
// than a budget is read once there is room.
func WithBufferBudget(perConnection, perProcess int64) Option {
	return func(c *config) { c.connBufferBudget, c.processBufferBudget = perConnection, perProcess }
}

// WithStandbyWait sets how long Start waits for clusters other than the
// active one (default 30s) before serving without them.
func WithStandbyWait(d time.Duration) Option { return func(c *config) { c.standbyWait = d } }

// WithConnectionsMaxIdle closes a client connection that has been idle
// this long, like Kafka's connections.max.idle.ms (default 10 minutes). Idle
// means no request being read and none in flight: a request parked
// upstream, such as a long-poll Fetch, keeps the connection busy.
func WithConnectionsMaxIdle(d time.Duration) Option {
	return func(c *config) { c.connectionsMaxIdle = d }
}

// WithRequestReadTimeout closes a client connection when a request whose
// first byte arrived is not complete this much later (default 30s).
func WithRequestReadTimeout(d time.Duration) Option {
	return func(c *config) { c.requestReadTimeout = d }
}

// WithLameDuck sets the period over which Shutdown spreads the closing of
// idle client connections (default 0: all at once). Their turns are at
// most 10ms apart: only from 100 connections a second of the period is
// used.
func WithLameDuck(d time.Duration) Option { return func(c *config) { c.lameDuck = d } }

// WithDialTimeout bounds connecting to a broker (default 10s).
func WithDialTimeout(d time.Duration) Option { return func(c *config) { c.dialTimeout = d } }

// WithWriteTimeout closes a client connection that has not taken an
// answer this long after Ferry began writing it (default 60s).
func WithWriteTimeout(d time.Duration) Option { return func(c *config) { c.writeTimeout = d } }

// WithConnectionLimits bounds the client connections the Server accepts:
// in all (Kafka's max.connections), from one source IP
// (max.connections.per.ip), and from some IPs their own limit
// (max.connections.per.ip.overrides); 0 is no limit, the default. A
// connection over a limit is closed as soon as it is accepted.
func WithConnectionLimits(max, perIP int, overrides map[string]int) Option {
	return func(c *config) { c.maxConnections, c.maxConnectionsPerIP, c.perIPOverrides = max, perIP, overrides }
}

// WithRequestPolicy changes which classes of request clients may send
// through Ferry (policy.go): allow adds classes to those allowed by
// default, deny takes classes out. An unknown class name, or one named in
// both, is a configuration error.
func WithRequestPolicy(allow, deny []string) Option {
	return func(c *config) { c.policyAllow, c.policyDeny = allow, deny }
}

// WithConnectionStats sets whether each client connection counts its bytes,
// requests by API, error codes and latencies for Connz and the per-client
// metrics (default true). Off, Connz still lists the connections, with
// those counts at zero, and the per-client metrics have no series.
func WithConnectionStats(on bool) Option { return func(c *config) { c.connStats = on } }

// WithClientMetricsLimit sets how many distinct (client_id, software) pairs
// get per-client metric series of their own (default
// connstats.DefaultClientMetricsLimit); the rest are counted as "other". Servers
// sharing a registry share the series, and the first one's limit.
func WithClientMetricsLimit(n int) Option { return func(c *config) { c.clientMetricsLimit = n } }

// WithClientTLS serves TLS on the Kafka listeners (tls.go): every client
// connection is TLS, optionally with verified client certificates, whose
// subject becomes the principal.
func WithClientTLS(t clientauth.TLSConfig) Option { return func(c *config) { c.clientTLS = &t } }

// WithClientSASL requires SASL authentication on the Kafka listeners
// (auth.go): before it succeeds, a connection is answered ApiVersions,
// SaslHandshake and SaslAuthenticate only.
func WithClientSASL(s clientauth.SASLConfig) Option { return func(c *config) { c.clientSASL = &s } }

// WithRefuseUnmapped refuses clients whose principal no cluster maps to
// credentials (Cluster.Principals): their authentication fails, instead
// of their requests going on Ferry's own identity (principals.go).
func WithRefuseUnmapped(refuse bool) Option { return func(c *config) { c.refuseUnmapped = refuse } }

// WithInternalTopics hides Ferry's own topics (the routing state's) from
// clients and refuses them every request naming one, as Kafka treats a
// topic the client may not describe (internal_topics.go). Default: none.
func WithInternalTopics(names ...string) Option {
	return func(c *config) { c.internalTopics = names }
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("invalid proxy configuration")

func (c *config) validate() error {
	switch {
	case c.clusterID == "":
		return fmt.Errorf("%w: a virtual cluster ID is required", ErrConfig)
	case len(c.clusters) == 0:
		return fmt.Errorf("%w: at least one physical cluster is required", ErrConfig)
	case c.brokers == nil || len(c.brokers.Brokers()) == 0:
		return fmt.Errorf("%w: the fleet has no members", ErrConfig)
	case c.maxRequestSize < 1024:
		return fmt.Errorf("%w: max request size %d is below 1 KiB", ErrConfig, c.maxRequestSize)
	case c.lanes < 0 || c.lanes >= laneStride:
		return fmt.Errorf("%w: lanes must be between 1 and %d (0: automatic)", ErrConfig, laneStride-1)
	case c.dialTimeout <= 0:
		return fmt.Errorf("%w: dial timeout %s must be positive", ErrConfig, c.dialTimeout)
	case c.maxConnsPerBroker < 1:
		return fmt.Errorf("%w: max connections per broker must be positive", ErrConfig)
	case c.connBufferBudget < upstream.MinBufferBudget:
		return fmt.Errorf("%w: buffer budget per connection %d is below %d bytes", ErrConfig, c.connBufferBudget, upstream.MinBufferBudget)
	case c.processBufferBudget < c.connBufferBudget:
		return fmt.Errorf("%w: buffer budget %d is below the budget per connection %d", ErrConfig, c.processBufferBudget, c.connBufferBudget)
	case c.idleConnsPerBroker < 0:
		return fmt.Errorf("%w: idle connections per broker must not be negative", ErrConfig)
	case c.clientMetricsLimit < 0:
		return fmt.Errorf("%w: client metrics limit %d is negative", ErrConfig, c.clientMetricsLimit)
	}
	c.settings = Settings{
		ConnectionsMaxIdle: c.connectionsMaxIdle, RequestReadTimeout: c.requestReadTimeout, WriteTimeout: c.writeTimeout,
		MaxConnections: c.maxConnections, MaxConnectionsPerIP: c.maxConnectionsPerIP, PerIPOverrides: c.perIPOverrides,
		LameDuck: c.lameDuck,
	}
	if err := c.settings.validate(); err != nil {
		return err
	}
	if c.clientTLS != nil {
		if err := c.clientTLS.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	if c.clientSASL != nil {
		if err := c.clientSASL.Validate(c.clientTLS != nil); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	if slices.Contains(c.internalTopics, "") {
		return fmt.Errorf("%w: an internal topic needs a name", ErrConfig)
	}
	p, err := newPolicy(c.policyAllow, c.policyDeny)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c.policy = p
	seen := map[string]bool{}
	for _, cl := range c.clusters {
		if cl.Name == "" || len(cl.Bootstrap) == 0 {
			return fmt.Errorf("%w: cluster %q needs a name and bootstrap servers", ErrConfig, cl.Name)
		}
		if seen[cl.Name] {
			return fmt.Errorf("%w: cluster %q named twice", ErrConfig, cl.Name)
		}
		seen[cl.Name] = true
	}
	if c.routes == nil {
		c.routes = routing.NewTable(routing.State{Active: c.clusters[0].Name})
	}
	if !seen[c.routes.Current().Active] {
		return fmt.Errorf("%w: active cluster %q is not configured", ErrConfig, c.routes.Current().Active)
	}
	return nil
}
