package clientauth

import (
	"context"
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
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/internal/promreg"
)

// SASLConfig configures SASL on the Kafka listeners.
type SASLConfig struct {
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
	// PreAuth bounds connections until they authenticate.
	PreAuth PreAuthLimits
	// AdmitWait bounds how long an exchange waits for a login token
	// (loginlimit.go); 0: DefaultAdmitWait. Not in Ferry's configuration
	// file: tests shorten it.
	AdmitWait time.Duration
}

// Defaults of SASLConfig.
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

// Failure is why an authentication failed: Reason is the metric's label,
// Msg what the client is told, User the name it claimed (logged).
type Failure struct {
	Reason string
	Msg    string
	User   string
	Err    error
}

func (f *Failure) Error() string { return f.Msg }
func (f *Failure) Unwrap() error { return f.Err }

// failureReasons are the reason labels of
// ferry_client_auth_failures_total, each series made at 0.
var failureReasons = map[string][]string{
	MechanismSCRAMSHA512: {"bad_password", "unknown_user", "malformed", "authzid", "unsupported", "rate_limited"},
	MechanismSCRAMSHA256: {"bad_password", "unknown_user", "malformed", "authzid", "unsupported", "rate_limited"},
	MechanismPlain:       {"bad_password", "unknown_user", "malformed", "authzid", "rate_limited"},
	MechanismOAuthBearer: {"invalid_token", "invalid_signature", "expired_token", "malformed", "rate_limited", "keys_unavailable"},
	"none":               {"unsupported_mechanism", "unauthenticated_request", "illegal_state"},
	"TLS":                {"not_tls", "bad_certificate", "no_certificate", "client_refused", "timeout", "handshake"},
}

// Metrics count authentications.
type Metrics struct {
	failures  *prometheus.CounterVec
	successes *prometheus.CounterVec
}

// NewMetrics registers the authentication counters on reg (nil: none),
// sharing them with other servers on the same registry.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "client_auth_failures_total",
			Help: "Failed client authentications (SASL, and TLS handshakes), by mechanism and reason."}, []string{"mechanism", "reason"}),
		successes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "client_auth_successes_total",
			Help: "Successful client authentications, by mechanism (TLS: a verified client certificate)."}, []string{"mechanism"}),
	}
	for _, c := range []**prometheus.CounterVec{&m.failures, &m.successes} {
		var err error
		if *c, err = promreg.Shared(reg, *c); err != nil {
			return nil, err
		}
	}
	for mech, reasons := range failureReasons {
		for _, r := range reasons {
			m.failures.WithLabelValues(mech, r)
		}
		if mech != "none" {
			m.successes.WithLabelValues(mech)
		}
	}
	return m, nil
}

// Failed counts a failed authentication of mechanism ("": none chosen
// yet).
func (m *Metrics) Failed(mechanism, reason string) {
	if mechanism == "" {
		mechanism = "none"
	}
	m.failures.WithLabelValues(mechanism, reason).Inc()
}

// Succeeded counts a successful authentication.
func (m *Metrics) Succeeded(mechanism string) { m.successes.WithLabelValues(mechanism).Inc() }

// Failures is the count of failures of mechanism for reason.
func (m *Metrics) Failures(mechanism, reason string) prometheus.Counter {
	return m.failures.WithLabelValues(mechanism, reason)
}

// Successes is the count of successes of mechanism.
func (m *Metrics) Successes(mechanism string) prometheus.Counter {
	return m.successes.WithLabelValues(mechanism)
}

// Authenticator serves SASL for a server's listeners: it checks
// credentials and tokens, and limits attempts; the connection's side of
// the exchange (what is answered when) is the caller's.
type Authenticator struct {
	cfg   SASLConfig
	store *credentialStore
	oauth *oauthValidator
	// perUser and perAddr limit attempts (loginlimit.go).
	perUser *TokenBuckets
	perAddr *TokenBuckets
	secret  []byte // keys the fake salts and iterations of unknown users
}

// Validate checks the settings (not the files), for a listener with TLS
// or without; the errors name the keys of Ferry's configuration file.
func (c *SASLConfig) Validate(tlsOn bool) error {
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

// New returns the authenticator of cfg, its files loaded; an OAUTHBEARER
// key set from a URL is fetched by Run.
func New(cfg SASLConfig, tlsOn bool, log *zap.Logger) (*Authenticator, error) {
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
	if cfg.AdmitWait == 0 {
		cfg.AdmitWait = DefaultAdmitWait
	}
	a := &Authenticator{cfg: cfg, secret: make([]byte, 32),
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

// Run keeps OAUTHBEARER's key set fresh until ctx ends; without
// OAUTHBEARER it returns at once.
func (a *Authenticator) Run(ctx context.Context) {
	if a.oauth != nil {
		a.oauth.run(ctx)
	}
}

// Config is the configuration in force, defaults filled in.
func (a *Authenticator) Config() SASLConfig { return a.cfg }

// Offers reports whether mech is one of the listener's mechanisms.
func (a *Authenticator) Offers(mech string) bool { return slices.Contains(a.cfg.Mechanisms, mech) }

// fakeSalt is the salt an unknown user is answered with: the same for a
// name every time, so probing twice shows nothing.
func (a *Authenticator) fakeSalt(user string) []byte {
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte(user))
	return m.Sum(nil)
}

// fakeCredential is what an unknown user is answered with for mechanism:
// fakeSalt, and an iteration count of the store's (fakeIterations) chosen
// by a keyed hash of the name, apart from the salt's so that one does not
// predict the other.
func (a *Authenticator) fakeCredential(user, mechanism string) SCRAMCredential {
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte("iterations\x00" + user))
	pick := binary.BigEndian.Uint64(m.Sum(nil))
	return SCRAMCredential{Salt: a.fakeSalt(user), Iterations: a.store.fakeIterations(mechanism, pick)}
}

// SCRAM starts a SCRAM exchange of mech (SCRAM-SHA-256 or -512) against
// the credential store.
func (a *Authenticator) SCRAM(mech string) *SCRAMServer {
	return newSCRAMServer(mech, func(u string) (SCRAMCredential, bool) { return a.store.lookup(u, mech) },
		func(u string) SCRAMCredential { return a.fakeCredential(u, mech) })
}

// ParsePlain reads a SASL/PLAIN message (RFC 4616: authzid NUL authcid
// NUL passwd).
func ParsePlain(msg []byte) (user, password string, f *Failure) {
	parts := strings.Split(string(msg), "\x00")
	if len(parts) != 3 || parts[1] == "" {
		return "", "", &Failure{Reason: "malformed", Msg: "invalid PLAIN message"}
	}
	authzid, user, password := parts[0], parts[1], parts[2]
	if authzid != "" && authzid != user {
		return "", "", &Failure{Reason: "authzid", User: user, Msg: "an authorization identity other than the user's own is not supported"}
	}
	return user, password, nil
}

// Plain checks a PLAIN password against the user's SCRAM-SHA-512
// credential, else its SCRAM-SHA-256 one.
func (a *Authenticator) Plain(user, password string) *Failure {
	for _, mech := range []string{MechanismSCRAMSHA512, MechanismSCRAMSHA256} {
		if cred, ok := a.store.lookup(user, mech); ok {
			if !cred.verifyPassword(mech, password) {
				return &Failure{Reason: "bad_password", User: user, Msg: "invalid credentials"}
			}
			return nil
		}
	}
	// As long as a wrong password takes, so timing does not tell.
	a.fakeCredential(user, MechanismSCRAMSHA512).verifyPassword(MechanismSCRAMSHA512, password)
	return &Failure{Reason: "unknown_user", User: user, Msg: "invalid credentials"}
}

// OAuthBearer checks an OAUTHBEARER initial response and returns the
// token's principal.
func (a *Authenticator) OAuthBearer(msg []byte) (string, *Failure) {
	token, err := parseOAuthBearer(msg)
	if err != nil {
		return "", &Failure{Reason: "malformed", Msg: err.Error()}
	}
	return a.oauth.validate(token)
}

// OAuthStatus is the state of OAUTHBEARER's key set, nil without
// OAUTHBEARER.
func (a *Authenticator) OAuthStatus() *OAuthKeysStatus {
	if a.oauth == nil {
		return nil
	}
	return a.oauth.status()
}

// Ready is nil when an authentication can succeed, else why not:
// OAUTHBEARER's keys not fetched yet.
func (a *Authenticator) Ready() error {
	if a.oauth == nil {
		return nil
	}
	return a.oauth.keysReady()
}
