package clusterauth

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferry-gw/ferry/conformance/testpki"
)

// fakeCluster is a kfake cluster with TLS (a CA made for the test) and
// SASL, whose sessions last reauth (0: for ever).
func fakeCluster(t *testing.T, reauth time.Duration, mech, user, pass string) (c *kfake.Cluster, caFile string) {
	t.Helper()
	ca, err := testpki.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.LeafOptions{CommonName: "broker", Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if caFile, err = ca.WriteFile(t.TempDir(), "ca"); err != nil {
		t.Fatal(err)
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser(mech, user, pass),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}})}
	if reauth > 0 {
		opts = append(opts, kfake.BrokerConfigs(map[string]string{"connections.max.reauth.ms": strconv.FormatInt(reauth.Milliseconds(), 10)}))
	}
	c, err = kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, caFile
}

func writeSecret(t *testing.T, v string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, []byte(v+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDialSCRAMOverTLS: a raw connection made by Dial is TLS, SCRAM
// authenticated, and reports the session lifetime the broker gave; a
// wrong password (read again from the file at the next dial) is an
// authentication failure that names the cluster and not the password.
func TestDialSCRAMOverTLS(t *testing.T) {
	for _, mech := range []string{"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"} {
		t.Run(mech, func(t *testing.T) {
			c, caFile := fakeCluster(t, 10*time.Second, mech, "ferry", "s3cret-pw")
			pwFile := writeSecret(t, "s3cret-pw")
			sec, err := New("a", &TLS{Enabled: true, CAFile: caFile}, &SASL{Mechanism: mech, Username: "ferry", PasswordFile: pwFile})
			if err != nil {
				t.Fatal(err)
			}
			if got := sec.Describe(); got != "SASL_SSL "+mech+" as ferry" {
				t.Fatalf("Describe = %q", got)
			}
			ctx := context.Background()
			nc, s, err := sec.Dial(ctx, &net.Dialer{Timeout: 5 * time.Second}, c.ListenAddrs()[0])
			if err != nil {
				t.Fatal(err)
			}
			nc.Close()
			if _, ok := nc.(*tls.Conn); !ok {
				t.Fatalf("connection %T, want TLS", nc)
			}
			if s.Lifetime != 10*time.Second || time.Until(s.Expires) > 10*time.Second || time.Until(s.RenewAt()) > 8*time.Second {
				t.Fatalf("session %+v (renew at %v)", s, s.RenewAt())
			}
			// franz-go clients: the same TLS and mechanism.
			cl, err := sec.NewClient(c.ListenAddrs())
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.Ping(ctx); err != nil {
				t.Fatalf("kgo client: %v", err)
			}

			os.WriteFile(pwFile, []byte("wrong"), 0o600)
			_, _, err = sec.Dial(ctx, &net.Dialer{Timeout: 5 * time.Second}, c.ListenAddrs()[0])
			if !AuthFailed(err) { // kfake closes the connection; Kafka answers SASL_AUTHENTICATION_FAILED first
				t.Fatalf("wrong password: %v", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "cluster a") || !strings.Contains(msg, "as ferry") || strings.Contains(msg, "wrong") {
				t.Fatalf("error %q: want the cluster and the user, not the password", msg)
			}
			if err := sec.Check(ctx, 5*time.Second, c.ListenAddrs()); !AuthFailed(err) {
				t.Fatalf("Check: %v", err)
			}
		})
	}
}

// TestDialTLSUnknownCA: a broker certificate from another CA fails the
// TLS handshake with an error saying so.
func TestDialTLSUnknownCA(t *testing.T) {
	c, _ := fakeCluster(t, 0, "PLAIN", "u", "p")
	other, _ := testpki.NewCA("other")
	caFile, _ := other.WriteFile(t.TempDir(), "other")
	sec, err := New("b", &TLS{CAFile: caFile}, &SASL{Mechanism: "PLAIN", Username: "u", PasswordFile: writeSecret(t, "p")})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = sec.Dial(context.Background(), &net.Dialer{}, c.ListenAddrs()[0])
	var ae *Error
	if !errors.As(err, &ae) || ae.Step != "TLS handshake" || AuthFailed(err) {
		t.Fatalf("dial: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  *TLS
		sasl *SASL
		want string
	}{
		{"no password", nil, &SASL{Mechanism: "SCRAM-SHA-512", Username: "u"}, "needs the password"},
		{"unknown mechanism", nil, &SASL{Mechanism: "GSSAPI"}, `sasl.mechanism "GSSAPI": not one Ferry speaks`},
		{"no user", nil, &SASL{Mechanism: "PLAIN", PasswordEnv: "X"}, "sasl.username is required"},
		{"bad min version", &TLS{MinVersion: "1.1"}, nil, `tls.min_version "1.1": TLS 1.0 and 1.1 are not accepted`},
		{"cert without key", &TLS{CertFile: "c"}, nil, "cert_file and key_file go together"},
		{"oauth two sources", nil, &SASL{Mechanism: "OAUTHBEARER", TokenFile: "f", TokenEnv: "E"}, "exactly one of token_file"},
		{"oauth http endpoint", nil, &SASL{Mechanism: "OAUTHBEARER", TokenEndpoint: "http://idp/token", ClientID: "c", ClientSecretEnv: "S"}, "must be https"},
		{"oauth no secret", nil, &SASL{Mechanism: "OAUTHBEARER", TokenEndpoint: "https://idp/token", ClientID: "c"}, "needs the client secret"},
	} {
		errs := Validate("clusters[0] (a)", tc.tls, tc.sasl)
		if got := errors.Join(errs...); got == nil || !strings.Contains(got.Error(), tc.want) || !strings.HasPrefix(got.Error(), "clusters[0] (a): ") {
			t.Errorf("%s: %v, want %q", tc.name, got, tc.want)
		}
	}
	if errs := Validate("c", &TLS{Enabled: true, MinVersion: "1.3"}, &SASL{Mechanism: "scram-sha-256", Username: "u", PasswordEnv: "P"}); len(errs) > 0 {
		t.Fatalf("valid: %v", errs)
	}
	// New reads the files once: a missing one fails at start.
	if _, err := New("a", nil, &SASL{Mechanism: "PLAIN", Username: "u", PasswordFile: "/nonexistent/pw"}); err == nil || !strings.Contains(err.Error(), "cluster a: sasl: reading the password") {
		t.Fatalf("missing password file: %v", err)
	}
	if _, err := New("a", &TLS{CAFile: "/nonexistent/ca"}, nil); err == nil || !strings.Contains(err.Error(), "cluster a: tls: ca_file") {
		t.Fatalf("missing CA file: %v", err)
	}
}

func writeFile(t *testing.T, f, v string) {
	t.Helper()
	if err := os.WriteFile(f, []byte(v), 0o600); err != nil {
		t.Fatal(err)
	}
}
