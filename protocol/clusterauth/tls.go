package clusterauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// tlsLoader builds the tls.Config of each new connection from the files
// as they are now: the CA bundle and the client certificate are read again
// when a file's modification time or size changed since the last read.
// A file that became unreadable or invalid keeps the last good contents
// in use (and the next connection tries again).
type tlsLoader struct {
	cfg TLS
	min uint16

	mu    sync.Mutex
	roots *x509.CertPool // nil: the system's
	cert  *tls.Certificate
	seen  map[string]fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func newTLSLoader(t *TLS) (*tlsLoader, error) {
	min, err := tlsVersion(t.MinVersion)
	if err != nil {
		return nil, err
	}
	l := &tlsLoader{cfg: *t, min: min, seen: map[string]fileStamp{}}
	if err := l.reload(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *tlsLoader) hasCert() bool { return l != nil && l.cfg.CertFile != "" }

// changed reports whether any file changed since it was last read.
func (l *tlsLoader) changed() bool {
	for _, f := range []string{l.cfg.CAFile, l.cfg.CertFile, l.cfg.KeyFile} {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return true
		}
		if st := (fileStamp{fi.ModTime(), fi.Size()}); st != l.seen[f] {
			return true
		}
	}
	return false
}

// reload reads the files; l.mu is held (or l is not shared yet).
func (l *tlsLoader) reload() error {
	stamps := map[string]fileStamp{}
	read := func(f string) ([]byte, error) {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		stamps[f] = fileStamp{fi.ModTime(), fi.Size()}
		return b, nil
	}
	var roots *x509.CertPool
	if l.cfg.CAFile != "" {
		b, err := read(l.cfg.CAFile)
		if err != nil {
			return fmt.Errorf("ca_file: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(b) {
			return fmt.Errorf("ca_file %s: no PEM certificate in it", l.cfg.CAFile)
		}
	}
	var cert *tls.Certificate
	if l.cfg.CertFile != "" {
		cb, err := read(l.cfg.CertFile)
		if err != nil {
			return fmt.Errorf("cert_file: %w", err)
		}
		kb, err := read(l.cfg.KeyFile)
		if err != nil {
			return fmt.Errorf("key_file: %w", err)
		}
		c, err := tls.X509KeyPair(cb, kb)
		if err != nil {
			return fmt.Errorf("cert_file %s and key_file %s: %w", l.cfg.CertFile, l.cfg.KeyFile, err)
		}
		cert = &c
	}
	l.roots = roots
	l.cert = cert
	l.seen = stamps
	return nil
}

// config is the tls.Config for a connection to addr.
func (l *tlsLoader) config(addr string) (*tls.Config, error) {
	l.mu.Lock()
	if l.changed() {
		// On error the last good files stay in use, and seen as it
		// was, so that the next connection tries again.
		_ = l.reload()
	}
	roots, cert := l.roots, l.cert
	l.mu.Unlock()
	name := l.cfg.ServerName
	if name == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		name = host
	}
	cfg := &tls.Config{
		MinVersion:         l.min,
		RootCAs:            roots,
		ServerName:         name,
		InsecureSkipVerify: l.cfg.InsecureSkipVerify,
	}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	} else if l.cfg.CertFile != "" {
		return nil, errors.New("tls: the client certificate could not be read")
	}
	return cfg, nil
}
