package main

// End-to-end tests of the ferry binary: it runs as a child process on free
// loopback ports, driven with franz-go and stopped with SIGTERM, the way an
// operator or an init system would. The child is this test binary itself:
// with FERRY_TEST_RUN_MAIN=1 in its environment, TestMain runs ferry's
// main instead of the tests, so there is nothing to build or clean up.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// runMainEnv makes the test binary run ferry's main (see ferryCmd).
const runMainEnv = "FERRY_TEST_RUN_MAIN"

// TestMain runs ferry when started by ferryCmd, and otherwise the tests,
// under kafkatest.Main: tests with real Kafka (not in -short) start JVMs,
// and none may outlive the test process.
func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main() // exits
	}
	kafkatest.Main(m)
}

// ferryCmd is the command that runs `ferry args...`: this test binary,
// told to run main.
func ferryCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	return cmd
}

// proc is a running ferry process whose output lines the test can wait for.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []string // stdout and stderr lines, in arrival order per stream
	more chan struct{}
	done chan struct{}
	err  error // Wait's result, once done is closed
}

func startFerry(t *testing.T, args ...string) *proc {
	t.Helper()
	return startCmd(t, ferryCmd(t, args...), args)
}

// startCmd starts cmd, a ferry process run with args, and collects its
// output.
func startCmd(t *testing.T, cmd *exec.Cmd, args []string) *proc {
	t.Helper()
	p := &proc{cmd: cmd, more: make(chan struct{}, 1), done: make(chan struct{})}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var readers sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				p.mu.Lock()
				p.out = append(p.out, sc.Text())
				p.mu.Unlock()
				select {
				case p.more <- struct{}{}:
				default:
				}
			}
		}()
	}
	go func() {
		readers.Wait()
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("ferry %s output:\n%s", strings.Join(args, " "), p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.out, "\n")
}

// waitOrExit waits until some output line matches re (true) or the
// process exits first (false).
func (p *proc) waitOrExit(t *testing.T, re *regexp.Regexp, timeout time.Duration) bool {
	t.Helper()
	return p.match(t, re, timeout) != nil
}

// match waits until some output line matches re and returns its
// submatches, or nil once the process has exited without one.
func (p *proc) match(t *testing.T, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	for i := 0; ; {
		p.mu.Lock()
		lines := p.out[i:]
		i = len(p.out)
		p.mu.Unlock()
		for _, l := range lines {
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		}
		select {
		case <-p.more:
		case <-p.done:
			// Read what arrived before the exit, then give up.
			p.mu.Lock()
			rest := p.out[i:]
			p.mu.Unlock()
			for _, l := range rest {
				if m := re.FindStringSubmatch(l); m != nil {
					return m
				}
			}
			return nil
		case <-deadline:
			t.Fatalf("no line matching %q within %s", re, timeout)
		}
	}
}

// kill ends the process and waits for it.
func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Kill()
		<-p.done
	}
}

// waitFor waits until some output line matches re and returns its
// submatches.
func (p *proc) waitFor(t *testing.T, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	m := p.match(t, re, timeout)
	if m == nil {
		t.Fatalf("ferry exited (%v) before printing a line matching %q", p.err, re)
	}
	return m
}

// stop sends SIGTERM and requires a clean exit (status 0) within timeout.
func (p *proc) stop(t *testing.T, timeout time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("ferry did not exit within %s of SIGTERM", timeout)
	}
	if p.err != nil {
		t.Fatalf("ferry exited with %v after SIGTERM, want status 0", p.err)
	}
}

func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// roundTrip creates a topic through Ferry at addr, produces one record to
// it and consumes it back, asserting the offset and the value.
func roundTrip(t *testing.T, addr, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, kgo.SeedBrokers(addr)))
	if _, err := adm.CreateTopic(ctx, 1, -1, nil, topic); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	value := "hello through ferry " + topic
	rec := &kgo.Record{Key: []byte("k"), Value: []byte(value)}
	if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	if rec.Partition != 0 || rec.Offset != 0 {
		t.Fatalf("produced at %d/%d, want 0/0 in a new topic", rec.Partition, rec.Offset)
	}
	cons := newClient(t, kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("nothing consumed: %v", ctx.Err())
		}
		if errs := fs.Errors(); len(errs) > 0 {
			t.Fatalf("fetch: %v", errs)
		}
		if recs := fs.Records(); len(recs) > 0 {
			r := recs[0]
			if len(recs) != 1 || r.Offset != 0 || r.Partition != 0 || string(r.Key) != "k" || string(r.Value) != value {
				t.Fatalf("consumed %d records, first %d/%d %q=%q; want one at 0/0 %q=%q", len(recs), r.Partition, r.Offset, r.Key, r.Value, "k", value)
			}
			return
		}
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	return httpGetToken(t, url, "")
}

// httpGetToken GETs url with the admin token, when not empty, and returns
// the status and body.
func httpGetToken(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

var (
	bootstrapLine = regexp.MustCompile(`Kafka bootstrap:\s+(\S+)`)
	adminLine     = regexp.MustCompile(`Admin API:\s+http://(\S+)/status`)
	standbyLine   = regexp.MustCompile(`Standby direct:\s+(\S+)`)
)

// mirrorSection is the mirror section of /status as a client decodes it.
type mirrorSection struct {
	Enabled bool   `json:"enabled"`
	Running bool   `json:"running"`
	Source  string `json:"source"`
	Target  string `json:"target"`
	Summary struct {
		Partitions    int   `json:"partitions"`
		CaughtUp      int   `json:"caught_up"`
		Halted        int   `json:"halted"`
		MaxLagRecords int64 `json:"max_lag_records"`
		AllCaughtUp   bool  `json:"all_caught_up"`
	} `json:"summary"`
	Partitions []struct {
		Topic          string  `json:"topic"`
		Partition      int32   `json:"partition"`
		State          string  `json:"state"`
		MirroredOffset int64   `json:"mirrored_offset"`
		SourceEnd      int64   `json:"source_end"`
		LagRecords     int64   `json:"lag_records"`
		LagSeconds     float64 `json:"lag_seconds"`
	} `json:"partitions"`
}

// mirrorStatus reads the mirror section of /status.
func mirrorStatus(t *testing.T, adminAddr string) mirrorSection {
	t.Helper()
	code, body := httpGet(t, "http://"+adminAddr+"/status")
	var st struct {
		Mirror mirrorSection `json:"mirror"`
	}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("/status = %d %v: %s", code, err, body)
	}
	return st.Mirror
}

// waitMirrorCaughtUp waits until /status reports every partition of the
// given topic caught up with lag 0 at end offset ends[partition], and every
// mirrored partition caught up.
func waitMirrorCaughtUp(t *testing.T, adminAddr, topic string, ends map[int32]int64) mirrorSection {
	t.Helper()
	var last mirrorSection
	testwait.Eventually(t, 60*time.Second, "/status reports the mirror caught up", func() error {
		last = mirrorStatus(t, adminAddr)
		if !last.Summary.AllCaughtUp || last.Summary.MaxLagRecords != 0 {
			return fmt.Errorf("summary %+v", last.Summary)
		}
		seen := 0
		for _, p := range last.Partitions {
			if p.Topic != topic {
				continue
			}
			seen++
			if p.State != "caught_up" || p.LagRecords != 0 || p.LagSeconds != 0 || p.MirroredOffset != ends[p.Partition] || p.SourceEnd != ends[p.Partition] {
				return fmt.Errorf("%s[%d]: %+v, want caught up at %d", topic, p.Partition, p, ends[p.Partition])
			}
		}
		if seen != len(ends) {
			return fmt.Errorf("%d partitions of %s in %+v, want %d", seen, topic, last.Partitions, len(ends))
		}
		return nil
	})
	return last
}

func TestDemo(t *testing.T) {
	p := startFerry(t, "demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	addr := p.waitFor(t, bootstrapLine, 60*time.Second)[1]
	adminAddr := p.waitFor(t, adminLine, 5*time.Second)[1]

	// The demo topic exists, seen through Ferry; Ferry is the only broker.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addr))).Metadata(ctx, demoTopic)
	if err != nil {
		t.Fatal(err)
	}
	if md.Cluster != demoClusterID || len(md.Brokers) == 0 {
		t.Fatalf("metadata: cluster %q brokers %+v; want %q", md.Cluster, md.Brokers, demoClusterID)
	}
	// Ferry's lanes: one per physical broker, each on a port of its own
	// on Ferry's host, lane 0 at the bootstrap address.
	ports := map[string]bool{}
	for _, b := range md.Brokers {
		hp := fmt.Sprintf("%s:%d", b.Host, b.Port)
		if b.Host != "127.0.0.1" || ports[hp] {
			t.Fatalf("metadata names broker %+v; want only Ferry's lanes, each on its own port", b)
		}
		ports[hp] = true
	}
	if !ports[addr] || len(md.Brokers) != 3 {
		t.Fatalf("metadata brokers %+v; want 3 lanes, one at %s", md.Brokers, addr)
	}
	if n := len(md.Topics[demoTopic].Partitions); n != demoPartitions {
		t.Fatalf("topic %s has %d partitions, want %d", demoTopic, n, demoPartitions)
	}

	roundTrip(t, addr, "e2e")

	// The mirror copied the record produced through Ferry to the standby,
	// at the same offset: read the standby directly.
	standby := p.waitFor(t, standbyLine, time.Second)[1]
	if got := readPartition(t, []string{standby}, "e2e", 0, 1); len(got) != 1 || got[0] != "0=hello through ferry e2e" {
		t.Fatalf("standby e2e[0] holds %v, want the record at offset 0", got)
	}
	ms := waitMirrorCaughtUp(t, adminAddr, "e2e", map[int32]int64{0: 1})
	if !ms.Enabled || !ms.Running || ms.Source != demoPrimary || ms.Target != demoStandby || ms.Summary.Partitions != demoPartitions+1 {
		t.Fatalf("mirror section %+v", ms)
	}
	if code, body := httpGet(t, "http://"+adminAddr+"/metrics"); code != 200 ||
		!strings.Contains(body, `ferry_mirror_mirrored_offset{partition="0",topic="e2e"} 1`) ||
		!strings.Contains(body, `ferry_mirror_lag_records{partition="0",topic="e2e"} 0`) {
		t.Fatalf("/metrics = %d, no ferry_mirror_* for e2e[0]:\n%.3000s", code, body)
	}

	// The admin API reports the routing state and both clusters.
	code, body := httpGet(t, "http://"+adminAddr+"/status")
	var st struct {
		Ready   bool `json:"ready"`
		Routing struct {
			Generation uint32 `json:"generation"`
			Active     string `json:"active"`
		} `json:"routing"`
		Clusters []struct {
			Name      string `json:"name"`
			Reachable bool   `json:"reachable"`
		} `json:"clusters"`
	}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("/status = %d %v: %s", code, err, body)
	}
	if !st.Ready || st.Routing.Generation != 0 || st.Routing.Active != demoPrimary || len(st.Clusters) != 2 ||
		st.Clusters[0].Name != demoPrimary || st.Clusters[1].Name != demoStandby || !st.Clusters[1].Reachable {
		t.Fatalf("/status: %s", body)
	}
	if code, body := httpGet(t, "http://"+adminAddr+"/metrics"); code != 200 || !strings.Contains(body, `ferry_requests_total{api="Produce"} 1`) {
		t.Fatalf("/metrics = %d, no count of the one Produce:\n%.2000s", code, body)
	}

	// The switch, as the guide shows it: a group consumer left running
	// commits what it read, the CLI switches to the standby, and the
	// same consumer (its connections to Ferry kept) rejoins its group
	// there and reads only the record produced since, at the next offset.
	group := newClient(t, kgo.SeedBrokers(addr), kgo.ConsumeTopics("e2e"), kgo.ConsumerGroup("demo-group"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if fs := group.PollFetches(ctx); fs.NumRecords() != 1 {
		t.Fatalf("the group read %d records before the switch, want the 1 produced", fs.NumRecords())
	}
	if err := group.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "switchover", "--admin", adminAddr, "--to", demoStandby)
	if code != 0 || !strings.Contains(strings.Join(strings.Fields(out), " "), "generation 1 active "+demoStandby) {
		t.Fatalf("ferry switchover --to %s: exit %d\n%s%s", demoStandby, code, out, errOut)
	}
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("e2e"))
	r, err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("after the switch")}).First()
	if err != nil || r.Offset != 1 {
		t.Fatalf("produce after the switch: offset %v, %v; want offset 1", r, err)
	}
	if got := readPartition(t, []string{standby}, "e2e", 0, 2); len(got) != 2 || got[1] != "1=after the switch" {
		t.Fatalf("standby e2e[0] holds %v, want the new record at offset 1", got)
	}
	var recs []*kgo.Record
	for len(recs) == 0 {
		fs := group.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the running group read nothing after the switch (%v)", fs.Errors())
		}
		recs = fs.Records()
	}
	if len(recs) != 1 || recs[0].Offset != 1 || string(recs[0].Value) != "after the switch" {
		var got []string
		for _, r := range recs {
			got = append(got, fmt.Sprintf("%d:%s", r.Offset, r.Value))
		}
		t.Fatalf("the running group read %v after the switch, want only 1:after the switch", got)
	}
	group.Close()
	code, out, errOut = runCLI(t, "status", "--admin", adminAddr)
	if code != 0 || !strings.Contains(out, "generation 1, active "+demoStandby+", serving") ||
		!strings.Contains(out, "planned switch "+demoPrimary+" -> "+demoStandby) {
		t.Fatalf("ferry status: exit %d\n%s%s", code, out, errOut)
	}
	// ferry connections lists the clients connected now: the producer's
	// latest requests went to the standby. /metrics counts them by client.
	code, out, errOut = runCLI(t, "connections", "--admin", adminAddr, "--client-id", "kgo", "--sort", "requests")
	if code != 0 || !strings.Contains(out, " "+demoStandby+" ") || !strings.Contains(out, " kgo/") {
		t.Fatalf("ferry connections: exit %d\n%s%s", code, out, errOut)
	}
	if code, body := httpGet(t, "http://"+adminAddr+"/metrics"); code != 200 || !strings.Contains(body, `ferry_clients_requests_total{client_id="kgo",software="kgo"}`) {
		t.Fatalf("/metrics = %d, no ferry_clients_requests_total for kgo:\n%.2000s", code, body)
	}
	code, out, errOut = runCLI(t, "switchover", "--admin", adminAddr, "--to", demoPrimary)
	if code != 0 || !strings.Contains(strings.Join(strings.Fields(out), " "), "generation 2 active "+demoPrimary) {
		t.Fatalf("ferry switchover --to %s (back): exit %d\n%s%s", demoPrimary, code, out, errOut)
	}

	p.stop(t, 15*time.Second)
	if !strings.Contains(p.output(), "Stopping the demo.") {
		t.Fatalf("no goodbye in:\n%s", p.output())
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ferry.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

var adminLog = regexp.MustCompile(`"msg":"admin API listening".*"admin":"([^"]+)"`)

func TestServeUnreachableCluster(t *testing.T) {
	dead := deadAddr(t)
	kafkaAddr := deadAddr(t)
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: vc
listen: %s
admin_listen: 127.0.0.1:0
clusters:
  - name: gone
    bootstrap: [%q]
`, kafkaAddr, dead))
	p := startFerry(t, "serve", "--config", path)
	adminAddr := p.waitFor(t, adminLog, 30*time.Second)[1]

	// It says why, and keeps trying.
	retry := regexp.MustCompile(`"msg":"cluster unreachable; retrying".*"cluster":"gone".*$`)
	line := p.waitFor(t, retry, 60*time.Second)[0]
	if !strings.Contains(line, dead) || !strings.Contains(line, "connection refused") {
		t.Fatalf("the log does not say which address refused: %s", line)
	}
	p.waitFor(t, regexp.MustCompile(`"msg":"cluster unreachable; retrying"`), 30*time.Second)
	time.Sleep(time.Second)
	select {
	case <-p.done:
		t.Fatalf("ferry exited (%v) instead of retrying", p.err)
	default:
	}

	// Alive, not ready, and /status says why.
	if code, _ := httpGet(t, "http://"+adminAddr+"/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if code, body := httpGet(t, "http://"+adminAddr+"/readyz"); code != 503 || !strings.Contains(body, "not started") {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	if _, body := httpGet(t, "http://"+adminAddr+"/status"); !strings.Contains(body, `"reachable": false`) {
		t.Fatalf("/status: %s", body)
	}
	// Clients are refused, as by a broker that is down, rather than
	// accepted and left without an answer.
	if c, err := net.DialTimeout("tcp", kafkaAddr, 5*time.Second); err == nil {
		c.Close()
		t.Fatalf("the Kafka port %s accepts connections while Ferry cannot serve", kafkaAddr)
	} else if !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("dialing the Kafka port: %v, want connection refused", err)
	}

	// The cluster comes up: Ferry serves.
	_, port, _ := net.SplitHostPort(dead)
	portN, _ := strconv.Atoi(port)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(portN), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce once the cluster is up: %v", err)
	}

	p.stop(t, 15*time.Second)
}

// TestServe runs `ferry serve` in front of an in-process cluster, with
// --listen overriding the file.
func TestServe(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: ferry-serve-test
node_id: 5
listen: 127.0.0.1:1
admin_listen: 127.0.0.1:0
clusters:
  - name: main
    bootstrap: [%s]
policy:
  deny: [topic_delete]
log_level: debug
`, strings.Join(kf.ListenAddrs(), ", ")))
	p := startFerry(t, "serve", "--config", path, "--listen", "127.0.0.1:0", "--log-level", "info")
	adminAddr := p.waitFor(t, adminLog, 30*time.Second)[1]
	m := p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 60*time.Second)
	roundTrip(t, m[1], "served")

	// The file's policy is the proxy's: deleting a topic is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	dr, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(m[1]))).DeleteTopic(ctx, "served")
	if err == nil {
		err = dr.Err
	}
	if !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("deleting a topic under policy.deny [topic_delete]: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	if _, body := httpGet(t, "http://"+adminAddr+"/metrics"); !strings.Contains(body, `ferry_refusals_total{api="DeleteTopics",reason="policy"} 1`) {
		t.Fatal("/metrics does not count the refusal in ferry_refusals_total")
	}
	if strings.Contains(p.output(), `"level":"debug"`) {
		t.Fatal("--log-level info did not override log_level: debug")
	}
	p.stop(t, 15*time.Second)
	p.waitFor(t, regexp.MustCompile(`"msg":"stopped"`), time.Second)
}

func TestBadConfigExits2(t *testing.T) {
	path := writeConfig(t, "cluster_id: vc\nclusters: [{name: a, bootstrap: [kafka]}]\nlog_levl: info\n")
	out, err := ferryCmd(t, "serve", "--config", path).CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want status 2; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), `line 3: unknown key "log_levl"`) || strings.Contains(string(out), "panic") {
		t.Fatalf("output:\n%s", out)
	}
}

func TestVersion(t *testing.T) {
	out, err := ferryCmd(t, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ferry ") {
		t.Fatalf("ferry version: %v %q", err, out)
	}
}
