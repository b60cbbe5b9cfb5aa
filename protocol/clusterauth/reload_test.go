package clusterauth

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/conformance/testpki"
)

// TestTLSFilesReloaded: the client certificate and the CA bundle are read
// again when their files change: the next connection presents the new
// certificate and trusts the new CA, with no restart.
func TestTLSFilesReloaded(t *testing.T) {
	dir := t.TempDir()
	ca1, _ := testpki.NewCA("ca-1")
	ca2, _ := testpki.NewCA("ca-2")
	issue := func(ca *testpki.CA, cn string, client bool) *testpki.Leaf {
		l, err := ca.Issue(testpki.LeafOptions{CommonName: cn, Hosts: []string{"127.0.0.1"}, Client: client})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// The server's certificate, switched from ca-1's to ca-2's below.
	var serverCert tls.Certificate
	setServer := func(l *testpki.Leaf) {
		c, err := l.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		serverCert = c
	}
	setServer(issue(ca1, "server", false))
	seen := make(chan string, 4)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &serverCert, nil },
		ClientAuth:     tls.RequireAnyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if err := tc.Handshake(); err == nil {
				seen <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
			} else {
				seen <- "handshake failed: " + err.Error()
			}
			c.Close()
		}
	}()

	certFile, keyFile, _ := issue(ca1, "ferry-1", true).WriteFiles(dir, "client")
	caFile, _ := ca1.WriteFile(dir, "ca")
	sec, err := New("a", &TLS{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() string {
		t.Helper()
		nc, _, err := sec.Dial(context.Background(), &net.Dialer{Timeout: 5 * time.Second}, ln.Addr().String())
		if err != nil {
			return "dial: " + err.Error()
		}
		defer nc.Close()
		return <-seen
	}
	if got := dial(); got != "ferry-1" {
		t.Fatalf("first connection: %s", got)
	}
	// Later modification times: a rewrite within the same clock tick
	// counts too, by its size, but tests should not rely on it.
	touch := func(files ...string) {
		for _, f := range files {
			later := time.Now().Add(time.Minute)
			os.Chtimes(f, later, later)
		}
	}
	issue(ca1, "ferry-2-rotated", true).WriteFiles(dir, "client")
	touch(certFile, keyFile)
	if got := dial(); got != "ferry-2-rotated" {
		t.Fatalf("after the certificate was rotated: %s", got)
	}
	// The brokers move to a certificate from ca-2: the old bundle
	// refuses them, the new one is read at the next connection.
	setServer(issue(ca2, "server", false))
	if got := dial(); got == "ferry-2-rotated" {
		t.Fatalf("a server certificate from an untrusted CA was accepted")
	}
	<-seen // the server's side of the failed handshake
	ca2.WriteFile(dir, "ca")
	touch(caFile)
	if got := dial(); got != "ferry-2-rotated" {
		t.Fatalf("after the CA bundle was replaced: %s", got)
	}
}
