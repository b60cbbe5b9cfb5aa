package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// dialFrom connects to addr from the loopback address src (Linux routes
// all of 127.0.0.0/8 to lo), and checks the connection is served: an
// ApiVersions is answered.
func dialFrom(t *testing.T, src, addr string) (net.Conn, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName, req.ClientSoftwareVersion = "limits-test", "1"
	writeReq(t, c, req, 1)
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return c, err
	}
	return c, nil
}

// TestConnectionLimits: a connection over max_connections_per_ip is closed
// unanswered, one from another address with an override of its own is not,
// a closed connection frees its place, max_connections bounds them all,
// and SetSettings changes the limits for the next connection.
func TestConnectionLimits(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithConnectionLimits(0, 2, map[string]int{"127.0.0.2": 3}))

	var first []net.Conn
	for i := 0; i < 2; i++ {
		c, err := dialFrom(t, "127.0.0.1", addr)
		if err != nil {
			t.Fatalf("connection %d of 2 from 127.0.0.1: %v", i+1, err)
		}
		first = append(first, c)
	}
	if _, err := dialFrom(t, "127.0.0.1", addr); err == nil {
		t.Fatal("a third connection from 127.0.0.1 was served; want it closed (max_connections_per_ip 2)")
	}
	for i := 0; i < 3; i++ {
		if _, err := dialFrom(t, "127.0.0.2", addr); err != nil {
			t.Fatalf("connection %d of 3 from 127.0.0.2 (its override is 3): %v", i+1, err)
		}
	}
	if _, err := dialFrom(t, "127.0.0.2", addr); err == nil {
		t.Fatal("a fourth connection from 127.0.0.2 was served; want it closed (its override is 3)")
	}
	if got := testutil.ToFloat64(s.connMetrics.refused[refusePerIP]); got != 2 {
		t.Errorf("ferry_client_connections_refused_total{reason=max_connections_per_ip} = %v, want 2", got)
	}

	// A closed connection gives its place back.
	first[0].Close()
	testwait.Until(t, 10*time.Second, "four connections open", func() bool { return s.Connections() == 4 })
	if _, err := dialFrom(t, "127.0.0.1", addr); err != nil {
		t.Fatalf("a connection from 127.0.0.1 after one closed: %v", err)
	}

	// max_connections counts every address; raised per-IP limits let
	// 127.0.0.3 in up to it.
	st := s.Settings()
	st.MaxConnections, st.MaxConnectionsPerIP = 6, 10
	if err := s.SetSettings(st); err != nil {
		t.Fatal(err)
	}
	if _, err := dialFrom(t, "127.0.0.3", addr); err != nil {
		t.Fatalf("the sixth connection (max_connections 6): %v", err)
	}
	if _, err := dialFrom(t, "127.0.0.3", addr); err == nil {
		t.Fatal("a seventh connection was served; want it closed (max_connections 6)")
	}
	if got := testutil.ToFloat64(s.connMetrics.refused[refuseMaxConnections]); got != 1 {
		t.Errorf("ferry_client_connections_refused_total{reason=max_connections} = %v, want 1", got)
	}

	bad := st
	bad.PerIPOverrides = map[string]int{"not-an-ip": 1}
	if err := s.SetSettings(bad); !errors.Is(err, ErrConfig) {
		t.Errorf("SetSettings with an override for a host name: %v, want a configuration error", err)
	}
	if got := s.Settings(); got.MaxConnections != 6 {
		t.Errorf("a refused SetSettings changed the settings: %+v", got)
	}
}

// TestSetSettingsIdleTimeout: a shorter connections_max_idle set on a
// running server closes the next idle connection after it.
func TestSetSettingsIdleTimeout(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithConnectionsMaxIdle(time.Hour))
	st := s.Settings()
	st.ConnectionsMaxIdle = 300 * time.Millisecond
	if err := s.SetSettings(st); err != nil {
		t.Fatal(err)
	}
	c, err := dialFrom(t, "127.0.0.1", addr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("waiting for Ferry to close the idle connection: %v", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("closed after %v idle, before the 300ms set", d)
	}
}

// TestLameDuckSpreadsIdleCloses: Shutdown closes idle connections at
// turns spread over the lame-duck period, never before their turn, so the
// last closes near the end of it; a client that sends a request meanwhile
// is closed at once, unanswered.
func TestLameDuckSpreadsIdleCloses(t *testing.T) {
	const n, period = 10, 2 * time.Second
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithLameDuck(period))
	s.cfg.lameDuckMaxGap = time.Second // ten connections fill the period
	var idle []net.Conn
	for i := 0; i < n; i++ {
		c, err := dialFrom(t, "127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		// Drain the rest of the ApiVersions answer.
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		io.Copy(io.Discard, c)
		c.SetDeadline(time.Now().Add(time.Minute))
		idle = append(idle, c)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	closedAt := make(chan time.Duration, n)
	for _, c := range idle {
		go func() {
			io.Copy(io.Discard, c)
			closedAt <- time.Since(start)
		}()
	}
	var at []time.Duration
	for range n {
		at = append(at, <-closedAt)
	}
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	// Turn i of n is at i*period/n: the last at 1.8 s. Late is possible
	// on a busy machine, early is not.
	if last := at[n-1]; last < period*(n-1)/n-50*time.Millisecond {
		t.Errorf("the last idle connection closed %v after Shutdown began, before its turn at %v: closes %v", last, period*(n-1)/n, at)
	}
	if first := at[0]; first > at[n-1]/2 {
		t.Errorf("closes not spread: the first at %v, the last at %v (%v)", first, at[n-1], at)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestLameDuckRequestClosesAtOnce: during the lame-duck period a request
// on a connection whose turn has not come is not read: the connection is
// closed without an answer, long before its turn.
func TestLameDuckRequestClosesAtOnce(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithLameDuck(time.Hour))
	s.cfg.lameDuckMaxGap = time.Hour
	var cs []net.Conn
	for i := 0; i < 2; i++ {
		c, err := dialFrom(t, "127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		io.Copy(io.Discard, c)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		cs = append(cs, c)
	}
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	testwait.Until(t, 10*time.Second, "the server draining", func() bool { return s.draining.Load() })
	// With two connections in a one-hour period, one has its turn in 30
	// minutes: whichever it is, a request closes it now.
	for _, c := range cs {
		writeReq(t, c, kmsg.NewPtrMetadataRequest(), 2)
		var b [1]byte
		if _, err := c.Read(b[:]); err == nil {
			t.Fatal("a request during the lame-duck period was answered; want the connection closed")
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("a request during the lame-duck period left the connection open")
		}
	}
	testwait.Until(t, 10*time.Second, "every connection closed", func() bool { return s.Connections() == 0 })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
