package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestServeReloadSIGHUP: `ferry serve` at log level info; the file is
// changed to debug, and lanes (read once, at start) changed too; SIGHUP.
// The member logs that it applied log_level and that lanes needs a
// restart, debug lines appear from then on, and a broken file sent with
// SIGHUP is logged as an error and changes nothing.
func TestServeReloadSIGHUP(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	conf := func(level string, lanes int) string {
		return fmt.Sprintf(`
cluster_id: vc
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
lanes: %d
clusters:
  - name: main
    bootstrap: [%s]
log_level: %s
`, lanes, strings.Join(kf.ListenAddrs(), ", "), level)
	}
	path := writeConfig(t, conf("info", 1))
	p := startFerry(t, "serve", "--config", path)
	m := p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"listen":"([^"]+)"`), 60*time.Second)
	listen := m[1]
	// At info, a client's connection closing is not logged.
	dialClose(t, listen)
	time.Sleep(200 * time.Millisecond)
	if strings.Contains(p.output(), `"level":"debug"`) {
		t.Fatal("debug lines at log_level info")
	}

	if err := os.WriteFile(path, []byte(conf("debug", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"configuration reloaded".*"applied":\["log_level"\].*"log_level":"debug"`), 10*time.Second)
	p.waitFor(t, regexp.MustCompile(`"level":"warn".*"msg":"configuration changes need a restart.*"restart_needed":\["lanes"\]`), 10*time.Second)
	dialClose(t, listen)
	p.waitFor(t, regexp.MustCompile(`"level":"debug".*"msg":"client connection closed"`), 10*time.Second)

	// A broken file: logged, nothing changed, still serving.
	if err := os.WriteFile(path, []byte(conf("info", 1)+"log_levl: info\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, regexp.MustCompile(`"level":"error".*"msg":"configuration not reloaded.*unknown key \\"log_levl\\"`), 10*time.Second)
	roundTrip(t, listen, "after-reload")
	p.stop(t, 15*time.Second)
}

func dialClose(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// TestServeSecondSIGTERMExits: SIGTERM starts the drain, which waits for a
// consumer's long-poll fetch (MaxWait 30 s); a second SIGTERM ends the
// process at once, with status 1.
func TestServeSecondSIGTERMExits(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "quiet"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: vc
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
lanes: 1
clusters:
  - name: main
    bootstrap: [%s]
`, strings.Join(kf.ListenAddrs(), ", ")))
	p := startFerry(t, "serve", "--config", path)
	listen := p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"listen":"([^"]+)"`), 60*time.Second)[1]

	cl := newClient(t, kgo.SeedBrokers(listen), kgo.ConsumeTopics("quiet"), kgo.FetchMaxWait(30*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cl.PollFetches(ctx)
	// Until the member holds a fetch in flight: the long poll the drain
	// will wait for.
	adminAddr := p.waitFor(t, adminLog, 30*time.Second)[1]
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var cz struct {
			Connections []struct {
				InFlight int            `json:"in_flight"`
				Requests map[string]int `json:"requests"`
			} `json:"connections"`
		}
		resp, err := http.Get("http://" + adminAddr + "/connections")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&cz)
			resp.Body.Close()
		}
		parked := false
		for _, c := range cz.Connections {
			parked = parked || (c.InFlight > 0 && c.Requests["Fetch"] > 0)
		}
		if parked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no fetch in flight at the member after 60 s (%v): %+v", err, cz)
		}
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"shutting down"`), 5*time.Second)
	select {
	case <-p.done:
		t.Fatalf("ferry exited (%v) before the long poll was answered: nothing to cut short", p.err)
	case <-time.After(time.Second):
	}
	second := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		t.Fatal("ferry still running 3 s after the second SIGTERM")
	}
	t.Logf("exited %v after the second SIGTERM: %v", time.Since(second).Round(time.Millisecond), p.err)
	if ee, ok := p.err.(interface{ ExitCode() int }); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1", p.err)
	}
	if !strings.Contains(p.output(), "second signal (terminated) while stopping") {
		t.Fatalf("no line about the second signal:\n%s", p.output())
	}
}
