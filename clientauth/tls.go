package clientauth

// TLS on the Kafka listeners. Every accepted connection is wrapped in
// tls.Server as it is accepted (no I/O), and the handshake runs on the
// connection's own goroutine under handshakeTimeout, so a slow or silent
// client never holds up the accept loop. The certificate, its key and the
// client CA bundle are read again when one of the files changes (checked
// at most once a second, at a handshake): a renewed certificate is served
// without a restart; files that no longer load are logged and the last
// good ones stay in force.
//
// With client_auth request or require, a client certificate is verified
// against client_ca_file, and its subject becomes the connection's
// principal: "User:" and the subject's distinguished name in RFC 2253
// form, most significant RDN last, as Kafka's default principal builder
// gives it (e.g. "User:CN=app1,OU=payments,O=Acme"). A SASL
// authentication on the same connection replaces it.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// TLSConfig configures TLS on the Kafka listeners.
type TLSConfig struct {
	// CertFile and KeyFile are the listener's certificate (chain) and
	// key, PEM.
	CertFile, KeyFile string
	// ClientCAFile is the CA bundle (PEM) client certificates are verified
	// against; required for ClientAuth request and require.
	ClientCAFile string
	// ClientAuth is none (the default), request (verify a certificate when
	// the client presents one) or require.
	ClientAuth string
	// MinVersion is "1.2" (the default) or "1.3".
	MinVersion string

	// HandshakeTimeout bounds a client's handshake; 0:
	// DefaultHandshakeTimeout. Not in Ferry's configuration file: tests
	// shorten it.
	HandshakeTimeout time.Duration
}

// ClientAuth values.
const (
	ClientAuthNone    = "none"
	ClientAuthRequest = "request"
	ClientAuthRequire = "require"
)

// DefaultHandshakeTimeout bounds a client's TLS handshake: a client that opens a
// connection and says nothing, or stops half-way, holds its descriptor and
// goroutine no longer than this.
const DefaultHandshakeTimeout = 10 * time.Second

// Validate checks the settings (not the files); the errors name the keys
// of Ferry's configuration file.
func (t *TLSConfig) Validate() error {
	switch {
	case t.CertFile == "" || t.KeyFile == "":
		return errors.New("tls: cert_file and key_file are required")
	case t.ClientAuth != "" && t.ClientAuth != ClientAuthNone && t.ClientAuth != ClientAuthRequest && t.ClientAuth != ClientAuthRequire:
		return fmt.Errorf("tls.client_auth %q: want none, request or require", t.ClientAuth)
	case (t.ClientAuth == ClientAuthRequest || t.ClientAuth == ClientAuthRequire) && t.ClientCAFile == "":
		return fmt.Errorf("tls.client_auth %s: client_ca_file is required to verify client certificates", t.ClientAuth)
	case t.ClientCAFile != "" && (t.ClientAuth == "" || t.ClientAuth == ClientAuthNone):
		return errors.New("tls.client_ca_file is set but client_auth is none: set client_auth to request or require, or remove client_ca_file")
	}
	if _, err := tlsMinVersion(t.MinVersion); err != nil {
		return err
	}
	return nil
}

func tlsMinVersion(v string) (uint16, error) {
	switch v {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("tls.min_version %q: want 1.2 or 1.3", v)
}

// TLSServer holds the listener's TLS configuration, reloaded on change.
type TLSServer struct {
	opts TLSConfig
	log  *zap.Logger
	// base is handed to tls.Server; its GetConfigForClient returns cur.
	base *tls.Config

	mu     sync.Mutex
	cur    *tls.Config
	stamps []fileStamp
	probed time.Time
}

// fileStamp is what tells a file changed.
type fileStamp struct {
	mtime time.Time
	size  int64
}

func NewTLSServer(opts TLSConfig, log *zap.Logger) (*TLSServer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	t := &TLSServer{opts: opts, log: log}
	stamps, err := t.stat()
	if err != nil {
		return nil, err
	}
	if err := t.load(stamps); err != nil {
		return nil, err
	}
	t.base = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return t.current(), nil }}
	return t, nil
}

func (t *TLSServer) files() []string {
	fs := []string{t.opts.CertFile, t.opts.KeyFile}
	if t.opts.ClientCAFile != "" {
		fs = append(fs, t.opts.ClientCAFile)
	}
	return fs
}

func (t *TLSServer) stat() ([]fileStamp, error) {
	var out []fileStamp
	for _, f := range t.files() {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		out = append(out, fileStamp{fi.ModTime(), fi.Size()})
	}
	return out, nil
}

// load reads the files and makes the configuration handshakes use.
func (t *TLSServer) load(stamps []fileStamp) error {
	cert, err := tls.LoadX509KeyPair(t.opts.CertFile, t.opts.KeyFile)
	if err != nil {
		return fmt.Errorf("tls: cert_file %s, key_file %s: %w", t.opts.CertFile, t.opts.KeyFile, err)
	}
	minV, _ := tlsMinVersion(t.opts.MinVersion)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: minV}
	if t.opts.ClientCAFile != "" {
		b, err := os.ReadFile(t.opts.ClientCAFile)
		if err != nil {
			return fmt.Errorf("tls: client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("tls: client_ca_file %s holds no PEM certificate", t.opts.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if t.opts.ClientAuth == ClientAuthRequire {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	t.mu.Lock()
	t.cur, t.stamps = cfg, stamps
	t.mu.Unlock()
	return nil
}

// current is the configuration for a handshake, read again from the files
// when they changed.
func (t *TLSServer) current() *tls.Config {
	t.mu.Lock()
	now := time.Now()
	if now.Sub(t.probed) < time.Second {
		defer t.mu.Unlock()
		return t.cur
	}
	t.probed = now
	old, cur := t.stamps, t.cur
	t.mu.Unlock()
	stamps, err := t.stat()
	if err != nil {
		t.log.Warn("TLS files cannot be read; serving the certificate last read", zap.Error(err))
		return cur
	}
	changed := false
	for i := range stamps {
		if stamps[i] != old[i] {
			changed = true
		}
	}
	if !changed {
		return cur
	}
	if err := t.load(stamps); err != nil {
		// A certificate and key written one after the other may not
		// match in between: retried at the next probe.
		t.log.Warn("TLS files changed but cannot be used yet; serving the ones last read", zap.Error(err))
		return cur
	}
	t.log.Info("TLS certificate reloaded", zap.String("cert_file", t.opts.CertFile))
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cur
}

// Config is the configuration to hand to tls.Server: each handshake
// gets the one last loaded.
func (t *TLSServer) Config() *tls.Config { return t.base }

// ServerTLSConfig is a tls.Config for another of the member's listeners
// (the admin API) with the same settings and the same reload on change as
// the Kafka listeners'.
func ServerTLSConfig(opts TLSConfig, log *zap.Logger) (*tls.Config, error) {
	t, err := NewTLSServer(opts, log)
	if err != nil {
		return nil, err
	}
	return t.base, nil
}

// Handshake runs the TLS handshake of a client connection and returns the
// principal its verified certificate names ("" without one).
func (t *TLSServer) Handshake(ctx context.Context, tc *tls.Conn) (string, error) {
	timeout := DefaultHandshakeTimeout
	if t.opts.HandshakeTimeout > 0 {
		timeout = t.opts.HandshakeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return "", err
	}
	st := tc.ConnectionState()
	if len(st.VerifiedChains) > 0 && len(st.PeerCertificates) > 0 {
		return "User:" + st.PeerCertificates[0].Subject.String(), nil
	}
	return "", nil
}

// TLSFailureReason classifies a failed handshake for
// ferry_client_auth_failures_total{mechanism="TLS"}.
func TLSFailureReason(err error) string {
	var rhe tls.RecordHeaderError
	var ce *tls.CertificateVerificationError
	var ae tls.AlertError
	var ne net.Error
	switch {
	case errors.As(err, &rhe):
		return "not_tls" // plaintext, HTTP or the like
	case errors.As(err, &ce):
		return "bad_certificate" // the client's: expired, untrusted
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &ae), strings.Contains(err.Error(), "remote error"):
		return "client_refused" // the client refused Ferry's certificate, or the parameters
	case strings.Contains(err.Error(), "client didn't provide a certificate"):
		return "no_certificate"
	}
	return "handshake"
}
