package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestServeOutOfFileDescriptors runs `ferry serve` with a limit of 128
// file descriptors (in a shell that lowers it for the child only), opens
// more idle client connections than that, and checks that Ferry keeps
// running: it counts and logs the accept errors, the admin API answers a
// request that waited meanwhile, and once connections close a new client
// is served. Then the same with admin API connections taking the
// descriptors.
func TestServeOutOfFileDescriptors(t *testing.T) {
	const limit = 128
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: fd-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - name: main
    bootstrap: [%s]
`, kf.ListenAddrs()[0]))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"serve", "--config", path}
	// ulimit -n sets the soft and the hard limit, so Ferry cannot raise it.
	cmd := exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, limit), exe}, args...)...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	p := startCmd(t, cmd, args)
	p.waitFor(t, regexp.MustCompile(`"msg":"file descriptor limit is low.*"soft":128,"hard":128`), 30*time.Second)
	adminAddr := p.waitFor(t, adminLog, 30*time.Second)[1]
	addr := p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 60*time.Second)[1]

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

	// The same with the descriptors taken by admin API connections.
	for range limit + 50 {
		c, err := net.Dial("tcp", adminAddr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"accepting an admin API connection failed; retrying".*"reason":"emfile"`), 30*time.Second)
	select {
	case <-p.done:
		t.Fatalf("ferry exited (%v) when admin connections took every descriptor", p.err)
	default:
	}
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	if code, _ := httpGet(t, "http://"+adminAddr+"/healthz"); code != 200 {
		t.Fatalf("/healthz = %d after the admin connections left", code)
	}
	// Counted, and logged once an interval, not once a retry.
	_, metrics = httpGet(t, "http://"+adminAddr+"/metrics")
	if m := regexp.MustCompile(`(?m)^ferry_admin_accept_errors_total\{reason="emfile"\} (\d+)$`).FindStringSubmatch(metrics); m == nil || m[1] == "0" {
		t.Fatalf("no emfile admin accept errors counted:\n%s", grepLines(metrics, "ferry_admin_accept_errors_total"))
	}
	if n := strings.Count(p.output(), "http: Accept error"); n > 0 {
		t.Fatalf("net/http logged %d accept errors: they are the listener's to retry and sample", n)
	}
	resp, err = (&kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "fd-test", ClientSoftwareVersion: "1"}).RequestWith(ctx, newClient(t, kgo.SeedBrokers(addr)))
	if err != nil || resp.ErrorCode != 0 {
		t.Fatalf("ApiVersions after the admin connections left: %+v, %v", resp, err)
	}
	p.stop(t, 15*time.Second)
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
