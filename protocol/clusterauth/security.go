package clusterauth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Security is how Ferry connects to one cluster. A nil *Security is a
// plaintext cluster with no authentication: every method works on it.
type Security struct {
	cluster string
	tls     *tlsLoader     // nil: no TLS
	mech    sasl.Mechanism // nil: no SASL
	user    string         // PLAIN and SCRAM
	tokens  *tokenSource   // OAUTHBEARER from an endpoint
}

// New builds the security of the cluster named cluster. It reads every
// file named once, so that a missing or unreadable one fails at start;
// afterwards they are read again as they change (certificates) or at each
// authentication (secrets). nil settings give a nil Security.
func New(cluster string, t *TLS, s *SASL) (*Security, error) {
	if errs := Validate("cluster "+cluster, t, s); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if (t == nil || !(t.Enabled || t.CAFile != "" || t.CertFile != "" || t.ServerName != "")) && s == nil {
		return nil, nil
	}
	sec := &Security{cluster: cluster}
	if t != nil && (t.Enabled || t.CAFile != "" || t.CertFile != "" || t.ServerName != "") {
		l, err := newTLSLoader(t)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: tls: %w", cluster, err)
		}
		sec.tls = l
	}
	if s != nil {
		if err := sec.setSASL(s); err != nil {
			return nil, fmt.Errorf("cluster %s: sasl: %w", cluster, err)
		}
	}
	return sec, nil
}

func (sec *Security) setSASL(s *SASL) error {
	mech := strings.ToUpper(s.Mechanism)
	switch mech {
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		pw := secret{what: "password", file: s.PasswordFile, env: s.PasswordEnv}
		if _, err := pw.read(); err != nil {
			return err
		}
		sec.user = s.Username
		user := s.Username
		switch mech {
		case "PLAIN":
			sec.mech = plain.Plain(func(context.Context) (plain.Auth, error) {
				p, err := pw.read()
				return plain.Auth{User: user, Pass: p}, err
			})
		case "SCRAM-SHA-256", "SCRAM-SHA-512":
			fn := func(context.Context) (scram.Auth, error) {
				p, err := pw.read()
				return scram.Auth{User: user, Pass: p}, err
			}
			if mech == "SCRAM-SHA-256" {
				sec.mech = scram.Sha256(fn)
			} else {
				sec.mech = scram.Sha512(fn)
			}
		}
	case "OAUTHBEARER":
		var token func(context.Context) (string, error)
		if s.TokenEndpoint != "" {
			cs := secret{what: "client secret", file: s.ClientSecretFile, env: s.ClientSecretEnv}
			if _, err := cs.read(); err != nil {
				return err
			}
			sec.tokens = &tokenSource{endpoint: s.TokenEndpoint, clientID: s.ClientID, secret: cs, scope: s.Scope}
			token = sec.tokens.token
		} else {
			ts := secret{what: "token", file: s.TokenFile, env: s.TokenEnv}
			if _, err := ts.read(); err != nil {
				return err
			}
			token = func(context.Context) (string, error) { return ts.read() }
		}
		sec.mech = oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
			t, err := token(ctx)
			return oauth.Auth{Token: t}, err
		})
	}
	return nil
}

// Enabled reports whether the cluster uses TLS or SASL.
func (sec *Security) Enabled() bool { return sec != nil }

// TLS reports whether connections to the cluster use TLS.
func (sec *Security) TLS() bool { return sec != nil && sec.tls != nil }

// Describe says how Ferry connects, for /status and logs: the protocol
// (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), the mechanism and the user.
// It never holds a secret.
func (sec *Security) Describe() string {
	switch {
	case sec == nil:
		return "PLAINTEXT"
	case sec.mech == nil:
		if sec.tls.hasCert() {
			return "SSL (client certificate)"
		}
		return "SSL"
	}
	p := "SASL_PLAINTEXT"
	if sec.tls != nil {
		p = "SASL_SSL"
	}
	d := p + " " + sec.mech.Name()
	if sec.user != "" {
		d += " as " + sec.user
	}
	return d
}

// NewClient builds a franz-go client of the cluster at addrs (its
// bootstrap servers) with the cluster's TLS and SASL, then opts. Every
// franz-go client Ferry opens to a cluster is built here: a client given
// seed brokers alone fails against a secured cluster, and what it was for
// (a switch's end offsets) silently falls back to something worse.
func (sec *Security) NewClient(addrs []string, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(slices.Concat([]kgo.Opt{kgo.SeedBrokers(addrs...)}, sec.kgoOpts(), opts)...)
}

// kgoOpts are the options a franz-go client of the cluster needs: a dialer
// doing TLS with the current certificates, and the SASL mechanism (franz-go
// re-authenticates its connections itself when the broker limits the
// session, KIP-368).
func (sec *Security) kgoOpts() []kgo.Opt {
	if sec == nil {
		return plainDialer()
	}
	var opts []kgo.Opt
	if sec.tls == nil {
		opts = append(opts, plainDialer()...)
	} else {
		opts = append(opts, kgo.Dialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			// franz-go's DialTimeout does not bound a custom dialer:
			// the TCP connect and the TLS handshake get 10 s together.
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			d := net.Dialer{KeepAlive: 30 * time.Second}
			nc, err := dialTCP(ctx, &d, network, addr)
			if err != nil {
				return nil, err
			}
			return sec.handshake(ctx, nc, addr)
		}))
	}
	if sec.mech != nil {
		opts = append(opts, kgo.SASL(sec.mech))
	}
	return opts
}

// handshake runs the TLS handshake on nc, closing it on failure.
func (sec *Security) handshake(ctx context.Context, nc net.Conn, addr string) (net.Conn, error) {
	cfg, err := sec.tls.config(addr)
	if err != nil {
		nc.Close()
		return nil, err
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, &Error{Cluster: sec.cluster, Addr: addr, Step: "TLS handshake", Err: err}
	}
	return tc, nil
}

// Session is what the broker said of an authenticated connection.
type Session struct {
	// Lifetime is how long the broker lets the session last before it
	// must be authenticated again (KIP-368, connections.max.reauth.ms);
	// 0: for ever.
	Lifetime time.Duration
	// Expires is when the session ends (zero: never), taken before the
	// last authentication request was sent, so a little early. A request
	// the broker receives after it makes the broker close the connection.
	Expires time.Time
}

// RenewAt is when a connection should take no new work, so that it can be
// replaced before it expires: at 80% of the lifetime, and at least a
// second before it expires. Zero when the session does not expire.
func (s Session) RenewAt() time.Time {
	if s.Expires.IsZero() {
		return time.Time{}
	}
	margin := max(s.Lifetime/5, time.Second)
	return s.Expires.Add(-margin)
}

// Deadline is the last moment a request may be sent on the connection:
// a second, or 5% of the lifetime, before it expires. Zero: no limit.
func (s Session) Deadline() time.Time {
	if s.Expires.IsZero() {
		return time.Time{}
	}
	return s.Expires.Add(-max(s.Lifetime/20, time.Second))
}

// Dial connects to a broker at addr with d: TCP, then TLS and the SASL
// exchange (SaslHandshake v1, SaslAuthenticate v2) as configured. A
// failure after TCP is an *Error saying which step failed.
func (sec *Security) Dial(ctx context.Context, d *net.Dialer, addr string) (net.Conn, Session, error) {
	nc, err := dialTCP(ctx, d, "tcp", addr)
	if err != nil || sec == nil {
		return nc, Session{}, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout+10*time.Second)
		defer cancel()
	}
	if sec.tls != nil {
		if nc, err = sec.handshake(ctx, nc, addr); err != nil {
			return nil, Session{}, err
		}
	}
	if sec.mech == nil {
		return nc, Session{}, nil
	}
	s, err := sec.authenticate(ctx, nc, addr)
	if err != nil {
		nc.Close()
		return nil, Session{}, err
	}
	return nc, s, nil
}

// Check dials each of addrs until one connects and authenticates, and
// closes it: nil, or why none did.
func (sec *Security) Check(ctx context.Context, timeout time.Duration, addrs []string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := net.Dialer{}
	var errs []error
	for _, addr := range addrs {
		nc, _, err := sec.Dial(ctx, &d, addr)
		if err == nil {
			nc.Close()
			return nil
		}
		errs = append(errs, err)
		var ae *Error
		if errors.As(err, &ae) && ae.Step == "SASL authentication" {
			break // the same credentials fail everywhere
		}
	}
	return errors.Join(errs...)
}

// Error is a connection that opened but could not be secured: the TLS
// handshake or the SASL exchange failed. It names the cluster, the broker
// and the step, never a secret.
type Error struct {
	Cluster string
	Addr    string
	Step    string // "TLS handshake", "SASL handshake", "SASL authentication", "reading the credentials"
	Mech    string
	User    string
	Err     error
}

func (e *Error) Error() string {
	who := ""
	if e.Mech != "" {
		who = " " + e.Mech
		if e.User != "" {
			who += " as " + e.User
		}
	}
	return fmt.Sprintf("cluster %s: broker %s: %s%s failed: %v", e.Cluster, e.Addr, e.Step, who, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// AuthFailed reports whether err is a failed authentication: the broker
// refused the credentials, or they could not be read.
func AuthFailed(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Step == "SASL authentication" || e.Step == "reading the credentials")
}

// WithSASL is the same cluster's security with other SASL credentials: the
// same TLS settings (and certificate files), another user. It serves a
// client principal mapped to its own credentials on the cluster (the
// proxy's pools of that principal); s is validated as the cluster's sasl
// section is, and its secret file read once. key names the settings in
// errors (clusters[0] (a) principals[1]).
func (sec *Security) WithSASL(cluster, key string, s *SASL) (*Security, error) {
	if s == nil {
		return nil, fmt.Errorf("%s: sasl is required", key)
	}
	if errs := Validate(key, nil, s); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	out := &Security{cluster: cluster}
	if sec != nil {
		out.cluster, out.tls = sec.cluster, sec.tls
	}
	if err := out.setSASL(s); err != nil {
		return nil, fmt.Errorf("%s: sasl: %w", key, err)
	}
	return out, nil
}

// User is the SASL user (PLAIN, SCRAM), "" for other mechanisms or none.
func (sec *Security) User() string {
	if sec == nil {
		return ""
	}
	return sec.user
}
