package testpki

import (
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// A server certificate from the CA is trusted by a client trusting the CA;
// an expired one is refused.
func TestHandshake(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		o       LeafOptions
		wantErr string
	}{
		{"valid", LeafOptions{CommonName: "server", Hosts: []string{"127.0.0.1", "localhost"}}, ""},
		{"expired", LeafOptions{CommonName: "server", Hosts: []string{"127.0.0.1"}, NotAfter: time.Now().Add(-time.Minute)}, "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf, err := ca.Issue(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			cert, err := leaf.TLSCertificate()
			if err != nil {
				t.Fatal(err)
			}
			ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				io.WriteString(c, "hi")
			}()
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("dial: %v, want an error saying %q", err, tc.wantErr)
			}
		})
	}
}
