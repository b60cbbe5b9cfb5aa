package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"gopkg.in/yaml.v3"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/upstream"
)

// Config is the file `ferry serve --config FILE` reads (YAML). Every key is
// listed in README.md; docs/ferry.example.yaml is a complete example. A key
// Ferry does not know is an error, so a typo never silently falls back to a
// default. Every key can also be set by the environment, FERRY_<KEY>
// (env.go), derived from the yaml tags: a new key needs nothing more. A
// key SIGHUP can change while the member runs is listed in reloadable
// (reload.go); every other is read once, at start.
type Config struct {
	// ClusterID is the virtual cluster's ID, the one clients see. It must
	// stay the same across restarts and switchovers. Required.
	ClusterID string `yaml:"cluster_id"`
	// NodeID is this member's broker ID in the virtual cluster. Default 0.
	NodeID int32 `yaml:"node_id"`
	// Listen is the address of the Kafka listener. Default 0.0.0.0:9092.
	Listen string `yaml:"listen"`
	// AdvertisedHost is the host clients are told to connect to. Default:
	// the host of Listen, or the machine's hostname when Listen binds every
	// interface.
	AdvertisedHost string `yaml:"advertised_host"`
	// AdvertisedPort is the port clients are told to connect to. Default:
	// the port Listen is bound to.
	AdvertisedPort int `yaml:"advertised_port"`
	// TLS serves TLS on the Kafka listener (every lane). Without it the
	// listener is plaintext.
	TLS *ListenerTLSConfig `yaml:"tls"`
	// SASL requires clients of the Kafka listener to authenticate
	// (docs/SECURITY.md, "Towards clients"). Without it they do not.
	SASL *ListenerSASLConfig `yaml:"sasl"`
	// AdminListen is the address of the admin HTTP API (/metrics, /healthz,
	// /readyz, /status, POST /switchover). Default 0.0.0.0:9644.
	AdminListen string `yaml:"admin_listen"`
	// AdminTokenFile names a file holding the token the admin endpoints
	// that change something (POST /switchover) require, as
	// "Authorization: Bearer <token>"; whitespace around it is ignored.
	// The environment variable FERRY_ADMIN_TOKEN, when set, overrides it
	// (the file is then not read).
	AdminTokenFile string `yaml:"admin_token_file"`
	// AdminOpen allows admin_listen on an address other machines reach
	// with no token: anyone who reaches it can switch the active cluster.
	// Without it that is a configuration error. Default false.
	AdminOpen bool `yaml:"admin_open"`
	// AdminTLS serves the admin API over TLS, with the keys of tls (the
	// files read again when they change). With client_auth require, only
	// clients presenting a certificate the client CA verifies are served,
	// and such a certificate stands for the admin token on the endpoints
	// that change something (with request, a verified one does).
	AdminTLS *ListenerTLSConfig `yaml:"admin_tls"`
	// AdminMaxConnections bounds the admin API's open connections; one
	// over it is closed as soon as it is accepted. At start it must be at
	// most a quarter of the file descriptor limit, so that the admin port
	// cannot take the descriptors the Kafka listeners need. Default 64.
	AdminMaxConnections int `yaml:"admin_max_connections"`
	// AdminMaxConnectionsPerIP bounds those from one source address, so
	// that one client cannot take them all from the probes and scrapers.
	// Default 16.
	AdminMaxConnectionsPerIP int `yaml:"admin_max_connections_per_ip"`
	// AdminPublicRead shows the client connections' principals, addresses
	// and close errors (GET /connections) without the admin token too.
	// Without it, once a token is set, they need the token. Default false.
	AdminPublicRead bool `yaml:"admin_public_read"`
	// adminToken is the token in force (resolveAdminToken).
	adminToken string
	// Clusters are the physical Kafka clusters behind Ferry: one, or two
	// (active and standby). Required.
	Clusters []ClusterConfig `yaml:"clusters"`
	// Active names the cluster that is active at generation 0, before any
	// switchover. Default: the first of Clusters.
	Active string `yaml:"active"`
	// Mirror configures the offset-preserving mirror from the active
	// cluster to the standby.
	Mirror MirrorConfig `yaml:"mirror"`
	// Lanes is how many virtual brokers this member presents, each on its
	// own port: listen's port, then the ports after it (advertised likewise
	// from advertised_port). Default 0: as many as the largest cluster has
	// brokers, so each physical leader gets a lane and clients pipeline
	// per leader as they would directly.
	Lanes int `yaml:"lanes"`
	// UpstreamMaxConnsPerBroker bounds the connections to one physical
	// broker. A client holds one only while it has requests in flight
	// there, so this bounds the clients busy at the same moment, not those
	// connected; a request that finds all in use waits up to 2 s, then is
	// answered with its API's retriable error. Default 4096.
	UpstreamMaxConnsPerBroker int `yaml:"upstream_max_connections_per_broker"`
	// UpstreamIdleConnsPerBroker is how many unused connections to each
	// broker are kept open however long; more than that close after a
	// minute unused. Default 16.
	UpstreamIdleConnsPerBroker *int `yaml:"upstream_idle_connections_per_broker"`
	// MaxRequestSize bounds a client's request frame in bytes, like Kafka's
	// socket.request.max.bytes. Default 104857600 (100 MiB).
	MaxRequestSize int64 `yaml:"max_request_size"`
	// BufferBudget bounds the bytes of client requests and broker answers
	// this member holds in memory, all client connections together; while
	// it is used up, no client's requests are read (nor broker answers read
	// ahead of clients) until bytes are released, like Kafka's
	// queued.max.request.bytes. Default 536870912 (512 MiB).
	BufferBudget int64 `yaml:"buffer_budget"`
	// BufferBudgetPerConnection is the same bound for each client
	// connection: a client whose answers wait for it to read, or whose
	// requests wait for their answers, is not read until it holds less.
	// Default 134217728 (128 MiB).
	BufferBudgetPerConnection int64 `yaml:"buffer_budget_per_connection"`
	// MetadataRefreshInterval is how often the upstream metadata is
	// refreshed when nothing forces it. Default 30s.
	MetadataRefreshInterval time.Duration `yaml:"metadata_refresh_interval"`
	// SpliceFetches: large Fetch answers from one broker are streamed to
	// the client, their record bytes moved between the sockets with
	// splice(2) (Linux) instead of read into Ferry and written out again.
	// Default true.
	SpliceFetches *bool `yaml:"splice_fetches"`
	// SpliceProduces: the record batches of a large Produce go from the
	// client's socket to the broker's through a kernel pipe (splice(2),
	// Linux), the request's other fields and every batch header read and
	// checked as ever. Default true.
	SpliceProduces *bool `yaml:"splice_produces"`
	// ConnectionsMaxIdle closes a client connection idle this long (no
	// request being read, none in flight), like Kafka's
	// connections.max.idle.ms. Default 10m.
	ConnectionsMaxIdle time.Duration `yaml:"connections_max_idle"`
	// RequestReadTimeout closes a client connection whose request started
	// arriving but is not complete this much later. Default 30s.
	RequestReadTimeout time.Duration `yaml:"request_read_timeout"`
	// ClientWriteTimeout closes a client connection that has not taken an
	// answer this long after Ferry began writing it. Default 60s.
	ClientWriteTimeout time.Duration `yaml:"client_write_timeout"`
	// MaxConnections bounds the client connections this member accepts,
	// every lane together, like Kafka's max.connections; a connection over
	// it is closed as soon as it is accepted. Default 0: no limit.
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerIP bounds the client connections from one source
	// address, like Kafka's max.connections.per.ip. Default 0: no limit.
	MaxConnectionsPerIP int `yaml:"max_connections_per_ip"`
	// MaxConnectionsPerIPOverrides gives some source addresses (IPs) a
	// limit of their own, like Kafka's max.connections.per.ip.overrides
	// (0: none). In the environment: 10.0.0.5=1000,10.0.0.6=0.
	MaxConnectionsPerIPOverrides map[string]int `yaml:"max_connections_per_ip_overrides"`
	// LameDuckDuration: on SIGTERM the member leaves the fleet, stops
	// accepting, and closes its client connections as they finish, the
	// idle ones spread over this period so that their clients do not all
	// reconnect to the other members at once. Default 5s.
	LameDuckDuration *time.Duration `yaml:"lame_duck_duration"`
	// ShutdownTimeout bounds the rest of a graceful stop after the
	// lame-duck period: requests already read are answered within it (a
	// long-poll fetch waits at most its MaxWait), then everything is
	// closed. Default 15s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// UpstreamDialTimeout bounds connecting to a broker. Default 10s.
	UpstreamDialTimeout time.Duration `yaml:"upstream_dial_timeout"`
	// ConnectionStats: each client connection counts its bytes, requests
	// by API, error codes and recent latencies, for GET /connections and
	// the ferry_clients_* metrics. Default true.
	ConnectionStats *bool `yaml:"connection_stats"`
	// ClientMetricsLimit is how many distinct (client_id, software) pairs
	// get ferry_clients_* series of their own; later pairs count as
	// "other", so a fleet of clients cannot grow the label set without
	// bound. Default 100.
	ClientMetricsLimit *int `yaml:"client_metrics_limit"`
	// Fleet joins this member to other Ferry members by gossip, so that
	// they serve as one virtual cluster. Without it the member is on its
	// own.
	Fleet *FleetConfig `yaml:"fleet"`
	// Failover makes the fleet switch the active cluster by force on its
	// own when the active cluster is gone (package failover). Off by
	// default.
	Failover FailoverConfig `yaml:"failover"`
	// Policy says which kinds of request clients may send through Ferry,
	// which reaches the clusters under its own identity.
	Policy PolicyConfig `yaml:"policy"`
	// UnmappedPrincipals says what becomes of a client whose principal no
	// cluster maps (clusters[].principals): service (default), its
	// requests go on Ferry's own identity; refuse, its authentication
	// fails. One key for every cluster: every cluster maps the same
	// principals, so a switch never changes who is let in.
	UnmappedPrincipals string `yaml:"unmapped_principals"`
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`
}

// ListenerTLSConfig is the Kafka listener's TLS. The files are read again
// when they change, so a renewed certificate needs no restart.
type ListenerTLSConfig struct {
	// CertFile and KeyFile are the listener's certificate (chain) and
	// private key, PEM. Required.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile is the CA bundle (PEM) client certificates are verified
	// against; required with client_auth request or require.
	ClientCAFile string `yaml:"client_ca_file"`
	// ClientAuth is none, request (a certificate is verified when the
	// client presents one) or require. A verified certificate's subject
	// is the connection's principal, "User:CN=...,O=...". Default none.
	ClientAuth string `yaml:"client_auth"`
	// MinVersion is the oldest TLS version accepted, "1.2" or "1.3".
	// Default "1.2".
	MinVersion string `yaml:"min_version"`
}

// ListenerSASLConfig is the Kafka listener's SASL authentication.
type ListenerSASLConfig struct {
	// Mechanisms offered: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN,
	// OAUTHBEARER. Required.
	Mechanisms []string `yaml:"mechanisms"`
	// CredentialsFile is the user store of SCRAM and PLAIN, written by
	// `ferry users add`; it holds salted keys, never passwords, and is
	// read again when it changes.
	CredentialsFile string `yaml:"credentials_file"`
	// AllowPlainWithoutTLS offers PLAIN on a listener without tls, which
	// sends passwords in the clear. Default false: a configuration error.
	AllowPlainWithoutTLS bool `yaml:"allow_plain_without_tls"`
	// OAuth validates OAUTHBEARER tokens (JWTs).
	OAuth OAuthSection `yaml:"oauth"`
	// FailedLoginBurst failed authentications are allowed for one user
	// from one source address, then FailedLoginBurst per
	// FailedLoginInterval; beyond, that user is refused from that address
	// until its allowance refills. Defaults 10 and 1m.
	FailedLoginBurst    int           `yaml:"failed_login_burst"`
	FailedLoginInterval time.Duration `yaml:"failed_login_interval"`
	// FailedLoginAddressBurst failed authentications are allowed from one
	// source address, whatever the users, then that many per
	// FailedLoginInterval. Default 10 times FailedLoginBurst.
	FailedLoginAddressBurst int `yaml:"failed_login_address_burst"`
	// FailedLoginDelay delays the answer to a failed authentication, as
	// Kafka's connection.failed.authentication.delay.ms. Default 100ms.
	FailedLoginDelay time.Duration `yaml:"failed_login_delay"`
	// MaxReceiveSize is the largest frame read from a client before it
	// has authenticated, as Kafka's sasl.server.max.receive.size.
	// Default 524288.
	MaxReceiveSize int `yaml:"max_receive_size"`
	// AuthenticationTimeout closes a connection not authenticated this
	// long after it was accepted. Default 30s.
	AuthenticationTimeout time.Duration `yaml:"authentication_timeout"`
	// MaxUnauthenticatedPerIP bounds the connections from one source
	// address not authenticated yet. Default 64.
	MaxUnauthenticatedPerIP int `yaml:"max_unauthenticated_per_ip"`
}

// OAuthSection configures SASL/OAUTHBEARER.
type OAuthSection struct {
	// JWKSFile or JWKSURL (one) holds the keys tokens are signed with.
	JWKSFile string `yaml:"jwks_file"`
	JWKSURL  string `yaml:"jwks_url"`
	// Issuer and Audience, when set, must match the token's iss and aud.
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// PrincipalClaim is the claim naming the principal. Default sub.
	PrincipalClaim string `yaml:"principal_claim"`
}

// proxyTLS is the proxy's form of the tls section.
func (t *ListenerTLSConfig) proxyTLS() clientauth.TLSConfig {
	return clientauth.TLSConfig{CertFile: t.CertFile, KeyFile: t.KeyFile, ClientCAFile: t.ClientCAFile, ClientAuth: t.ClientAuth, MinVersion: t.MinVersion}
}

// proxySASL is the proxy's form of the sasl section.
func (s *ListenerSASLConfig) proxySASL() clientauth.SASLConfig {
	return clientauth.SASLConfig{
		Mechanisms: s.Mechanisms, CredentialsFile: s.CredentialsFile, AllowPlainWithoutTLS: s.AllowPlainWithoutTLS,
		OAuth: clientauth.OAuthConfig{JWKSFile: s.OAuth.JWKSFile, JWKSURL: s.OAuth.JWKSURL, Issuer: s.OAuth.Issuer,
			Audience: s.OAuth.Audience, PrincipalClaim: s.OAuth.PrincipalClaim},
		FailedBurst: s.FailedLoginBurst, FailedInterval: s.FailedLoginInterval, FailedDelay: s.FailedLoginDelay,
		FailedAddressBurst: s.FailedLoginAddressBurst,
		PreAuth:            clientauth.PreAuthLimits{MaxReceiveSize: s.MaxReceiveSize, Timeout: s.AuthenticationTimeout, MaxPerIP: s.MaxUnauthenticatedPerIP},
	}
}

func (c *Config) applyListenerDefaults() {
	for _, t := range []*ListenerTLSConfig{c.TLS, c.AdminTLS} {
		if t == nil {
			continue
		}
		if t.ClientAuth == "" {
			t.ClientAuth = clientauth.ClientAuthNone
		}
		if t.MinVersion == "" {
			t.MinVersion = "1.2"
		}
	}
	if s := c.SASL; s != nil {
		if s.FailedLoginBurst == 0 {
			s.FailedLoginBurst = clientauth.DefaultFailedAuthBurst
		}
		if s.FailedLoginAddressBurst == 0 {
			s.FailedLoginAddressBurst = clientauth.DefaultFailedAuthAddressFactor * s.FailedLoginBurst
		}
		if s.FailedLoginInterval == 0 {
			s.FailedLoginInterval = clientauth.DefaultFailedAuthInterval
		}
		if s.FailedLoginDelay == 0 {
			s.FailedLoginDelay = clientauth.DefaultFailedAuthDelay
		}
		if s.MaxReceiveSize == 0 {
			s.MaxReceiveSize = clientauth.DefaultSASLMaxReceiveSize
		}
		if s.AuthenticationTimeout == 0 {
			s.AuthenticationTimeout = clientauth.DefaultAuthenticationTimeout
		}
		if s.MaxUnauthenticatedPerIP == 0 {
			s.MaxUnauthenticatedPerIP = clientauth.DefaultMaxUnauthenticatedPerIP
		}
		if slices.Contains(s.Mechanisms, clientauth.MechanismOAuthBearer) && s.OAuth.PrincipalClaim == "" {
			s.OAuth.PrincipalClaim = "sub"
		}
	}
}

// validateListener checks the tls and sasl sections; the files are read
// when the member starts.
func (c *Config) validateListener() []error {
	var errs []error
	if c.TLS != nil {
		pt := c.TLS.proxyTLS()
		if err := pt.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.AdminTLS != nil {
		pt := c.AdminTLS.proxyTLS()
		if err := pt.Validate(); err != nil {
			// The proxy names the keys of tls; these are admin_tls's.
			errs = append(errs, errors.New("admin_"+err.Error()))
		}
	}
	if c.SASL != nil {
		ps := c.SASL.proxySASL()
		if err := ps.Validate(c.TLS != nil); err != nil {
			errs = append(errs, err)
		}
		if c.SASL.FailedLoginInterval < time.Second && c.SASL.FailedLoginInterval != 0 {
			errs = append(errs, fmt.Errorf("sasl.failed_login_interval %s: must be at least 1s", c.SASL.FailedLoginInterval))
		}
		if d := c.SASL.AuthenticationTimeout; d > 0 && d < time.Second {
			errs = append(errs, fmt.Errorf("sasl.authentication_timeout %s: must be at least 1s", d))
		}
	}
	return errs
}

// FleetConfig is the fleet section: how this member finds and talks to the
// other members.
// FailoverConfig is the automatic failover policy.
type FailoverConfig struct {
	// Automatic turns it on.
	Automatic bool `yaml:"automatic"`
	// After is how long a member must have failed to reach the active
	// cluster, with the standby answering, to vote for a switch; a
	// majority of the members known must vote. Default 30s.
	After time.Duration `yaml:"after"`
	// MaxLoss bounds what an automatic switch may lose: the mirror's lag
	// when the active cluster was last read. At least one is required.
	MaxLoss struct {
		Records *int64 `yaml:"records"`
		Seconds *int64 `yaml:"seconds"`
	} `yaml:"max_loss"`
	// MinInterval is how long after any switch no automatic one is made.
	// Default 10m.
	MinInterval time.Duration `yaml:"min_interval"`
	// Quorum is "majority" (the only one): more than half of the members
	// known, alive or not, that did not leave.
	Quorum string `yaml:"quorum"`
}

func (f *FailoverConfig) applyDefaults() {
	if f.After == 0 {
		f.After = 30 * time.Second
	}
	if f.MinInterval == 0 {
		f.MinInterval = 10 * time.Minute
	}
	if f.Quorum == "" {
		f.Quorum = "majority"
	}
}

func (f *FailoverConfig) validate(c *Config) []error {
	if !f.Automatic {
		return nil
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Clusters) != 2 {
		bad("failover.automatic: two clusters are needed, an active one and a standby")
	}
	if !c.Mirror.enabled() {
		bad("failover.automatic: the mirror must run (the loss an automatic switch may make is its lag)")
	}
	if f.After < 5*time.Second {
		bad("failover.after %s: must be at least 5s", f.After)
	}
	if f.MinInterval < 0 {
		bad("failover.min_interval %s: must not be negative", f.MinInterval)
	}
	r, s := f.MaxLoss.Records, f.MaxLoss.Seconds
	switch {
	case r == nil && s == nil:
		bad("failover.max_loss: set records, seconds or both: the most an automatic switch may lose (the mirror's lag at the failure)")
	case r != nil && *r < 0:
		bad("failover.max_loss.records %d: must be 0 or more", *r)
	case s != nil && *s < 0:
		bad("failover.max_loss.seconds %d: must be 0 or more", *s)
	}
	if f.Quorum != "majority" {
		bad("failover.quorum %q: only majority is supported", f.Quorum)
	}
	return errs
}

// policy is f as package failover takes it.
func (f *FailoverConfig) policy() failover.Policy {
	p := failover.Policy{After: f.After, MinInterval: f.MinInterval, MaxLossRecords: -1, MaxLossSeconds: -1}
	if f.MaxLoss.Records != nil {
		p.MaxLossRecords = *f.MaxLoss.Records
	}
	if f.MaxLoss.Seconds != nil {
		p.MaxLossSeconds = float64(*f.MaxLoss.Seconds)
	}
	return p
}

type FleetConfig struct {
	// Bind is the gossip address (TCP and UDP). Default 0.0.0.0:7946.
	Bind string `yaml:"bind"`
	// Advertise is the gossip address the other members reach this one
	// at, when it is not Bind's (NAT, a container). Default: Bind's, or
	// the machine's private address when Bind is every interface.
	Advertise string `yaml:"advertise"`
	// Seeds are members to join: host:port entries, or a DNS name with a
	// port that resolves to several addresses (a Kubernetes headless
	// Service), resolved again at each attempt. Empty: this member starts
	// the fleet and the others join it.
	Seeds []string `yaml:"seeds"`
	// KeyFile holds the gossip encryption key: base64 of 16, 24 or 32
	// random bytes (`head -c 32 /dev/urandom | base64`). Every member needs
	// the same key; without it gossip is in the clear and anyone reaching
	// the port can join.
	KeyFile string `yaml:"key_file"`
	// WriteLease is how long a member may forward writes after it last
	// read, from the active cluster, that its generation still serves
	// there; a planned switch waits one lease before the flip, so that a
	// member cut off from the fleet has stopped writing to the old cluster
	// (docs/ARCHITECTURE.md). Default 1.5s.
	WriteLease time.Duration `yaml:"write_lease"`
}

// PolicyConfig changes the request policy's defaults (README.md lists the
// classes, their APIs and defaults). Produce, consume, groups,
// transactions and read-only requests are always allowed.
type PolicyConfig struct {
	// Allow adds request classes to those allowed by default.
	Allow []string `yaml:"allow"`
	// Deny takes request classes out of those allowed.
	Deny []string `yaml:"deny"`
}

// ClusterConfig is one physical Kafka cluster.
type ClusterConfig struct {
	// Name identifies the cluster in the routing state, logs and metrics.
	Name string `yaml:"name"`
	// Bootstrap lists host:port of some of its brokers.
	Bootstrap []string `yaml:"bootstrap"`
	// TLS encrypts Ferry's connections to the cluster (its proxy, mirror
	// and routing store alike): ca_file, cert_file, key_file,
	// server_name, min_version. Default: plaintext.
	TLS *clusterauth.TLS `yaml:"tls,omitempty"`
	// SASL authenticates Ferry to the cluster: mechanism (PLAIN,
	// SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER), username, and the
	// secret from a file or the environment (password_file,
	// password_env, token_file, token_env, token_endpoint with
	// client_id and client_secret_file or client_secret_env). A password
	// written in the file is refused. Default: none.
	SASL *clusterauth.SASL `yaml:"sasl,omitempty"`
	// Principals maps client principals to their own credentials on the
	// cluster, so that the brokers' ACLs see each application: the
	// requests of a client authenticated to Ferry as one of them go on
	// connections authenticated with its sasl section (same rules as the
	// cluster's sasl; the cluster's tls applies). Every cluster must map
	// the same principals. Default: none (every client goes on Ferry's
	// identity, or is refused with unmapped_principals: refuse).
	Principals []PrincipalConfig `yaml:"principals,omitempty"`
}

// PrincipalConfig is one client principal's credentials on a cluster.
type PrincipalConfig struct {
	// Principal is the client's principal as Ferry knows it after
	// authentication: User:<SASL user or token principal>, or User:<the
	// certificate's distinguished name>.
	Principal string `yaml:"principal"`
	// SASL is how Ferry authenticates to the cluster on its behalf.
	SASL *clusterauth.SASL `yaml:"sasl"`
}

// principalKey names a principal's entry in messages.
func principalKey(i int, cl ClusterConfig, j int) string {
	return fmt.Sprintf("clusters[%d] (%s) principals[%d] (%s)", i, cl.Name, j, cl.Principals[j].Principal)
}

// validatePrincipals checks clusters[].principals and
// unmapped_principals.
func (c *Config) validatePrincipals() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	sets := make([]map[string]bool, len(c.Clusters))
	mapped := false
	for i, cl := range c.Clusters {
		sets[i] = map[string]bool{}
		for j, p := range cl.Principals {
			key := principalKey(i, cl, j)
			switch {
			case !strings.HasPrefix(p.Principal, "User:") || len(p.Principal) == len("User:"):
				bad("%s: principal must be User:<name>, as Ferry names an authenticated client (User:alice)", key)
			case sets[i][p.Principal]:
				bad("%s: mapped twice", key)
			}
			sets[i][p.Principal] = true
			mapped = true
			if p.SASL == nil {
				bad("%s: sasl is required: the credentials Ferry uses on the cluster for this principal", key)
				continue
			}
			errs = append(errs, clusterauth.Validate(key, nil, p.SASL)...)
		}
	}
	if mapped {
		for i, cl := range c.Clusters {
			for k, other := range c.Clusters {
				if k == i {
					continue
				}
				var missing []string
				for p := range sets[i] {
					if !sets[k][p] {
						missing = append(missing, p)
					}
				}
				slices.Sort(missing)
				if len(missing) > 0 {
					bad("clusters[%d] (%s) principals: %s mapped on %s but not here; every cluster must map the same principals, or a switch would take their identity away",
						k, other.Name, strings.Join(missing, ", "), cl.Name)
				}
			}
		}
	}
	switch c.UnmappedPrincipals {
	case "", "service":
	case "refuse":
		if c.SASL == nil && (c.TLS == nil || c.TLS.ClientCAFile == "") {
			bad("unmapped_principals: refuse needs clients with principals: sasl, or tls with client_ca_file (client certificates)")
		}
	default:
		bad("unmapped_principals %q: want service (Ferry's own identity) or refuse", c.UnmappedPrincipals)
	}
	return errs
}

// principals builds each cluster's mapped principals' credentials, with
// the cluster's TLS (secs), reading every secret file once.
func (c *Config) principals(secs map[string]*clusterauth.Security) (map[string]map[string]*clusterauth.Security, error) {
	out := make(map[string]map[string]*clusterauth.Security, len(c.Clusters))
	var errs []error
	for i, cl := range c.Clusters {
		if len(cl.Principals) == 0 {
			continue
		}
		m := make(map[string]*clusterauth.Security, len(cl.Principals))
		for j, p := range cl.Principals {
			sec, err := secs[cl.Name].WithSASL(cl.Name, principalKey(i, cl, j), p.SASL)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			m[p.Principal] = sec
		}
		out[cl.Name] = m
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w:\n  %w", ErrInvalidConfig, joinLines(errs))
	}
	return out, nil
}

// security builds the clusters' TLS and SASL, by name, reading every file
// named once so that an unreadable one fails at start.
func (c *Config) security() (map[string]*clusterauth.Security, error) {
	out := make(map[string]*clusterauth.Security, len(c.Clusters))
	var errs []error
	for _, cl := range c.Clusters {
		sec, err := clusterauth.New(cl.Name, cl.TLS, cl.SASL)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[cl.Name] = sec
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w:\n  %w", ErrInvalidConfig, joinLines(errs))
	}
	return out, nil
}

// MirrorConfig is the mirror's section: what is copied from the active
// cluster to the standby, and how often the metadata is synchronised.
type MirrorConfig struct {
	// Enabled runs the mirror, active → standby. Default: true when two
	// clusters are configured, false with one.
	Enabled *bool `yaml:"enabled"`
	// Topics selects the mirrored topics. Default: every topic that is not
	// internal; a topic whose name starts with "__" is never mirrored.
	Topics Selection `yaml:"topics"`
	// Groups selects the consumer groups whose committed offsets are
	// copied. Default: every group.
	Groups Selection `yaml:"groups"`
	// SyncInterval is how often topics, partitions, configs, group offsets
	// and ACLs are synchronised, and new topics picked up. Default 5s.
	SyncInterval time.Duration `yaml:"sync_interval"`
	// InFlight is how many Produce requests each partition writer keeps in
	// flight to the standby, 1 to mirror.MaxInFlight. Default 128.
	InFlight int `yaml:"inflight"`
	// MaxConnections is how many broker connections the mirror holds
	// before a partition writer that has caught up parks at once instead
	// of waiting up to 15 s for more (mirror.ConnectionBudget). Default 0:
	// a quarter of the process's file descriptor limit.
	MaxConnections int `yaml:"max_connections"`
	// SyncGroups copies consumer group offsets. Default true.
	SyncGroups *bool `yaml:"sync_groups"`
	// SyncACLs copies ACLs. Default true.
	SyncACLs *bool `yaml:"sync_acls"`
	// RecompressCompacted: a compressed source batch the log cleaner left
	// with holes inside it (a broker refuses it as it is) is split into
	// runs of consecutive records, each compressed again with the batch's
	// codec. false halts the partition instead. Default true.
	RecompressCompacted *bool `yaml:"recompress_compacted"`
}

// Selection picks names by regular expressions (Go syntax, RE2), each
// matched against the whole name: a name is selected when it matches one
// of Include (or Include is empty) and none of Exclude.
type Selection struct {
	Include []string `yaml:"include"`
	Exclude []string `yaml:"exclude"`
}

// Defaults for Config.
const (
	defaultListen          = "0.0.0.0:9092"
	defaultAdminListen     = "0.0.0.0:9644"
	defaultMetadataRefresh = 30 * time.Second
	defaultLogLevel        = "info"
	defaultUpstreamConns   = 4096
	defaultUpstreamIdle    = 16
	// The proxy's defaults; see proxy/idle.go for why these values.
	defaultConnectionsMaxIdle = 10 * time.Minute
	defaultRequestReadTimeout = 30 * time.Second
	defaultClientWriteTimeout = 60 * time.Second
	defaultLameDuck           = 5 * time.Second
	defaultShutdownTimeout    = 15 * time.Second
	defaultDialTimeout        = 10 * time.Second
	defaultMirrorSync         = 5 * time.Second
	defaultMirrorInFlight     = 128
	defaultFleetBind          = "0.0.0.0:7946"
	defaultWriteLease         = 1500 * time.Millisecond
)

// applyDefaults fills every key left out. hostname is used for the
// advertised host when the listener binds every interface.
func (c *Config) applyDefaults(hostname func() (string, error)) {
	if c.Listen == "" {
		c.Listen = defaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = defaultAdminListen
	}
	if c.AdminMaxConnections == 0 {
		c.AdminMaxConnections = admin.DefaultMaxConnections
	}
	if c.AdminMaxConnectionsPerIP == 0 {
		c.AdminMaxConnectionsPerIP = admin.DefaultMaxConnectionsPerIP
	}
	if c.Active == "" && len(c.Clusters) > 0 {
		c.Active = c.Clusters[0].Name
	}
	c.Failover.applyDefaults()
	if c.MaxRequestSize == 0 {
		c.MaxRequestSize = protocol.DefaultMaxFrameSize
	}
	if c.SpliceFetches == nil {
		c.SpliceFetches = ptr(true)
	}
	if c.SpliceProduces == nil {
		c.SpliceProduces = ptr(true)
	}
	if c.ConnectionStats == nil {
		c.ConnectionStats = ptr(true)
	}
	if c.ClientMetricsLimit == nil {
		c.ClientMetricsLimit = ptr(connstats.DefaultClientMetricsLimit)
	}
	if c.BufferBudget == 0 {
		c.BufferBudget = upstream.DefaultProcessBufferBudget
	}
	if c.BufferBudgetPerConnection == 0 {
		c.BufferBudgetPerConnection = upstream.DefaultConnBufferBudget
	}
	if c.UpstreamMaxConnsPerBroker == 0 {
		c.UpstreamMaxConnsPerBroker = defaultUpstreamConns
	}
	if c.UpstreamIdleConnsPerBroker == nil {
		c.UpstreamIdleConnsPerBroker = ptr(defaultUpstreamIdle)
	}
	if c.MetadataRefreshInterval == 0 {
		c.MetadataRefreshInterval = defaultMetadataRefresh
	}
	if c.ConnectionsMaxIdle == 0 {
		c.ConnectionsMaxIdle = defaultConnectionsMaxIdle
	}
	if c.RequestReadTimeout == 0 {
		c.RequestReadTimeout = defaultRequestReadTimeout
	}
	if c.ClientWriteTimeout == 0 {
		c.ClientWriteTimeout = defaultClientWriteTimeout
	}
	if c.LameDuckDuration == nil {
		c.LameDuckDuration = ptr(defaultLameDuck)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = defaultShutdownTimeout
	}
	if c.UpstreamDialTimeout == 0 {
		c.UpstreamDialTimeout = defaultDialTimeout
	}
	if c.LogLevel == "" {
		c.LogLevel = defaultLogLevel
	}
	if c.UnmappedPrincipals == "" {
		c.UnmappedPrincipals = "service"
	}
	c.applyListenerDefaults()
	c.Mirror.applyDefaults(len(c.Clusters))
	if f := c.Fleet; f != nil {
		if f.Bind == "" {
			f.Bind = defaultFleetBind
		}
		if f.WriteLease == 0 {
			f.WriteLease = defaultWriteLease
		}
	}
	if c.AdvertisedHost == "" {
		if host, _, err := net.SplitHostPort(c.Listen); err == nil {
			if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
				if h, err := hostname(); err == nil {
					host = h
				}
			}
			c.AdvertisedHost = host
		}
	}
}

func (m *MirrorConfig) applyDefaults(clusters int) {
	if m.Enabled == nil {
		m.Enabled = ptr(clusters == 2)
	}
	if m.SyncInterval == 0 {
		m.SyncInterval = defaultMirrorSync
	}
	if m.InFlight == 0 {
		m.InFlight = defaultMirrorInFlight
	}
	if m.SyncGroups == nil {
		m.SyncGroups = ptr(true)
	}
	if m.SyncACLs == nil {
		m.SyncACLs = ptr(true)
	}
	if m.RecompressCompacted == nil {
		m.RecompressCompacted = ptr(true)
	}
}

func ptr[T any](v T) *T { return &v }

// enabled reports whether the mirror runs (after defaults).
func (m *MirrorConfig) enabled() bool { return m.Enabled != nil && *m.Enabled }

// ErrInvalidConfig is wrapped by every error of a configuration that was
// read but cannot be used.
var ErrInvalidConfig = errors.New("invalid configuration")

var clusterName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// validate checks a configuration after defaults, and returns every problem
// found at once, each naming the key.
func (c *Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if strings.TrimSpace(c.ClusterID) == "" {
		bad("cluster_id is required: the virtual cluster's ID that clients see")
	}
	if c.NodeID < 0 {
		bad("node_id %d: must be 0 or more", c.NodeID)
	}
	if err := checkAddr(c.Listen, true); err != nil {
		bad("listen %q: %v", c.Listen, err)
	}
	if err := checkAddr(c.AdminListen, true); err != nil {
		bad("admin_listen %q: %v", c.AdminListen, err)
	} else if !c.AdminOpen && c.adminToken == "" && c.AdminTokenFile == "" && !isLoopback(c.AdminListen) &&
		(c.AdminTLS == nil || c.AdminTLS.ClientAuth != clientauth.ClientAuthRequire) {
		bad("admin_listen %q: other machines can reach the admin API and no admin token is set, so anyone reaching it could switch the active cluster; "+
			"set admin_token_file (or the FERRY_ADMIN_TOKEN environment variable), require client certificates (admin_tls.client_auth: require), bind admin_listen to 127.0.0.1, or set admin_open: true to accept an open admin API", c.AdminListen)
	}
	if c.AdminMaxConnections < 1 {
		bad("admin_max_connections %d: must be 1 or more", c.AdminMaxConnections)
	}
	if c.AdminMaxConnectionsPerIP < 1 {
		bad("admin_max_connections_per_ip %d: must be 1 or more", c.AdminMaxConnectionsPerIP)
	}
	if c.AdvertisedHost == "" {
		bad("advertised_host is required: the host clients connect to")
	} else if ip := net.ParseIP(c.AdvertisedHost); ip != nil && ip.IsUnspecified() {
		bad("advertised_host %q: clients cannot connect to an unspecified address; name this machine", c.AdvertisedHost)
	}
	if c.AdvertisedPort < 0 || c.AdvertisedPort > 65535 {
		bad("advertised_port %d: must be between 1 and 65535 (or 0: the listener's port)", c.AdvertisedPort)
	}
	switch n := len(c.Clusters); {
	case n == 0:
		bad("clusters: at least one cluster is required, e.g. clusters: [{name: primary, bootstrap: [\"kafka-1:9092\"]}]")
	case n > 2:
		bad("clusters: %d configured; Ferry fronts one or two (active and standby)", n)
	}
	seen := map[string]bool{}
	for i, cl := range c.Clusters {
		switch {
		case cl.Name == "":
			bad("clusters[%d].name is required", i)
		case !clusterName.MatchString(cl.Name):
			bad("clusters[%d].name %q: use letters, digits, '.', '_' and '-'", i, cl.Name)
		case seen[cl.Name]:
			bad("clusters[%d].name %q: named twice", i, cl.Name)
		}
		seen[cl.Name] = true
		if len(cl.Bootstrap) == 0 {
			bad("clusters[%d] (%s): bootstrap needs at least one host:port", i, cl.Name)
		}
		for j, addr := range cl.Bootstrap {
			if err := checkAddr(addr, false); err != nil {
				bad("clusters[%d].bootstrap[%d] %q: %v", i, j, addr, err)
			}
		}
		errs = append(errs, clusterauth.Validate(fmt.Sprintf("clusters[%d] (%s)", i, cl.Name), cl.TLS, cl.SASL)...)
	}
	if len(c.Clusters) > 0 && !seen[c.Active] {
		bad("active %q: not one of the configured clusters", c.Active)
	}
	errs = append(errs, c.validatePrincipals()...)
	errs = append(errs, c.validateListener()...)
	errs = append(errs, c.Mirror.validate(len(c.Clusters))...)
	if c.Fleet != nil {
		errs = append(errs, c.Fleet.validate()...)
	}
	errs = append(errs, c.Failover.validate(c)...)
	errs = append(errs, c.Policy.validate()...)
	if c.Lanes < 0 || c.Lanes > 999 {
		bad("lanes %d: must be between 1 and 999 (or 0: as many as the largest cluster has brokers)", c.Lanes)
	}
	if c.UpstreamMaxConnsPerBroker < 1 {
		bad("upstream_max_connections_per_broker %d: must be 1 or more", c.UpstreamMaxConnsPerBroker)
	}
	if c.ClientMetricsLimit != nil && *c.ClientMetricsLimit < 0 {
		bad("client_metrics_limit %d: must be 0 or more", *c.ClientMetricsLimit)
	}
	if c.UpstreamIdleConnsPerBroker != nil && *c.UpstreamIdleConnsPerBroker < 0 {
		bad("upstream_idle_connections_per_broker %d: must be 0 or more", *c.UpstreamIdleConnsPerBroker)
	}
	if c.MaxRequestSize < 1024 || c.MaxRequestSize > 1<<31-1 {
		bad("max_request_size %d: must be between 1024 and 2147483647 bytes", c.MaxRequestSize)
	}
	if c.BufferBudgetPerConnection < upstream.MinBufferBudget {
		bad("buffer_budget_per_connection %d: must be at least %d bytes", c.BufferBudgetPerConnection, upstream.MinBufferBudget)
	}
	if c.BufferBudget < c.BufferBudgetPerConnection {
		bad("buffer_budget %d: must be at least buffer_budget_per_connection (%d)", c.BufferBudget, c.BufferBudgetPerConnection)
	}
	if c.MetadataRefreshInterval < time.Second {
		bad("metadata_refresh_interval %s: must be at least 1s", c.MetadataRefreshInterval)
	}
	if c.ConnectionsMaxIdle < time.Second {
		bad("connections_max_idle %s: must be at least 1s (Kafka's default is 10m)", c.ConnectionsMaxIdle)
	}
	if c.RequestReadTimeout < time.Second {
		bad("request_read_timeout %s: must be at least 1s (clients give a request 30s by default)", c.RequestReadTimeout)
	}
	if c.ClientWriteTimeout < time.Second {
		bad("client_write_timeout %s: must be at least 1s", c.ClientWriteTimeout)
	}
	if c.MaxConnections < 0 {
		bad("max_connections %d: must be 0 (no limit) or more", c.MaxConnections)
	}
	if c.MaxConnectionsPerIP < 0 {
		bad("max_connections_per_ip %d: must be 0 (no limit) or more", c.MaxConnectionsPerIP)
	}
	for _, ip := range slices.Sorted(maps.Keys(c.MaxConnectionsPerIPOverrides)) {
		if n := c.MaxConnectionsPerIPOverrides[ip]; net.ParseIP(ip) == nil || n < 0 {
			bad("max_connections_per_ip_overrides %s: %d: want an IP address and a limit of 0 (none) or more", ip, n)
		}
	}
	if d := *c.LameDuckDuration; d < 0 || d > 10*time.Minute {
		bad("lame_duck_duration %s: must be between 0 and 10m", d)
	}
	if c.ShutdownTimeout < time.Second {
		bad("shutdown_timeout %s: must be at least 1s", c.ShutdownTimeout)
	}
	if c.UpstreamDialTimeout < 100*time.Millisecond {
		bad("upstream_dial_timeout %s: must be at least 100ms", c.UpstreamDialTimeout)
	}
	if _, err := zapcore.ParseLevel(c.LogLevel); err != nil || !validLevels[c.LogLevel] {
		bad("log_level %q: must be debug, info, warn or error", c.LogLevel)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w:\n  %w", ErrInvalidConfig, joinLines(errs))
}

// validate checks the fleet section after defaults.
func (f *FleetConfig) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := checkAddr(f.Bind, true); err != nil {
		bad("fleet.bind %q: %v", f.Bind, err)
	}
	if f.Advertise != "" {
		if err := checkAddr(f.Advertise, false); err != nil {
			bad("fleet.advertise %q: %v", f.Advertise, err)
		}
	}
	for i, s := range f.Seeds {
		if err := checkAddr(s, false); err != nil {
			bad("fleet.seeds[%d] %q: %v", i, s, err)
		}
	}
	if f.WriteLease < 200*time.Millisecond || f.WriteLease > time.Minute {
		bad("fleet.write_lease %s: must be between 200ms and 1m", f.WriteLease)
	}
	return errs
}

// validate checks the mirror section after defaults. The settings are
// checked even when the mirror is disabled, so that enabling it later (or
// with --mirror) cannot reveal an old mistake.
func (m *MirrorConfig) validate(clusters int) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if m.enabled() && clusters != 2 {
		bad("mirror.enabled: the mirror copies the active cluster to the standby, so it needs two clusters (%d configured); set mirror.enabled: false or add the standby", clusters)
	}
	for _, sel := range []struct {
		key   string
		names []string
		topic bool // an include pattern may not name internal topics only
	}{
		{"mirror.topics.include", m.Topics.Include, true},
		{"mirror.topics.exclude", m.Topics.Exclude, false},
		{"mirror.groups.include", m.Groups.Include, false},
		{"mirror.groups.exclude", m.Groups.Exclude, false},
	} {
		for i, pat := range sel.names {
			re, err := compilePattern(pat)
			if err != nil {
				bad("%s[%d] %q: %v", sel.key, i, pat, unwrapRegexpErr(err))
				continue
			}
			if prefix, _ := re.LiteralPrefix(); sel.topic && strings.HasPrefix(prefix, "__") {
				bad("%s[%d] %q: topics whose name starts with \"__\" are internal and never mirrored", sel.key, i, pat)
			}
		}
	}
	if m.SyncInterval < time.Second {
		bad("mirror.sync_interval %s: must be at least 1s", m.SyncInterval)
	}
	if m.InFlight < 1 || m.InFlight > mirror.MaxInFlight {
		bad("mirror.inflight %d: must be between 1 and %d", m.InFlight, mirror.MaxInFlight)
	}
	if m.MaxConnections < 0 {
		bad("mirror.max_connections %d: must be 0 (a quarter of the file descriptor limit) or more", m.MaxConnections)
	}
	return errs
}

// validate checks that every class named is one, and in one list only.
func (p *PolicyConfig) validate() []error {
	var errs []error
	classes := proxy.RequestClasses()
	for _, l := range []struct {
		key   string
		names []string
	}{{"policy.allow", p.Allow}, {"policy.deny", p.Deny}} {
		for i, n := range l.names {
			if !slices.Contains(classes, n) {
				errs = append(errs, fmt.Errorf("%s[%d] %q: not a request class; the classes are %s", l.key, i, n, strings.Join(classes, ", ")))
			}
		}
	}
	for _, n := range p.Allow {
		if slices.Contains(p.Deny, n) {
			errs = append(errs, fmt.Errorf("policy: %q is in both allow and deny", n))
		}
	}
	return errs
}

// compilePattern compiles a selection pattern the way the mirror does:
// anchored, so it must match the whole name.
func compilePattern(p string) (*regexp.Regexp, error) {
	return regexp.Compile("^(?:" + p + ")$")
}

// unwrapRegexpErr is the part of a regexp error after "error parsing
// regexp: ", with the anchoring Ferry added removed from the expression.
func unwrapRegexpErr(err error) string {
	var se *syntax.Error
	if errors.As(err, &se) {
		expr := strings.TrimSuffix(strings.TrimPrefix(se.Expr, "^(?:"), ")$")
		return fmt.Sprintf("%s: `%s`", se.Code, expr)
	}
	return err.Error()
}

var validLevels = map[string]bool{"debug": true, "info": true, "warn": true, "error": true}

// checkAddr checks a host:port. A listen address may leave the host empty
// (every interface) and use port 0 (any free port); a bootstrap server may
// not.
func checkAddr(addr string, listen bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("not host:port (%v)", unwrapAddrErr(err))
	}
	if host == "" && !listen {
		return errors.New("the host is missing")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 || (p == 0 && !listen) {
		return fmt.Errorf("port %q is not a number between 1 and 65535", port)
	}
	return nil
}

func unwrapAddrErr(err error) string {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return ae.Err
	}
	return err.Error()
}

// isLoopback reports whether a listen address binds the loopback interface
// only: a loopback IP, or "localhost". Any other name may resolve to
// anything, so it counts as reachable from other machines.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// adminTokenEnv overrides admin_token_file.
const adminTokenEnv = "FERRY_ADMIN_TOKEN"

// resolveAdminToken sets the admin token from FERRY_ADMIN_TOKEN, or else
// from admin_token_file. The environment wins so that a container can be
// given its secret without changing the file. An unreadable or empty token
// file is an error: it was meant to protect the API.
func (c *Config) resolveAdminToken(getenv func(string) string, readFile func(string) ([]byte, error)) error {
	if t := strings.TrimSpace(getenv(adminTokenEnv)); t != "" {
		c.adminToken = t
		return nil
	}
	if c.AdminTokenFile == "" {
		return nil
	}
	b, err := readFile(c.AdminTokenFile)
	if err != nil {
		return fmt.Errorf("admin_token_file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return fmt.Errorf("admin_token_file %s is empty; put the admin token in it", c.AdminTokenFile)
	}
	c.adminToken = t
	return nil
}

// joinLines joins errors one per line, indented under the first line.
type joinLines []error

func (j joinLines) Error() string {
	s := make([]string, len(j))
	for i, e := range j {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n  ")
}

func (j joinLines) Unwrap() []error { return j }

// parseConfig reads a YAML configuration strictly: unknown keys, a second
// document and wrong types are errors that name the line.
func parseConfig(r io.Reader) (*Config, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the file is empty", ErrInvalidConfig)
		}
		return nil, fmt.Errorf("%w: %s", ErrInvalidConfig, yamlError(err))
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: only one YAML document is allowed", ErrInvalidConfig)
	}
	return &c, nil
}

var (
	unknownField = regexp.MustCompile(`field (\S+) not found in type \S+`)
	typeName     = regexp.MustCompile(` into (\S+)`)
)

// yamlError rewords yaml.v3's messages for an operator: "unknown key" instead
// of "field not found in type main.Config".
func yamlError(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return strings.TrimPrefix(err.Error(), "yaml: ")
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if sm := unknownField.FindStringSubmatch(m); sm != nil {
			if use, ok := clusterauth.SecretKeys[sm[1]]; ok && strings.Contains(sm[0], "clusterauth.") {
				msgs[i] = fmt.Sprintf("%s: a secret is never written in the configuration file: put it in a file or an environment variable and name it with %s",
					unknownField.ReplaceAllString(m, `key "$1"`), use)
				continue
			}
		}
		m = unknownField.ReplaceAllString(m, `unknown key "$1"`)
		m = typeName.ReplaceAllStringFunc(m, func(s string) string {
			switch {
			case strings.Contains(s, "time.Duration"):
				return " into a duration (e.g. 30s)"
			case strings.Contains(s, "int"):
				return " into a number"
			case strings.Contains(s, "[]"):
				return " into a list"
			}
			return s
		})
		msgs[i] = m
	}
	return strings.Join(msgs, "; ")
}

// loadConfig reads the file at path. Defaults are not applied yet, so that
// flags can override first.
func loadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := parseConfig(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
