package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// serveWithFDLimit runs `ferry serve` in front of a kfake cluster with a
// limit of limit file descriptors (in a shell that lowers it for the child
// only), the configuration's admin keys given by adminKeys, and returns it
// with its admin and Kafka addresses.
func serveWithFDLimit(t *testing.T, limit int, adminKeys string) (p *proc, adminAddr, addr string) {
	t.Helper()
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: fd-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
%s
clusters:
  - name: main
    bootstrap: [%s]
`, adminKeys, kf.ListenAddrs()[0]))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"serve", "--config", path}
	// ulimit -n sets the soft and the hard limit, so Ferry cannot raise it.
	cmd := exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, limit), exe}, args...)...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	p = startCmd(t, cmd, args)
	p.waitFor(t, regexp.MustCompile(fmt.Sprintf(`"msg":"file descriptor limit.*"soft":%d,"hard":%d`, limit, limit)), 30*time.Second)
	adminAddr = p.waitFor(t, adminLog, 30*time.Second)[1]
	addr = p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 60*time.Second)[1]
	return p, adminAddr, addr
}

// TestServeOutOfFileDescriptors runs `ferry serve` with a limit of 128
// file descriptors, opens more idle client connections than that, and
// checks that Ferry keeps running: it counts and logs the accept errors,
// of the Kafka listener and of the admin API, the admin API answers a
// request that waited meanwhile, and once connections close a new client
// is served. Then admin API connections cannot take the descriptors: more
// than its bound are closed, and a Kafka client is served meanwhile.
func TestServeOutOfFileDescriptors(t *testing.T) {
	const limit = 128
	// The admin API may hold at most a quarter of the descriptors: 32.
	p, adminAddr, addr := serveWithFDLimit(t, limit, "admin_max_connections: 16")
	p.waitFor(t, regexp.MustCompile(`"msg":"file descriptor limit is low.*"soft":128,"hard":128`), 30*time.Second)

	// /status reports the limit.
	_, body := httpGet(t, "http://"+adminAddr+"/status")
	var st struct {
		Process struct {
			FDLimit uint64 `json:"fd_limit"`
			FDsOpen *int   `json:"fds_open"`
		} `json:"process"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.Process.FDLimit != limit || st.Process.FDsOpen == nil || *st.Process.FDsOpen >= limit {
		t.Fatalf("/status process section %+v (%v), want fd_limit %d and fds_open below it:\n%s", st.Process, err, limit, body)
	}

	// More idle clients than Ferry has descriptors: the kernel completes
	// their handshakes, Ferry accepts until it runs out.
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range limit + 50 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"accepting a client connection failed; retrying".*"reason":"emfile"`), 30*time.Second)

	// An admin request made now waits in the backlog until a descriptor
	// is free; the admin server is still there to answer it.
	adminDone := make(chan error, 1)
	go func() {
		cl := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := cl.Get("http://" + adminAddr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != 200 {
				err = fmt.Errorf("/healthz = %d", resp.StatusCode)
			}
		}
		adminDone <- err
	}()
	// It waits because accepting it fails too: retried, and logged once an
	// interval, not once a retry.
	p.waitFor(t, regexp.MustCompile(`"msg":"accepting an admin API connection failed; retrying".*"reason":"emfile"`), 30*time.Second)

	select {
	case <-p.done:
		t.Fatalf("ferry exited (%v) when it ran out of file descriptors", p.err)
	default:
	}

	// The idle clients leave; a new one is answered.
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t, kgo.SeedBrokers(addr))
	resp, err := (&kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "fd-test", ClientSoftwareVersion: "1"}).RequestWith(ctx, cl)
	if err != nil || resp.ErrorCode != 0 || len(resp.ApiKeys) == 0 {
		t.Fatalf("ApiVersions after the clients left: %+v, %v", resp, err)
	}
	if err := <-adminDone; err != nil {
		t.Fatalf("admin request made while out of descriptors: %v", err)
	}

	// The accept errors were counted.
	_, metrics := httpGet(t, "http://"+adminAddr+"/metrics")
	m := regexp.MustCompile(`(?m)^ferry_accept_errors_total\{reason="emfile"\} (\d+)$`).FindStringSubmatch(metrics)
	if m == nil || m[1] == "0" {
		t.Fatalf("no emfile accept errors counted:\n%s", grepLines(metrics, "ferry_accept_errors_total"))
	}

	// The admin API's accept errors were counted, and logged once an
	// interval, not once a retry.
	if m := regexp.MustCompile(`(?m)^ferry_admin_accept_errors_total\{reason="emfile"\} (\d+)$`).FindStringSubmatch(metrics); m == nil || m[1] == "0" {
		t.Fatalf("no emfile admin accept errors counted:\n%s", grepLines(metrics, "ferry_admin_accept_errors_total"))
	}
	if n := strings.Count(p.output(), "http: Accept error"); n > 0 {
		t.Fatalf("net/http logged %d accept errors: they are the listener's to retry and sample", n)
	}

	// Admin API connections cannot take the descriptors: past its bound
	// they are closed, and a Kafka client is served while they stay.
	idle = holdAdminConnections(t, adminAddr, limit+50, 1)
	resp, err = (&kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "fd-test", ClientSoftwareVersion: "1"}).RequestWith(ctx, newClient(t, kgo.SeedBrokers(addr)))
	if err != nil || resp.ErrorCode != 0 {
		t.Fatalf("ApiVersions with %d admin connections asked for: %+v, %v", limit+50, resp, err)
	}
	select {
	case <-p.done:
		t.Fatalf("ferry exited (%v) under admin connections", p.err)
	default:
	}
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	if code := adminGetFresh(t, adminAddr, "/healthz"); code != 200 {
		t.Fatalf("/healthz = %d after the admin connections left", code)
	}
	p.stop(t, 15*time.Second)
}

// TestAdminConnectionsCannotStarveKafka: with the descriptor limit at 1024
// and 1100 connections to the admin port from 100 addresses (11 each,
// under admin_max_connections_per_ip), each sending a request and then
// idling on keep-alive, the admin API holds at most admin_max_connections
// (default 64) and closes the rest at once, counted: a Kafka client still
// connects and is answered, and the admin API answers again once the idle
// connections are gone.
func TestAdminConnectionsCannotStarveKafka(t *testing.T) {
	const limit, conns = 1024, 1100
	p, adminAddr, addr := serveWithFDLimit(t, limit, "")
	idle := holdAdminConnections(t, adminAddr, conns, 100)
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	// Let the admin API take what it takes: each connection answered or
	// closed, or still waiting in the backlog 10 s on.
	answered := 0
	settled := time.Now().Add(10 * time.Second)
	for _, c := range idle {
		c.SetReadDeadline(settled)
		if _, err := c.Read(make([]byte, 1)); err == nil {
			answered++
		}
	}
	if answered > 64 {
		t.Errorf("%d of %d admin connections answered, want at most admin_max_connections (64)", answered, conns)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := (&kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "fd-test", ClientSoftwareVersion: "1"}).RequestWith(ctx, newClient(t, kgo.SeedBrokers(addr)))
	if err != nil || resp.ErrorCode != 0 || len(resp.ApiKeys) == 0 {
		t.Fatalf("ApiVersions with %d admin connections asked for: %+v, %v", conns, resp, err)
	}
	select {
	case <-p.done:
		t.Fatalf("ferry exited (%v) under admin connections", p.err)
	default:
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"admin API connection closed: too many open","reason":"max_connections","max":64`), 30*time.Second)
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	if code := adminGetFresh(t, adminAddr, "/healthz"); code != 200 {
		t.Fatalf("/healthz = %d after the admin connections left", code)
	}
	// At most 64 of the 1100, open together, were held: the rest refused.
	_, metrics := httpGet(t, "http://"+adminAddr+"/metrics")
	m := regexp.MustCompile(`(?m)^ferry_admin_connections_refused_total\{reason="max_connections"\} (\d+)$`).FindStringSubmatch(metrics)
	n := -1
	if m != nil {
		n, _ = strconv.Atoi(m[1])
	}
	if n < conns-64 {
		t.Fatalf("admin connections refused: %v, want at least %d:\n%s", m, conns-64, grepLines(metrics, "ferry_admin_connections"))
	}
	p.stop(t, 15*time.Second)
}

// holdAdminConnections opens n connections to the admin API, from as many
// as sources loopback addresses in turn (127.0.0.1 and on; Linux routes
// 127.0.0.0/8 to lo), each sending a request and keeping the connection (HTTP/1.1
// keep-alive), without waiting for answers; those the server closes stay in
// the list too.
func holdAdminConnections(t *testing.T, adminAddr string, n, sources int) []net.Conn {
	t.Helper()
	var held []net.Conn
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, byte(i%sources/250), byte(1+i%sources%250))}, Timeout: 30 * time.Second}
		c, err := d.Dial("tcp", adminAddr)
		if err != nil {
			for _, c := range held {
				c.Close()
			}
			t.Fatalf("dialing admin connection %d: %v", len(held), err)
		}
		held = append(held, c)
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: ferry\r\n\r\n") // refused ones may fail: not an error
	}
	return held
}

// adminGetFresh GETs path on new connections until one is answered (the
// admin API frees the places of connections gone as it sees them close),
// within 60 s, and returns the status.
func adminGetFresh(t *testing.T, adminAddr, path string) int {
	t.Helper()
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := cl.Get("http://" + adminAddr + path)
		if err == nil {
			resp.Body.Close()
			return resp.StatusCode
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// admin_max_connections above a quarter of the descriptor limit is refused
// at start, naming the key; the default fits a limit of 256 and more.
func TestAdminConnectionsWithinFDLimit(t *testing.T) {
	for _, tc := range []struct {
		max  int
		fds  uint64
		fail bool
	}{
		{64, 1024, false}, {64, 256, false}, {64, 255, true}, {64, 128, true}, {16, 128, false}, {300, 1024, true}, {64, 0, false},
	} {
		err := checkAdminConnections(tc.max, tc.fds)
		if (err != nil) != tc.fail || (err != nil && !strings.Contains(err.Error(), fmt.Sprintf("admin_max_connections %d is more than a quarter of the file descriptor limit (%d)", tc.max, tc.fds))) {
			t.Errorf("admin_max_connections %d with %d descriptors: %v, want an error: %v", tc.max, tc.fds, err, tc.fail)
		}
	}
	// ferry serve says so and exits 2 with the default at a limit of 128.
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	path := writeConfig(t, fmt.Sprintf("cluster_id: fd-test\nlisten: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nclusters:\n  - name: main\n    bootstrap: [%s]\n", kf.ListenAddrs()[0]))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // it would serve on
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", `ulimit -n 128 && exec "$0" "$@"`, exe, "serve", "--config", path)
	cmd.WaitDelay = time.Second
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "admin_max_connections 64 is more than a quarter of the file descriptor limit (128)") {
		t.Fatalf("ferry serve with the default at 128 descriptors: %v\n%s", err, out)
	}
}
