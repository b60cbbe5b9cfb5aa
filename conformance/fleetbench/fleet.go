package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// member is one `ferry serve` process of the benchmark's fleet, with the
// addresses it keeps across restarts.
type member struct {
	id                   int32
	kafka, admin, gossip string
	log                  string // log file, appended to across restarts

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the running process exited
}

// testbed is the members in front of a primary and a standby.
type testbed struct {
	bin, dir         string
	key              string
	primary, standby *kafkatest.Cluster
	members          []*member
	http             *http.Client
	logLevel         string
}

func newTestbed(dir, bin string, primary, standby *kafkatest.Cluster, n int, logLevel string) (*testbed, error) {
	key, err := benchutil.WriteGossipKey(dir, 1)
	if err != nil {
		return nil, err
	}
	f := &testbed{bin: bin, dir: dir, key: key, primary: primary, standby: standby, http: &http.Client{Timeout: 10 * time.Second}, logLevel: logLevel}
	for i := range n {
		var addrs [3]string
		for j := range addrs {
			if addrs[j], err = benchutil.FreeGossipAddr(); err != nil {
				return nil, err
			}
		}
		f.members = append(f.members, &member{
			id: int32(i), kafka: addrs[0], admin: addrs[1], gossip: addrs[2],
			log: filepath.Join(os.TempDir(), fmt.Sprintf("fleetbench-member-%d.log", i)),
		})
	}
	for _, m := range f.members {
		os.Remove(m.log)
	}
	return f, nil
}

// config is member m's configuration with the given gossip seeds: the
// write lease and memberlist timings are Ferry's defaults.
func (f *testbed) config(m *member, seeds []string) (string, error) {
	cfg := fmt.Sprintf(`cluster_id: ferry-fleetbench
node_id: %d
listen: %s
admin_listen: %s
log_level: %s
clusters:
  - {name: primary, bootstrap: [%s]}
  - {name: standby, bootstrap: [%s]}
mirror: {sync_interval: 1s}
fleet:
  bind: %s
  seeds: [%s]
  key_file: %s
`, m.id, m.kafka, m.admin, f.logLevel, f.primary.Bootstrap(), f.standby.Bootstrap(), m.gossip, strings.Join(seeds, ", "), f.key)
	path := filepath.Join(f.dir, fmt.Sprintf("member-%d.yaml", m.id))
	return path, os.WriteFile(path, []byte(cfg), 0o644)
}

// ids is every member's node ID.
func (f *testbed) ids() []int32 {
	var out []int32
	for _, m := range f.members {
		out = append(out, m.id)
	}
	return out
}

// allSeeds is every member's gossip address.
func (f *testbed) allSeeds() []string {
	var out []string
	for _, m := range f.members {
		out = append(out, m.gossip)
	}
	return out
}

// bootstrap lists every member's Kafka address.
func (f *testbed) bootstrap() []string {
	var out []string
	for _, m := range f.members {
		out = append(out, m.kafka)
	}
	return out
}

// start runs member m with seeds; it returns once the process runs (not
// once it is ready).
func (f *testbed) start(m *member, seeds []string) error {
	path, err := f.config(m, seeds)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "---- fleetbench: start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(f.bin, "serve", "--config", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	return nil
}

// running reports whether m's process runs.
func (m *member) running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done == nil {
		return false
	}
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and returns the moment it was sent, once the process
// is reaped.
func (m *member) kill() time.Time {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	at := time.Now()
	cmd.Process.Kill()
	<-done
	return at
}

// stop drains m (SIGTERM), killing it after grace.
func (m *member) stop(grace time.Duration) {
	if !m.running() {
		return
	}
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		cmd.Process.Kill()
		<-done
	}
}

func (f *testbed) stopAll() {
	var wg sync.WaitGroup
	for _, m := range f.members {
		wg.Go(func() { m.stop(20 * time.Second) })
	}
	wg.Wait()
}

// status reads m's /status.
func (f *testbed) status(ctx context.Context, m *member) (admin.Status, error) {
	var st admin.Status
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.admin+"/status", nil)
	resp, err := f.http.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// ready reports whether m's /readyz answers 200.
func (f *testbed) ready(ctx context.Context, m *member) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.admin+"/readyz", nil)
	resp, err := f.http.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// metric reads one sample of m's /metrics: the line that starts with
// name (with its labels, e.g. `ferry_fleet_members{state="alive"}`).
func (f *testbed) metric(ctx context.Context, m *member, name string) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.admin+"/metrics", nil)
	resp, err := f.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	var sum float64
	found := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") || (strings.HasPrefix(line, name+"{") && !strings.Contains(name, "{")) {
			fs := strings.Fields(line)
			v, err := strconv.ParseFloat(fs[len(fs)-1], 64)
			if err == nil {
				sum += v
				found = true
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("%s: no %s", m.admin, name)
	}
	return sum, sc.Err()
}

// waitAlive waits until each of the members ids is ready and lists
// exactly ids alive.
func (f *testbed) waitAlive(ctx context.Context, ids ...int32) error {
	want := slices.Clone(ids)
	slices.Sort(want)
	start := time.Now()
	deadline := start.Add(2 * time.Minute)
	for {
		ok, last := true, ""
		for _, id := range want {
			m := f.members[id]
			if !m.running() {
				return fmt.Errorf("member %d exited (log %s)", id, m.log)
			}
			if !f.ready(ctx, m) {
				ok, last = false, fmt.Sprintf("member %d not ready", id)
				break
			}
			st, err := f.status(ctx, m)
			if got := st.Alive(); err != nil || !slices.Equal(got, want) {
				ok, last = false, fmt.Sprintf("member %d: alive %v (%v)", id, got, err)
				break
			}
		}
		if ok {
			if took := time.Since(start); took > 5*time.Second {
				step("the members took %v to agree on %v alive", ms2(took), want)
			}
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("members did not agree on %v alive within 2 minutes: %s", want, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
