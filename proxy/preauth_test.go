package proxy

import (
	"context"
	"encoding/binary"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/upstream"
)

// maxGauge is a gauge that remembers the largest value it was set to.
type maxGauge struct {
	prometheus.Gauge
	mu  sync.Mutex
	max float64
}

func (g *maxGauge) Set(v float64) {
	g.mu.Lock()
	g.max = math.Max(g.max, v)
	g.mu.Unlock()
	g.Gauge.Set(v)
}

func (g *maxGauge) peak() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.max
}

// watchBuffered makes s remember the peak of ferry_buffered_bytes.
func watchBuffered(s *Server) *maxGauge {
	var g *maxGauge
	s.mem.WrapGauge(func(in prometheus.Gauge) prometheus.Gauge { g = &maxGauge{Gauge: in}; return g })
	return g
}

func refusedConns(s *Server, reason string) float64 {
	return testutil.ToFloat64(s.connMetrics.refused[reason])
}

// sendFrameStart writes the size of a frame of size bytes and one byte of
// it, as a client that claims a large request and stalls does.
func sendFrameStart(t *testing.T, c *rawClient, size int) {
	t.Helper()
	b := binary.BigEndian.AppendUint32(nil, uint32(size))
	if _, err := c.nc.Write(append(b, 0)); err != nil {
		t.Fatal(err)
	}
}

// produceAsAlice logs in with SCRAM-SHA-512 as a new client, produces one
// record to topic and reads it back, within a generous time.
func produceAsAlice(t *testing.T, addr, topic string) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := newClient(t, addr, scram512("alice", "alice-secret"), kgo.DefaultProduceTopic(topic), kgo.ConsumeTopics(topic),
		kgo.RequestTimeoutOverhead(5*time.Second), kgo.RequestRetries(1))
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("legit")}).FirstErr(); err != nil {
		t.Fatalf("a legitimate client could not produce: %v", err)
	}
	fs := cl.PollFetches(ctx)
	if err := fs.Err0(); err != nil {
		t.Fatalf("a legitimate client could not fetch: %v", err)
	}
	if fs.NumRecords() != 1 || string(fs.Records()[0].Value) != "legit" {
		t.Fatalf("a legitimate client read %d records, want its one", fs.NumRecords())
	}
	t.Logf("a legitimate client logged in, produced and fetched in %v", time.Since(start).Round(time.Millisecond))
}

// TestUnauthenticatedLargeFramesRefused is the attack of an
// unauthenticated client on every other: six connections each announce a
// 100 MiB request (max_request_size) and send one byte of it. Each is
// closed at once (unauthenticated_frame_too_large), nothing of theirs is
// charged to ferry_buffered_bytes, and a legitimate client logs in,
// produces and fetches meanwhile.
func TestUnauthenticatedLargeFramesRefused(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1, kfake.SeedTopics(1, "legit"))
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA512)))
	peak := watchBuffered(s)
	var attackers []*rawClient
	for range 6 {
		c := rawConn(t, addr, nil)
		c.nc.SetDeadline(time.Now().Add(30 * time.Second))
		sendFrameStart(t, c, 100<<20)
		attackers = append(attackers, c)
	}
	produceAsAlice(t, addr, "legit")
	for _, c := range attackers {
		expectClosed(t, c.nc)
	}
	if n := closes(s, "unauthenticated_frame_too_large"); n != 6 {
		t.Errorf("%v connections closed as unauthenticated_frame_too_large, want 6", n)
	}
	if p := peak.peak(); p >= clientauth.DefaultSASLMaxReceiveSize {
		t.Errorf("ferry_buffered_bytes peaked at %v: the unauthenticated frames were charged", p)
	}
}

// TestUnauthenticatedFramesNotChargedToSharedBudget: frames under the
// pre-authentication bound, announced and stalled by connections that
// never authenticate, take nothing of the process's buffer budget (here
// 256 KiB, less than they announce together): a legitimate client is
// served meanwhile. The authentication deadline then closes them,
// mid-frame (authentication_timeout).
func TestUnauthenticatedFramesNotChargedToSharedBudget(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1, kfake.SeedTopics(1, "legit"))
	sasl := e.sasl(clientauth.MechanismSCRAMSHA512)
	sasl.PreAuth.Timeout = 3 * time.Second
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(sasl), WithBufferBudget(upstream.MinBufferBudget, 256<<10))
	peak := watchBuffered(s)
	var attackers []*rawClient
	for range 4 {
		c := rawConn(t, addr, nil)
		c.nc.SetDeadline(time.Now().Add(60 * time.Second))
		sendFrameStart(t, c, clientauth.DefaultSASLMaxReceiveSize-1024)
		attackers = append(attackers, c)
	}
	produceAsAlice(t, addr, "legit")
	if p := peak.peak(); p >= clientauth.DefaultSASLMaxReceiveSize-1024 {
		t.Errorf("ferry_buffered_bytes peaked at %v: an unauthenticated frame was charged", p)
	}
	for _, c := range attackers {
		expectClosed(t, c.nc)
	}
	if n := closes(s, "authentication_timeout"); n != 4 {
		t.Errorf("%v connections closed as authentication_timeout, want 4", n)
	}
}

// TestAuthenticationTimeout: a connection that sends ApiVersions and then
// nothing is closed once the authentication deadline passes
// (authentication_timeout); one that authenticated before, opened
// earlier, is still served.
func TestAuthenticationTimeout(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1, kfake.SeedTopics(1, "legit"))
	sasl := e.sasl(clientauth.MechanismPlain)
	sasl.AllowPlainWithoutTLS = true
	sasl.PreAuth.Timeout = 5 * time.Second
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(sasl))

	authed := rawConn(t, addr, nil)
	authed.nc.SetDeadline(time.Now().Add(60 * time.Second))
	plainLogin(t, authed)
	idle := rawConn(t, addr, nil)
	idle.nc.SetDeadline(time.Now().Add(60 * time.Second))
	var av kmsg.ApiVersionsResponse
	idle.roundTrip(t, &kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "t", ClientSoftwareVersion: "1"}, &av)
	expectClosed(t, idle.nc)
	if n := closes(s, "authentication_timeout"); n != 1 {
		t.Errorf("%v connections closed as authentication_timeout, want 1", n)
	}
	var md kmsg.MetadataResponse
	authed.roundTrip(t, &kmsg.MetadataRequest{Version: 9}, &md)
	if len(md.Brokers) == 0 {
		t.Error("the authenticated connection got no brokers in Metadata")
	}
}

// plainLogin authenticates c with SASL/PLAIN as alice.
func plainLogin(t *testing.T, c *rawClient) {
	t.Helper()
	var hs kmsg.SASLHandshakeResponse
	c.roundTrip(t, &kmsg.SASLHandshakeRequest{Version: 1, Mechanism: clientauth.MechanismPlain}, &hs)
	var auth kmsg.SASLAuthenticateResponse
	c.roundTrip(t, &kmsg.SASLAuthenticateRequest{Version: 2, SASLAuthBytes: []byte("\x00alice\x00alice-secret")}, &auth)
	if hs.ErrorCode != 0 || auth.ErrorCode != 0 {
		t.Fatalf("PLAIN login: handshake error %d, authenticate error %d", hs.ErrorCode, auth.ErrorCode)
	}
}

// TestUnauthenticatedConnectionsPerIP: with three unauthenticated
// connections open from 127.0.0.1 (the bound), a fourth is closed as soon
// as it is accepted (refused max_unauthenticated_per_ip); once one of the
// three authenticates, a new connection is served, and the next refused;
// once another of the three closes, a new one is served again.
func TestUnauthenticatedConnectionsPerIP(t *testing.T) {
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	sasl := e.sasl(clientauth.MechanismPlain)
	sasl.AllowPlainWithoutTLS = true
	sasl.PreAuth.MaxPerIP = 3
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(sasl))
	apiVersions := func(c *rawClient) {
		t.Helper()
		var av kmsg.ApiVersionsResponse
		c.roundTrip(t, &kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "t", ClientSoftwareVersion: "1"}, &av)
	}
	var open []*rawClient
	for range 3 {
		c := rawConn(t, addr, nil)
		apiVersions(c) // accepted and counted
		open = append(open, c)
	}
	over := rawConn(t, addr, nil)
	expectClosed(t, over.nc)
	if n := refusedConns(s, refuseUnauthPerIP); n != 1 {
		t.Fatalf("%v connections refused as %s, want 1", n, refuseUnauthPerIP)
	}
	if n := testutil.ToFloat64(s.connMetrics.unauth); n != 3 {
		t.Errorf("ferry_client_connections_unauthenticated %v, want 3", n)
	}

	plainLogin(t, open[0]) // no longer counts: room for one
	apiVersions(rawConn(t, addr, nil))
	over = rawConn(t, addr, nil)
	expectClosed(t, over.nc)
	if n := refusedConns(s, refuseUnauthPerIP); n != 2 {
		t.Fatalf("%v connections refused as %s, want 2", n, refuseUnauthPerIP)
	}

	if n := testutil.ToFloat64(s.connMetrics.unauth); n != 3 {
		t.Errorf("ferry_client_connections_unauthenticated %v, want 3 (one authenticated, one new)", n)
	}

	open[1].nc.Close() // gives its place back once Ferry sees it closed
	testwait.Eventually(t, 30*time.Second, "a connection served after another closed", func() error {
		c := rawConn(t, addr, nil)
		defer c.nc.Close()
		c.send(t, &kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "t", ClientSoftwareVersion: "1"})
		_, err := c.read()
		return err
	})
}
