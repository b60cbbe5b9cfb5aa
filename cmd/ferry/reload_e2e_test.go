package main

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
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

	// A connection limit, applied by SIGHUP: with one connection from
	// 127.0.0.5 open (Linux routes 127/8 to lo), the next from it is
	// closed unanswered. (The clients above hold 127.0.0.1's.)
	if err := os.WriteFile(path, []byte(conf("debug", 2)+"max_connections_per_ip_overrides: {127.0.0.5: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"configuration reloaded".*"applied":\["max_connections_per_ip_overrides"\]`), 10*time.Second)
	from := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 5)}, Timeout: 5 * time.Second}
	first := newClient(t, kgo.SeedBrokers(listen), kgo.Dialer(from.DialContext))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := first.Ping(ctx); err != nil {
		t.Fatalf("the first connection under max_connections_per_ip 1: %v", err)
	}
	c, err := from.Dial("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a second connection from the address: read %d bytes, %v; want it closed", n, err)
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"refused a client connection: connection limit reached".*"reason":"max_connections_per_ip"`), 10*time.Second)
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
// produce the broker holds (a long-poll fetch would be answered at once);
// a second SIGTERM ends the process at once, with status 1.
func TestServeSecondSIGTERMExits(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "quiet"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	release := make(chan struct{})
	defer close(release)
	kf.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		<-release
		return nil, nil, false
	})
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

	cl := newClient(t, kgo.SeedBrokers(listen), kgo.DefaultProduceTopic("quiet"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cl.Produce(ctx, &kgo.Record{Value: []byte("held")}, nil)
	// Until the member holds the produce in flight: what the drain will
	// wait for.
	adminAddr := p.waitFor(t, adminLog, 30*time.Second)[1]
	testwait.Eventually(t, 60*time.Second, "a produce in flight at the member", func() error {
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
		for _, c := range cz.Connections {
			if c.InFlight > 0 && c.Requests["Produce"] > 0 {
				return nil
			}
		}
		return fmt.Errorf("none (%v): %+v", err, cz)
	})

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"shutting down"`), 5*time.Second)
	select {
	case <-p.done:
		t.Fatalf("ferry exited (%v) before the produce was answered: nothing to cut short", p.err)
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
