package proxy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/conformance/testpki"
	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// secEnv is a CA, Ferry's certificate and a credential store in a
// temporary directory.
type secEnv struct {
	dir               string
	ca                *testpki.CA
	certFile, keyFile string
	caFile            string
	store             string
}

func newSecEnv(t *testing.T) *secEnv {
	t.Helper()
	e := &secEnv{dir: t.TempDir()}
	var err error
	if e.ca, err = testpki.NewCA("ferry-test-ca"); err != nil {
		t.Fatal(err)
	}
	leaf, err := e.ca.Issue(testpki.LeafOptions{CommonName: "ferry", Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	if e.certFile, e.keyFile, err = leaf.WriteFiles(e.dir, "ferry"); err != nil {
		t.Fatal(err)
	}
	if e.caFile, err = e.ca.WriteFile(e.dir, "ca"); err != nil {
		t.Fatal(err)
	}
	e.store = filepath.Join(e.dir, "users.yaml")
	e.addUser(t, "alice", "alice-secret")
	return e
}

func (e *secEnv) addUser(t *testing.T, user, password string) {
	t.Helper()
	c, err := clientauth.LoadCredentials(e.store)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{clientauth.MechanismSCRAMSHA512, clientauth.MechanismSCRAMSHA256} {
		cred, err := clientauth.NewSCRAMCredential(m, password, clientauth.MinSCRAMIterations)
		if err != nil {
			t.Fatal(err)
		}
		c.Set(user, m, cred)
	}
	if err := c.Save(e.store); err != nil {
		t.Fatal(err)
	}
}

func (e *secEnv) tls() clientauth.TLSConfig {
	return clientauth.TLSConfig{CertFile: e.certFile, KeyFile: e.keyFile}
}

func (e *secEnv) sasl(mechs ...string) clientauth.SASLConfig {
	// A refused login waits for a token 300 ms, not 5 s.
	return clientauth.SASLConfig{Mechanisms: mechs, CredentialsFile: e.store, FailedDelay: time.Millisecond, FailedBurst: 1000, AdmitWait: 300 * time.Millisecond}
}

// clientTLS trusts the test CA, presenting cert when given.
func (e *secEnv) clientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: e.ca.Pool(), ServerName: "127.0.0.1", Certificates: certs}
}

func scram512(user, pass string) kgo.Opt {
	return kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())
}

func authFailures(s *Server, mech, reason string) float64 {
	return testutil.ToFloat64(s.authMetrics.Failures(mech, reason))
}

func closes(s *Server, reason string) float64 {
	return testutil.ToFloat64(s.connMetrics.closes(reason))
}

// TestClientTLSSCRAMProduceConsume: over TLS and SASL/SCRAM-SHA-512, a
// producer writes large batches and a group consumer reads them all back
// byte for byte; the fetches take the buffered path (never spliced), and
// the connections show the principal.
func TestClientTLSSCRAMProduceConsume(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientTLS(e.tls()), WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA512, clientauth.MechanismSCRAMSHA256)))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := []kgo.Opt{kgo.DialTLSConfig(e.clientTLS()), scram512("alice", "alice-secret")}
	if _, err := kadm.NewClient(newClient(t, addr, opts...)).CreateTopic(ctx, 3, 1, nil, "sec"); err != nil {
		t.Fatal(err)
	}
	prod := newClient(t, addr, append(opts, kgo.DefaultProduceTopic("sec"), kgo.ProducerBatchMaxBytes(4<<20), kgo.ProducerLinger(50*time.Millisecond))...)
	const n = 400
	val := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB: batches of MiBs
	for i := range n {
		prod.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: val}, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Error(err)
			}
		})
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cons := newClient(t, addr, append(opts, kgo.ConsumeTopics("sec"), kgo.ConsumerGroup("sec-group"), kgo.FetchMaxBytes(64<<20),
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.SASL(scram.Auth{User: "alice", Pass: "alice-secret"}.AsSha256Mechanism()))...)
	got := 0
	for got < n {
		fs := cons.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !bytes.Equal(r.Value, val) {
				t.Fatalf("record %s: value differs", r.Key)
			}
			got++
		})
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.metrics.streamed); got != 0 {
		t.Errorf("%v fetch answers spliced to a TLS client", got)
	}
	// The same fetches from a plaintext listener are spliced: the check
	// above means something.
	plainSrv, plainAddr := startFerry(t, kf.ListenAddrs())
	pc := newClient(t, plainAddr, kgo.ConsumeTopics("sec"))
	for got := 0; got < n; {
		fs := pc.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		got += fs.NumRecords()
	}
	if testutil.ToFloat64(plainSrv.metrics.streamed) == 0 {
		t.Error("no fetch answer spliced to a plaintext client either")
	}
	cz, err := s.Connz(connstats.Query{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Connections {
		if c.Principal != "User:alice" {
			t.Errorf("connection %d from %s: principal %q, want User:alice", c.ID, c.Remote, c.Principal)
		}
	}
	if cz, _ := s.Connz(connstats.Query{Principal: "alice"}); cz.Matched == 0 || cz.Matched != cz.Open {
		t.Errorf("principal filter alice: %d of %d open", cz.Matched, cz.Open)
	}
	if cz, _ := s.Connz(connstats.Query{Principal: "bob"}); cz.Matched != 0 {
		t.Errorf("principal filter bob: %d matched", cz.Matched)
	}
	if ok := testutil.ToFloat64(s.authMetrics.Successes(clientauth.MechanismSCRAMSHA512)); ok == 0 {
		t.Error("no SCRAM-SHA-512 success counted")
	}
}

// TestClientSASLMechanisms: PLAIN (checked against the SCRAM entry) and
// SCRAM-SHA-256 authenticate the same user; wrong password and unknown
// user are answered SASL_AUTHENTICATION_FAILED, counted by reason, and
// closed; a mechanism not offered is answered UNSUPPORTED_SASL_MECHANISM.
func TestClientSASLMechanisms(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientTLS(e.tls()),
		WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA256, clientauth.MechanismPlain)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tlsOpt := kgo.DialTLSConfig(e.clientTLS())
	for name, mech := range map[string]kgo.Opt{
		"plain":    kgo.SASL(plain.Auth{User: "alice", Pass: "alice-secret"}.AsMechanism()),
		"scram256": kgo.SASL(scram.Auth{User: "alice", Pass: "alice-secret"}.AsSha256Mechanism()),
	} {
		if err := newClient(t, addr, tlsOpt, mech).Ping(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, tc := range []struct {
		name   string
		opt    kgo.Opt
		mech   string
		reason string
	}{
		{"scram wrong password", kgo.SASL(scram.Auth{User: "alice", Pass: "nope"}.AsSha256Mechanism()), clientauth.MechanismSCRAMSHA256, "bad_password"},
		{"scram unknown user", kgo.SASL(scram.Auth{User: "mallory", Pass: "x"}.AsSha256Mechanism()), clientauth.MechanismSCRAMSHA256, "unknown_user"},
		{"plain wrong password", kgo.SASL(plain.Auth{User: "alice", Pass: "nope"}.AsMechanism()), clientauth.MechanismPlain, "bad_password"},
		{"plain unknown user", kgo.SASL(plain.Auth{User: "mallory", Pass: "x"}.AsMechanism()), clientauth.MechanismPlain, "unknown_user"},
	} {
		before := closes(s, "auth_failed")
		err := newClient(t, addr, tlsOpt, tc.opt).Ping(ctx)
		if !errors.Is(err, kerr.SaslAuthenticationFailed) || !strings.Contains(err.Error(), "invalid credentials") {
			t.Errorf("%s: got %v, want SASL_AUTHENTICATION_FAILED saying invalid credentials", tc.name, err)
		}
		if authFailures(s, tc.mech, tc.reason) == 0 {
			t.Errorf("%s: no failure counted as %s/%s", tc.name, tc.mech, tc.reason)
		}
		testwait.Until(t, 5*time.Second, tc.name+" closed as auth_failed", func() bool { return closes(s, "auth_failed") > before })
	}
	// SCRAM-SHA-512 is not offered here.
	err := newClient(t, addr, tlsOpt, scram512("alice", "alice-secret")).Ping(ctx)
	if !errors.Is(err, kerr.UnsupportedSaslMechanism) {
		t.Errorf("unoffered mechanism: got %v, want UNSUPPORTED_SASL_MECHANISM", err)
	}
	c := rawConn(t, addr, e.clientTLS())
	var hs kmsg.SASLHandshakeResponse
	c.roundTrip(t, &kmsg.SASLHandshakeRequest{Version: 1, Mechanism: "GSSAPI"}, &hs)
	if hs.ErrorCode != kerr.UnsupportedSaslMechanism.Code || strings.Join(hs.SupportedMechanisms, ",") != "SCRAM-SHA-256,PLAIN" {
		t.Errorf("GSSAPI handshake: code %d, mechanisms %v; want UNSUPPORTED_SASL_MECHANISM and SCRAM-SHA-256,PLAIN", hs.ErrorCode, hs.SupportedMechanisms)
	}
	if authFailures(s, "none", "unsupported_mechanism") == 0 {
		t.Error("unsupported mechanism not counted")
	}
	// The connection stays open for another mechanism.
	c.roundTrip(t, &kmsg.SASLHandshakeRequest{Version: 1, Mechanism: clientauth.MechanismPlain}, &hs)
	if hs.ErrorCode != 0 {
		t.Errorf("PLAIN handshake after GSSAPI: code %d", hs.ErrorCode)
	}
	// A v0 handshake (raw tokens to follow) is answered
	// UNSUPPORTED_VERSION and closed.
	c = rawConn(t, addr, e.clientTLS())
	var hs0 kmsg.SASLHandshakeResponse
	c.roundTrip(t, &kmsg.SASLHandshakeRequest{Version: 0, Mechanism: clientauth.MechanismPlain}, &hs0)
	if hs0.ErrorCode != kerr.UnsupportedVersion.Code {
		t.Errorf("v0 handshake: code %d, want UNSUPPORTED_VERSION", hs0.ErrorCode)
	}
	if _, err := c.read(); err == nil {
		t.Error("v0 handshake: the connection stayed open")
	}
}

// TestClientSASLRequestBeforeAuth: a Produce or Metadata before
// authentication closes the connection (unauthenticated_request), and
// nothing reaches the cluster; ApiVersions is answered, with
// SaslAuthenticate advertised.
func TestClientSASLRequestBeforeAuth(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	var produced atomic.Int32
	kf.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		produced.Add(1)
		kf.KeepControl()
		return nil, nil, false
	})
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA512)))
	upBefore := testutil.ToFloat64(s.metrics.bytesUp)
	c := rawConn(t, addr, nil)
	var av kmsg.ApiVersionsResponse
	c.roundTrip(t, &kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "t", ClientSoftwareVersion: "1"}, &av)
	adv := map[int16][2]int16{}
	for _, k := range av.ApiKeys {
		adv[k.ApiKey] = [2]int16{k.MinVersion, k.MaxVersion}
	}
	if adv[int16(kmsg.SASLAuthenticate)] != [2]int16{0, 2} || adv[int16(kmsg.SASLHandshake)] != [2]int16{0, 1} {
		t.Errorf("advertised SaslHandshake %v, SaslAuthenticate %v; want [0 1] and [0 2]", adv[int16(kmsg.SASLHandshake)], adv[int16(kmsg.SASLAuthenticate)])
	}
	for _, req := range []kmsg.Request{
		&kmsg.ProduceRequest{Version: 9, Acks: -1, TimeoutMillis: 1000, Topics: []kmsg.ProduceRequestTopic{{Topic: "x", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0}}}}},
		&kmsg.MetadataRequest{Version: 9},
	} {
		before := closes(s, "unauthenticated_request")
		c := rawConn(t, addr, nil)
		c.send(t, req)
		if _, err := c.read(); err == nil {
			t.Errorf("%s before authentication: answered, want the connection closed", kmsg.NameForKey(req.Key()))
		}
		testwait.Until(t, 5*time.Second, "close counted", func() bool { return closes(s, "unauthenticated_request") > before })
	}
	if produced.Load() != 0 || testutil.ToFloat64(s.metrics.bytesUp) != upBefore {
		t.Errorf("requests before authentication reached the cluster: %d produces, %v bytes", produced.Load(), testutil.ToFloat64(s.metrics.bytesUp)-upBefore)
	}
	// franz-go without SASL gets no answer either.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := newClient(t, addr, kgo.RequestRetries(0)).Ping(ctx); err == nil {
		t.Error("a client without SASL got metadata")
	}
}

// TestClientTLSBadCases: plaintext to the TLS port, a client certificate
// that is expired, untrusted or missing (client_auth require), and a client
// that does not trust Ferry's certificate each fail the handshake, are
// closed (tls_handshake) and counted by reason; a good client certificate
// gives the principal User:CN=....
func TestClientTLSBadCases(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	tc := e.tls()
	tc.ClientCAFile, tc.ClientAuth = e.caFile, clientauth.ClientAuthRequire
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientTLS(tc))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	issue := func(ca *testpki.CA, o testpki.LeafOptions) tls.Certificate {
		l, err := ca.Issue(o)
		if err != nil {
			t.Fatal(err)
		}
		c, err := l.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	good := issue(e.ca, testpki.LeafOptions{CommonName: "app1", Client: true})
	if err := newClient(t, addr, kgo.DialTLSConfig(e.clientTLS(good))).Ping(ctx); err != nil {
		t.Fatalf("good client certificate: %v", err)
	}
	cz, _ := s.Connz(connstats.Query{State: "all"})
	if len(cz.Connections) == 0 || cz.Connections[0].Principal != "User:CN=app1" {
		t.Errorf("connections %+v: want principal User:CN=app1", cz.Connections)
	}
	other, err := testpki.NewCA("other-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		name   string
		cfg    *tls.Config
		reason string
	}{
		{"expired client certificate", e.clientTLS(issue(e.ca, testpki.LeafOptions{CommonName: "old", Client: true, NotAfter: time.Now().Add(-time.Minute)})), "bad_certificate"},
		{"untrusted client certificate", e.clientTLS(issue(other, testpki.LeafOptions{CommonName: "stranger", Client: true})), "bad_certificate"},
		{"no client certificate", e.clientTLS(), "no_certificate"},
		{"client distrusts ferry", &tls.Config{RootCAs: other.Pool(), ServerName: "127.0.0.1", Certificates: []tls.Certificate{good}}, "client_refused"},
	} {
		before := closes(s, "tls_handshake")
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		err := newClient(t, addr, kgo.DialTLSConfig(bad.cfg), kgo.RequestRetries(0)).Ping(cctx)
		ccancel()
		if err == nil {
			t.Errorf("%s: connected", bad.name)
		}
		testwait.Until(t, 5*time.Second, bad.name+" counted", func() bool { return authFailures(s, "TLS", bad.reason) > 0 && closes(s, "tls_handshake") > before })
	}
	// Plaintext Kafka to the TLS port.
	before := closes(s, "tls_handshake")
	c := rawConn(t, addr, nil)
	c.send(t, &kmsg.ApiVersionsRequest{Version: 0})
	if _, err := c.read(); err == nil {
		t.Error("plaintext to the TLS port: answered")
	}
	testwait.Until(t, 5*time.Second, "plaintext counted", func() bool { return authFailures(s, "TLS", "not_tls") > 0 && closes(s, "tls_handshake") > before })
}

// TestTLSHandshakeTimeout: on a TLS listener, a connection that says
// nothing, and one that stops half-way through its ClientHello, are closed
// once the handshake's bound passes, counted as TLS timeouts; a client
// connecting meanwhile is served.
func TestTLSHandshakeTimeout(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	tc := e.tls()
	tc.HandshakeTimeout = time.Second
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientTLS(tc))
	silent := rawConn(t, addr, nil)
	halfway := rawConn(t, addr, nil)
	// A TLS record header announcing a 512-byte handshake record, and
	// nothing more of it.
	if _, err := halfway.nc.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := newClient(t, addr, kgo.DialTLSConfig(e.clientTLS())).Ping(ctx); err != nil {
		t.Fatalf("a client connecting while two handshakes stall: %v", err)
	}
	for name, c := range map[string]*rawClient{"silent": silent, "half a ClientHello": halfway} {
		// Read until Ferry closes it; the client's own deadline is far
		// beyond the bound.
		c.nc.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadAll(c.nc); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("%s connection: still open after 30 s (the handshake's bound is 1 s)", name)
			}
		}
	}
	testwait.Until(t, 10*time.Second, "both counted as TLS timeouts", func() bool {
		return authFailures(s, "TLS", "timeout") == 2 && closes(s, "tls_handshake") == 2
	})
}

// TestClientTLSReload: a certificate replaced on disk is served to the
// next connection, without a restart; so is a user added to the store.
func TestClientTLSReload(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	_, addr := startFerry(t, kf.ListenAddrs(), WithClientTLS(e.tls()), WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA512)))
	serial := func() string {
		c, err := tls.Dial("tcp", addr, e.clientTLS())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := serial()
	leaf, err := e.ca.Issue(testpki.LeafOptions{CommonName: "ferry-renewed", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := leaf.WriteFiles(e.dir, "ferry"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "the renewed certificate", func() bool { return serial() == leaf.Cert.SerialNumber.String() && first != "" })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tlsOpt := kgo.DialTLSConfig(e.clientTLS())
	if err := newClient(t, addr, tlsOpt, scram512("bob", "bob-secret")).Ping(ctx); !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("bob before being added: %v", err)
	}
	e.addUser(t, "bob", "bob-secret")
	testwait.Until(t, 5*time.Second, "bob added", func() bool {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		return newClient(t, addr, tlsOpt, scram512("bob", "bob-secret")).Ping(cctx) == nil
	})
}

// TestClientAuthRateLimit: after the burst of failed logins from one
// address, that address is refused (even with the right password) with a
// message saying so, while another address authenticates.
func TestClientAuthRateLimit(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	cfg := e.sasl(clientauth.MechanismSCRAMSHA512)
	cfg.FailedBurst, cfg.FailedInterval = 3, time.Hour
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from := func(ip string) kgo.Opt {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
		return kgo.Dialer(d.DialContext)
	}
	for range 4 { // franz-go tries twice each
		newClient(t, addr, from("127.0.0.1"), scram512("alice", "guess")).Ping(ctx)
	}
	err := newClient(t, addr, from("127.0.0.1"), scram512("alice", "alice-secret")).Ping(ctx)
	if !errors.Is(err, kerr.SaslAuthenticationFailed) || !strings.Contains(err.Error(), "too many failed authentications") {
		t.Errorf("right password from the flooding address: %v; want refused as rate-limited", err)
	}
	if authFailures(s, clientauth.MechanismSCRAMSHA512, "rate_limited") == 0 || closes(s, "auth_rate_limited") == 0 {
		t.Error("rate limiting not counted")
	}
	if err := newClient(t, addr, from("127.0.0.2"), scram512("alice", "alice-secret")).Ping(ctx); err != nil {
		t.Errorf("another address: %v", err)
	}
}

// TestClientOAuthBearer: a JWT signed by a key of the JWKS file
// authenticates as its sub; an expired one, one of another issuer, and
// one signed by a key not in the set are refused.
func TestClientOAuthBearer(t *testing.T) {
	e := newSecEnv(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	stranger, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	jwks := fmt.Sprintf(`{"keys":[{"kty":"EC","crv":"P-256","kid":"k1","use":"sig","x":%q,"y":%q}]}`,
		base64.RawURLEncoding.EncodeToString(key.X.FillBytes(make([]byte, 32))), base64.RawURLEncoding.EncodeToString(key.Y.FillBytes(make([]byte, 32))))
	jwksFile := filepath.Join(e.dir, "jwks.json")
	if err := os.WriteFile(jwksFile, []byte(jwks), 0o644); err != nil {
		t.Fatal(err)
	}
	sign := func(k *ecdsa.PrivateKey, claims map[string]any) string {
		h, _ := json.Marshal(map[string]string{"alg": "ES256", "kid": "k1", "typ": "JWT"})
		c, _ := json.Marshal(claims)
		in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
		d := sha256.Sum256([]byte(in))
		r, s, err := ecdsa.Sign(rand.Reader, k, d[:])
		if err != nil {
			t.Fatal(err)
		}
		sig := append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
		return in + "." + base64.RawURLEncoding.EncodeToString(sig)
	}
	kf := newKfake(t, 1)
	cfg := clientauth.SASLConfig{Mechanisms: []string{clientauth.MechanismOAuthBearer}, OAuth: clientauth.OAuthConfig{JWKSFile: jwksFile, Issuer: "https://idp.test", Audience: "ferry"}, FailedDelay: time.Millisecond}
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientTLS(e.tls()), WithClientSASL(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().Unix()
	login := func(tok string) error {
		return newClient(t, addr, kgo.DialTLSConfig(e.clientTLS()), kgo.SASL(oauth.Auth{Token: tok}.AsMechanism())).Ping(ctx)
	}
	good := map[string]any{"sub": "svc-orders", "iss": "https://idp.test", "aud": []string{"ferry", "other"}, "exp": now + 600, "iat": now}
	if err := login(sign(key, good)); err != nil {
		t.Fatalf("good token: %v", err)
	}
	cz, _ := s.Connz(connstats.Query{State: "all"})
	if len(cz.Connections) == 0 || cz.Connections[0].Principal != "User:svc-orders" {
		t.Errorf("principal %+v, want User:svc-orders", cz.Connections)
	}
	for _, bad := range []struct {
		name, reason string
		tok          string
	}{
		{"expired", "expired_token", sign(key, map[string]any{"sub": "x", "iss": "https://idp.test", "aud": "ferry", "exp": now - 120})},
		{"other issuer", "invalid_token", sign(key, map[string]any{"sub": "x", "iss": "https://evil.test", "aud": "ferry", "exp": now + 600})},
		{"unknown key", "invalid_signature", sign(stranger, good)},
		{"not a JWT", "invalid_token", "abc"},
	} {
		if err := login(bad.tok); !errors.Is(err, kerr.SaslAuthenticationFailed) {
			t.Errorf("%s: %v, want SASL_AUTHENTICATION_FAILED", bad.name, err)
		}
		if authFailures(s, clientauth.MechanismOAuthBearer, bad.reason) == 0 {
			t.Errorf("%s: not counted as %s", bad.name, bad.reason)
		}
	}
}

// TestClientSecurityConfigErrors: mistakes are refused at New.
func TestClientSecurityConfigErrors(t *testing.T) {
	e := newSecEnv(t)
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"plain without tls", []Option{WithClientSASL(e.sasl(clientauth.MechanismPlain))}, "allow_plain_without_tls"},
		{"unknown mechanism", []Option{WithClientSASL(e.sasl("GSSAPI"))}, "not a mechanism"},
		{"no store", []Option{WithClientSASL(clientauth.SASLConfig{Mechanisms: []string{clientauth.MechanismSCRAMSHA512}})}, "credentials_file is required"},
		{"missing store", []Option{WithClientSASL(clientauth.SASLConfig{Mechanisms: []string{clientauth.MechanismSCRAMSHA512}, CredentialsFile: filepath.Join(e.dir, "none.yaml")})}, "no such file"},
		{"require without ca", []Option{WithClientTLS(clientauth.TLSConfig{CertFile: e.certFile, KeyFile: e.keyFile, ClientAuth: clientauth.ClientAuthRequire})}, "client_ca_file is required"},
		{"key mismatch", []Option{WithClientTLS(clientauth.TLSConfig{CertFile: e.certFile, KeyFile: e.caFile})}, "key_file"},
		{"min version", []Option{WithClientTLS(clientauth.TLSConfig{CertFile: e.certFile, KeyFile: e.keyFile, MinVersion: "1.0"})}, "min_version"},
		{"oauth without jwks", []Option{WithClientSASL(clientauth.SASLConfig{Mechanisms: []string{clientauth.MechanismOAuthBearer}})}, "jwks_file or jwks_url"},
	} {
		opts := append([]Option{WithClusterID("x"), WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"127.0.0.1:1"}}),
			WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1}))}, tc.opts...)
		_, err := New(opts...)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrConfig mentioning %q", tc.name, err, tc.want)
		}
	}
}

// rawClient speaks Kafka frames on one connection.
type rawClient struct {
	nc   net.Conn
	corr int32
}

func rawConn(t *testing.T, addr string, cfg *tls.Config) *rawClient {
	t.Helper()
	var nc net.Conn
	var err error
	if cfg != nil {
		nc, err = tls.Dial("tcp", addr, cfg)
	} else {
		nc, err = net.Dial("tcp", addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawClient{nc: nc}
}

func (c *rawClient) send(t *testing.T, req kmsg.Request) {
	t.Helper()
	c.corr++
	b := protocol.AppendRequestHeader(nil, req, c.corr, "raw")
	b = req.AppendTo(b)
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	if _, err := c.nc.Write(append(frame, b...)); err != nil {
		t.Fatal(err)
	}
}

func (c *rawClient) read() ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(c.nc, size[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err := io.ReadFull(c.nc, b)
	return b, err
}

func (c *rawClient) roundTrip(t *testing.T, req kmsg.Request, resp kmsg.Response) {
	t.Helper()
	c.send(t, req)
	b, err := c.read()
	if err != nil {
		t.Fatal(err)
	}
	resp.SetVersion(req.GetVersion())
	hs := protocol.ResponseHeaderSize(req.Key(), req.GetVersion())
	if err := resp.ReadFrom(b[hs:]); err != nil {
		t.Fatal(err)
	}
}
