package proxy

// Client authentication: SASL on the Kafka listeners (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512, OAUTHBEARER), as a Kafka broker's SASL listener does it
// (KIP-43, KIP-152). A connection starts unauthenticated; until a
// SaslHandshake (v1) and the SaslAuthenticate rounds of its mechanism
// succeed, only ApiVersions, SaslHandshake and SaslAuthenticate are
// answered. Any other request closes the connection (close reason
// unauthenticated_request), as Kafka's SaslServerAuthenticator does: the
// request reaches no cluster. A failed authentication is answered
// SASL_AUTHENTICATION_FAILED with a message saying why, after
// failedAuthDelay (Kafka's connection.failed.authentication.delay.ms),
// then the connection closes (auth_failed). Wrong password and unknown
// user get the same message, and the connection's record (its close
// error) the same reason, invalid_credentials, so neither tells which users
// exist; the log line has the same reason with the name claimed, and only
// ferry_client_auth_failures_total{mechanism,reason}, which names no user,
// tells them apart. SCRAM answers an unknown user as it would a real one
// (fakeCredential).
//
// Authentication attempts are limited by token buckets taken when an
// exchange starts and given back when it succeeds (loginlimit.go): per
// (user, source address), FailedBurst, then one per
// FailedInterval/FailedBurst; and per source address, FailedAddressBurst.
// A user out of tokens at an address is refused there, correct password or
// not, until the bucket refills; the same user at other addresses, and
// other users at the same address, are unaffected.
//
// The principal is "User:<name>" (Kafka's form): the SCRAM or PLAIN user,
// or the token's principal claim. It is shown in GET /connections and in
// the connection's log lines.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ClientSASL configures SASL on the Kafka listeners.
type ClientSASL struct {
	// Mechanisms offered, in the order a client is told them.
	Mechanisms []string
	// CredentialsFile is the credential store (credentials.go), for
	// SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN.
	CredentialsFile string
	// OAuth configures OAUTHBEARER.
	OAuth OAuthConfig
	// AllowPlainWithoutTLS offers PLAIN on a listener without TLS, where
	// passwords cross the network in the clear.
	AllowPlainWithoutTLS bool
	// FailedBurst failed authentications are allowed per user and source
	// address, then FailedBurst per FailedInterval (defaults 10 and 1m).
	FailedBurst    int
	FailedInterval time.Duration
	// FailedAddressBurst failed authentications are allowed per source
	// address whatever the users, then FailedAddressBurst per
	// FailedInterval (default 10 times FailedBurst).
	FailedAddressBurst int
	// FailedDelay delays the answer to a failed authentication (default
	// 100ms, as Kafka's connection.failed.authentication.delay.ms).
	FailedDelay time.Duration
	// PreAuth bounds connections until they authenticate (preauth.go).
	PreAuth PreAuthLimits

	// admitWait is loginAdmissionWait but in tests.
	admitWait time.Duration
}

// Defaults of ClientSASL.
const (
	DefaultFailedAuthBurst = 10
	// DefaultFailedAuthAddressFactor is FailedAddressBurst's default, as a
	// multiple of FailedBurst: an address guessing one user's password
	// leaves nine tenths of its budget to the other users behind it.
	DefaultFailedAuthAddressFactor = 10
	DefaultFailedAuthInterval      = time.Minute
	DefaultFailedAuthDelay         = 100 * time.Millisecond
)

// Mechanisms lists the SASL mechanisms Ferry can offer.
func Mechanisms() []string {
	return []string{MechanismSCRAMSHA512, MechanismSCRAMSHA256, MechanismPlain, MechanismOAuthBearer}
}

// Errors that close a connection during authentication; closeReason
// (idle.go) names them.
var (
	errUnauthenticatedRequest = errors.New("request before SASL authentication")
	errAuthFailed             = errors.New("SASL authentication failed")
	errAuthRateLimited        = errors.New("too many failed authentications from this address")
)

// reasonUnauthenticated is the refusal reason of a request before
// authentication.
const reasonUnauthenticated = "unauthenticated"

// authFailure is why an authentication failed: reason is the metric's
// label, msg what the client is told, user the name it claimed (logged).
type authFailure struct {
	reason string
	msg    string
	user   string
	err    error
}

func (f *authFailure) Error() string { return f.msg }
func (f *authFailure) Unwrap() error { return f.err }

// authFailureReasons are the reason labels of
// ferry_client_auth_failures_total, each series made at 0.
var authFailureReasons = map[string][]string{
	MechanismSCRAMSHA512: {"bad_password", "unknown_user", "malformed", "authzid", "unsupported", "rate_limited"},
	MechanismSCRAMSHA256: {"bad_password", "unknown_user", "malformed", "authzid", "unsupported", "rate_limited"},
	MechanismPlain:       {"bad_password", "unknown_user", "malformed", "authzid", "rate_limited"},
	MechanismOAuthBearer: {"invalid_token", "invalid_signature", "expired_token", "malformed", "rate_limited", "keys_unavailable"},
	"none":               {"unsupported_mechanism", "unauthenticated_request", "illegal_state"},
	"TLS":                {"not_tls", "bad_certificate", "no_certificate", "client_refused", "timeout", "handshake"},
}

// authMetrics count authentications.
type authMetrics struct {
	failures  *prometheus.CounterVec
	successes *prometheus.CounterVec
}

func newAuthMetrics(reg prometheus.Registerer) (*authMetrics, error) {
	m := &authMetrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "client_auth_failures_total",
			Help: "Failed client authentications (SASL, and TLS handshakes), by mechanism and reason."}, []string{"mechanism", "reason"}),
		successes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "client_auth_successes_total",
			Help: "Successful client authentications, by mechanism (TLS: a verified client certificate)."}, []string{"mechanism"}),
	}
	for _, c := range []**prometheus.CounterVec{&m.failures, &m.successes} {
		var err error
		if *c, err = registerShared(reg, *c); err != nil {
			return nil, err
		}
	}
	for mech, reasons := range authFailureReasons {
		for _, r := range reasons {
			m.failures.WithLabelValues(mech, r)
		}
		if mech != "none" {
			m.successes.WithLabelValues(mech)
		}
	}
	return m, nil
}

func (m *authMetrics) failed(mechanism, reason string) {
	if mechanism == "" {
		mechanism = "none"
	}
	m.failures.WithLabelValues(mechanism, reason).Inc()
}

// authenticator serves SASL for a server's listeners.
type authenticator struct {
	cfg   ClientSASL
	store *credentialStore
	oauth *oauthValidator
	// perUser and perAddr limit attempts (loginlimit.go).
	perUser *TokenBuckets
	perAddr *TokenBuckets
	secret  []byte // keys the fake salts and iterations of unknown users
}

// Validate checks the settings (not the files), for a listener with TLS
// or without; the errors name the keys of Ferry's configuration file.
func (c *ClientSASL) Validate(tlsOn bool) error {
	if len(c.Mechanisms) == 0 {
		return errors.New("sasl.mechanisms: name at least one of " + strings.Join(Mechanisms(), ", "))
	}
	seen := map[string]bool{}
	needStore := false
	for i, m := range c.Mechanisms {
		switch {
		case !slices.Contains(Mechanisms(), m):
			return fmt.Errorf("sasl.mechanisms[%d] %q: not a mechanism Ferry offers (%s)", i, m, strings.Join(Mechanisms(), ", "))
		case seen[m]:
			return fmt.Errorf("sasl.mechanisms[%d] %q: named twice", i, m)
		case m == MechanismPlain && !tlsOn && !c.AllowPlainWithoutTLS:
			return errors.New("sasl.mechanisms: PLAIN without tls sends passwords in the clear; configure tls, or set sasl.allow_plain_without_tls: true")
		}
		seen[m] = true
		needStore = needStore || m != MechanismOAuthBearer
	}
	switch {
	case needStore && c.CredentialsFile == "":
		return errors.New("sasl.credentials_file is required for SCRAM and PLAIN (create it with `ferry users add`)")
	case seen[MechanismOAuthBearer] && c.OAuth.JWKSFile == "" && c.OAuth.JWKSURL == "":
		return errors.New("sasl.oauth: OAUTHBEARER needs jwks_file or jwks_url")
	case !seen[MechanismOAuthBearer] && (c.OAuth.JWKSFile != "" || c.OAuth.JWKSURL != ""):
		return errors.New("sasl.oauth is set but OAUTHBEARER is not in sasl.mechanisms")
	case c.FailedBurst < 0:
		return fmt.Errorf("sasl.failed_login_burst %d: must not be negative", c.FailedBurst)
	case c.FailedAddressBurst < 0:
		return fmt.Errorf("sasl.failed_login_address_burst %d: must not be negative", c.FailedAddressBurst)
	case c.FailedInterval < 0:
		return fmt.Errorf("sasl.failed_login_interval %s: must not be negative", c.FailedInterval)
	case c.FailedDelay < 0:
		return fmt.Errorf("sasl.failed_login_delay %s: must not be negative", c.FailedDelay)
	}
	return c.PreAuth.Validate()
}

func newAuthenticator(cfg ClientSASL, tlsOn bool, log *zap.Logger) (*authenticator, error) {
	if err := cfg.Validate(tlsOn); err != nil {
		return nil, err
	}
	cfg.PreAuth = cfg.PreAuth.withDefaults()
	if cfg.FailedBurst == 0 {
		cfg.FailedBurst = DefaultFailedAuthBurst
	}
	if cfg.FailedAddressBurst == 0 {
		cfg.FailedAddressBurst = DefaultFailedAuthAddressFactor * cfg.FailedBurst
	}
	if cfg.FailedInterval == 0 {
		cfg.FailedInterval = DefaultFailedAuthInterval
	}
	if cfg.FailedDelay == 0 {
		cfg.FailedDelay = DefaultFailedAuthDelay
	}
	if cfg.admitWait == 0 {
		cfg.admitWait = loginAdmissionWait
	}
	a := &authenticator{cfg: cfg, secret: make([]byte, 32),
		perUser: NewTokenBuckets(cfg.FailedBurst, cfg.FailedInterval, loginLimiterMax, nil), perAddr: NewTokenBuckets(cfg.FailedAddressBurst, cfg.FailedInterval, loginLimiterMax, nil)}
	rand.Read(a.secret)
	warn := func(err error) { log.Warn("SASL configuration file", zap.Error(err)) }
	if cfg.CredentialsFile != "" {
		st, err := newCredentialStore(cfg.CredentialsFile, warn)
		if err != nil {
			return nil, fmt.Errorf("sasl.%w", err)
		}
		a.store = st
		if st.count() == 0 {
			log.Warn("the SASL credential store has no users yet: add them with `ferry users add`", zap.String("credentials_file", cfg.CredentialsFile))
		}
	}
	if slices.Contains(cfg.Mechanisms, MechanismOAuthBearer) {
		v, err := newOAuthValidator(cfg.OAuth, warn)
		if err != nil {
			return nil, fmt.Errorf("sasl.%w", err)
		}
		a.oauth = v
	}
	return a, nil
}

func (a *authenticator) offers(mech string) bool { return slices.Contains(a.cfg.Mechanisms, mech) }

// fakeSalt is the salt an unknown user is answered with: the same for a
// name every time, so probing twice shows nothing.
func (a *authenticator) fakeSalt(user string) []byte {
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte(user))
	return m.Sum(nil)
}

// fakeCredential is what an unknown user is answered with for mechanism:
// fakeSalt, and an iteration count of the store's (fakeIterations) chosen
// by a keyed hash of the name, apart from the salt's so that one does not
// predict the other.
func (a *authenticator) fakeCredential(user, mechanism string) SCRAMCredential {
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte("iterations\x00" + user))
	pick := binary.BigEndian.Uint64(m.Sum(nil))
	return SCRAMCredential{Salt: a.fakeSalt(user), Iterations: a.store.fakeIterations(mechanism, pick)}
}

// connAuth is a connection's SASL state, the reader goroutine's own.
type connAuth struct {
	mechanism string // chosen by the handshake
	scram     *scramServer
	admission *loginAdmission // the exchange's tokens (loginlimit.go)
	done      bool
	// closeAfter, set with an answer, closes the connection once it is
	// written.
	closeAfter error
}

// authenticated reports whether c may send requests beyond the SASL ones.
func (s *Server) authenticated(c *clientConn) bool { return s.auth == nil || c.auth.done }

// gateUnauthenticated refuses every request but ApiVersions, SaslHandshake
// and SaslAuthenticate before authentication.
func (s *Server) gateUnauthenticated(c *clientConn, req *request) error {
	switch req.hdr.Key {
	case int16(kmsg.ApiVersions), int16(kmsg.SASLHandshake), int16(kmsg.SASLAuthenticate):
		return nil
	}
	s.authMetrics.failed(c.auth.mechanism, "unauthenticated_request")
	return s.refuse(req.hdr.Key, reasonUnauthenticated, fmt.Errorf("%w: %s (key %d): the listener requires SASL authentication first; configure the client with security.protocol SASL_SSL or SASL_PLAINTEXT and a mechanism (%s)",
		errUnauthenticatedRequest, kmsg.NameForKey(req.hdr.Key), req.hdr.Key, strings.Join(s.auth.cfg.Mechanisms, ", ")))
}

// setPrincipal records who the connection authenticated as.
func (c *clientConn) setPrincipal(p string) {
	c.principal.Store(&p)
	c.ident = c.s.identity(p)
}

// principalName is the connection's principal, "" before authentication.
func (c *clientConn) principalName() string {
	if p := c.principal.Load(); p != nil {
		return *p
	}
	return ""
}

// logger is the connection's logger with its principal, once known.
func (c *clientConn) logger() *zap.Logger {
	if p := c.principalName(); p != "" {
		return c.log.With(zap.String("principal", p))
	}
	return c.log
}

// authFailed counts and logs a failed authentication and marks the
// connection to close once the answer is written.
func (s *Server) authFailed(c *clientConn, mech string, f *authFailure) {
	s.authMetrics.failed(mech, f.reason)
	if f.reason == "unmapped_principal" || f.reason == "keys_unavailable" {
		// The credentials were right, or not checked: no guess to count.
		s.auth.release(c.auth.admission)
	}
	fields := []zap.Field{zap.String("mechanism", mech), zap.String("auth_reason", recordedReason(f.reason)), zap.String("error", f.msg)}
	if f.user != "" {
		fields = append(fields, zap.String("user", f.user))
	}
	c.logRefusal(zapcore.InfoLevel, "auth_failed", "client authentication failed; closing the connection", fields...)
	err := errAuthFailed
	if f.reason == "rate_limited" {
		err = errAuthRateLimited
	}
	c.auth.closeAfter = fmt.Errorf("%w (%s, %s): %s", err, mech, recordedReason(f.reason), f.msg)
}

// recordedReason is a failure's reason as the connection's record keeps
// it (its close error, shown by GET /connections): a wrong password and an
// unknown user are both invalid_credentials there and in the log, as they
// are to the client, so neither tells which users exist: the log names
// the user claimed. Only the metric, which names no user, keeps them
// apart.
func recordedReason(reason string) string {
	if reason == "bad_password" || reason == "unknown_user" {
		return "invalid_credentials"
	}
	return reason
}

// authSucceeded records the principal.
func (s *Server) authSucceeded(c *clientConn, mech, principal string) {
	c.auth.done, c.auth.scram = true, nil
	s.auth.release(c.auth.admission)
	c.authenticatedNow()
	c.setPrincipal(principal)
	s.authMetrics.successes.WithLabelValues(mech).Inc()
	c.logger().Debug("client authenticated", zap.String("mechanism", mech))
}
