package admin

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// serveTCP serves f's admin API on a loopback listener (wrapped by wrap,
// when given) and returns its address.
func serveTCP(t *testing.T, f *fixture, wrap func(net.Listener) net.Listener) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if wrap != nil {
		ln = wrap(ln)
	}
	done := make(chan error, 1)
	go func() { done <- f.srv.Serve(ln) }()
	t.Cleanup(func() {
		f.srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return addr
}

// getOn sends GET path on an open connection and reads the answer, leaving
// the connection open (HTTP/1.1 keep-alive).
func getOn(t *testing.T, c net.Conn, br *bufio.Reader, path string) int {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: ferry\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// A keep-alive connection left idle is closed after the idle timeout, not
// held open for ever.
func TestKeepAliveClosedWhenIdle(t *testing.T) {
	f := newFixture(t, WithIdleTimeout(300*time.Millisecond))
	addr := serveTCP(t, f, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	if code := getOn(t, c, br, "/healthz"); code != 200 { // HTTP/1.1: kept alive
		t.Fatalf("/healthz = %d", code)
	}
	if n, err := br.ReadByte(); err == nil {
		t.Fatalf("read %q; want the connection closed", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("idle keep-alive connection left open")
	}
}

// emfileListener fails its first n Accepts as a process out of file
// descriptors does.
type emfileListener struct {
	net.Listener
	n chan struct{}
}

func (l *emfileListener) Accept() (net.Conn, error) {
	select {
	case <-l.n:
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	default:
		return l.Listener.Accept()
	}
}

// Running out of file descriptors does not end the admin API: net/http
// retries such accept errors with a backoff.
func TestServeSurvivesAcceptErrors(t *testing.T) {
	f := newFixture(t)
	n := make(chan struct{}, 5)
	for range cap(n) {
		n <- struct{}{}
	}
	addr := serveTCP(t, f, func(ln net.Listener) net.Listener { return &emfileListener{Listener: ln, n: n} })
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(n) != 0 {
		t.Fatalf("/healthz = %d after %d of 5 accept errors", resp.StatusCode, 5-len(n))
	}
}

// /status reports the descriptor limit and how many are open.
func TestStatusReportsFDs(t *testing.T) {
	f := newFixture(t)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	_, body := f.get(t, "/status")
	var st struct {
		Process struct {
			FDLimit     uint64 `json:"fd_limit"`
			FDLimitHard uint64 `json:"fd_limit_hard"`
			FDsOpen     *int   `json:"fds_open"`
		} `json:"process"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	p := st.Process
	if p.FDLimit != lim.Cur || p.FDLimitHard != lim.Max || p.FDsOpen == nil || *p.FDsOpen < 3 || uint64(*p.FDsOpen) > lim.Cur {
		t.Fatalf("process %+v (open %v), want limit %d/%d and a plausible open count", p, p.FDsOpen, lim.Cur, lim.Max)
	}
}

// The admin API holds at most WithMaxConnections connections, in all and
// from one address: one more is closed as soon as it is accepted, counted
// by the bound and logged once per bound, while those open are served;
// once one leaves, a new one is served.
func TestMaxConnections(t *testing.T) {
	const maxConns, perIP = 5, 2
	core, logs := observer.New(zapcore.WarnLevel)
	f := newFixture(t, WithMaxConnections(maxConns, perIP), WithLogger(zap.New(core)))
	addr := serveTCP(t, f, nil)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// Each from its own loopback address (Linux routes 127.0.0.0/8 to lo).
	dial := func(from string) (net.Conn, *bufio.Reader) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 30 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		return c, bufio.NewReader(c)
	}
	closed := func(from string) {
		c, br := dial(from)
		defer c.Close()
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: ferry\r\n\r\n")
		if b, err := br.ReadByte(); err == nil {
			t.Fatalf("a connection from %s over a bound read %q, want it closed", from, b)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("a connection from %s over a bound left open", from)
		}
	}
	hold := func(from ...string) { // served and kept alive
		for _, from := range from {
			c, br := dial(from)
			held = append(held, c)
			if code := getOn(t, c, br, "/healthz"); code != 200 {
				t.Fatalf("/healthz from %s = %d", from, code)
			}
		}
	}
	start := time.Now()
	hold("127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2")
	for range 3 {
		closed("127.0.0.1") // over its address's bound
	}
	hold("127.0.0.3")
	for range 5 {
		closed("127.0.0.4") // over the bound in all
	}
	metricsHas(t, f, `ferry_admin_connections_refused_total{reason="max_connections_per_ip"} 3`,
		`ferry_admin_connections_refused_total{reason="max_connections"} 5`)
	if n, most := logs.FilterMessage("admin API connection closed: too many open").Len(), sampledLines(2, start); n < 2 || n > most {
		t.Errorf("%d log lines for 8 refused connections, want 2 to %d (one per bound per interval)", n, most)
	}
	// Those open are still served.
	if code := getOn(t, held[0], bufio.NewReader(held[0]), "/healthz"); code != 200 {
		t.Fatalf("/healthz on a connection held = %d", code)
	}
	// One leaves: a new connection is served once the server has seen it go.
	held[0].Close()
	held = held[1:]
	testwait.Eventually(t, 30*time.Second, fmt.Sprintf("a connection served after one of %d left", maxConns), func() error {
		c, br := dial("127.0.0.4")
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: ferry\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		c.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			return fmt.Errorf("/healthz = %d", resp.StatusCode)
		}
		return nil
	})
}
