package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"
)

// adminConn is how a command reaches a member's admin API: its address and,
// when the API is served over TLS (admin_tls), the CA to trust and the
// client certificate to present.
type adminConn struct {
	admin    string
	caFile   string
	certFile string
	keyFile  string
}

// register adds --admin (described by help) and the TLS flags to fs.
func (a *adminConn) register(fs *flag.FlagSet, help string) {
	fs.StringVar(&a.admin, "admin", defaultAdminAddr, help)
	fs.StringVar(&a.caFile, "cacert", "", "CA bundle (PEM) to verify the admin API's certificate; implies https")
	fs.StringVar(&a.certFile, "cert", "", "client certificate (PEM) to present to an admin API that verifies them (admin_tls.client_auth)")
	fs.StringVar(&a.keyFile, "key", "", "the client certificate's key (PEM)")
}

// tls reports whether the API is reached over TLS: an https URL, or a CA or
// client certificate given.
func (a *adminConn) tls() bool {
	return strings.HasPrefix(a.admin, "https://") || a.caFile != "" || a.certFile != ""
}

// url is the endpoint at path.
func (a *adminConn) url(path string) string {
	base := adminURL(a.admin)
	if a.tls() && strings.HasPrefix(base, "http://") {
		base = "https://" + strings.TrimPrefix(base, "http://")
	}
	return base + path
}

// client is the HTTP client for the API, each request bounded by timeout.
func (a *adminConn) client(timeout time.Duration) (*http.Client, error) {
	hc := &http.Client{Timeout: timeout}
	if !a.tls() {
		return hc, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if a.caFile != "" {
		b, err := os.ReadFile(a.caFile)
		if err != nil {
			return nil, usageError{fmt.Errorf("--cacert: %w", err)}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, usageError{fmt.Errorf("--cacert %s: no PEM certificate in it", a.caFile)}
		}
		cfg.RootCAs = pool
	}
	if (a.certFile == "") != (a.keyFile == "") {
		return nil, usageError{fmt.Errorf("--cert and --key go together")}
	}
	if a.certFile != "" {
		cert, err := tls.LoadX509KeyPair(a.certFile, a.keyFile)
		if err != nil {
			return nil, usageError{fmt.Errorf("--cert, --key: %w", err)}
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	hc.Transport = &http.Transport{TLSClientConfig: cfg, Proxy: http.ProxyFromEnvironment}
	return hc, nil
}
