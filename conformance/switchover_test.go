package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	ferryadmin "github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
)

// Planned switchovers under continuous traffic from every client program
// with the stream mode (clients(t): Java, librdkafka, kafkajs, kafka-python
// and confluent-kafka-go, each consumer group protocol it has), on real Kafka,
// through the ferry binary (franz-go is covered by
// cmd/ferry/switchover_kafka_test.go). Each client program runs its stream
// mode: an idempotent producer, a transactional producer, consumer groups on
// the idempotent topic and a read_committed group on the transactional one,
// all at once, while Ferry switches primary → standby → primary.

const (
	switchPartitions = 3
	// switchRate is each idempotent producer's records per second.
	switchRate = 100
	// Progress each role must make in a window (before the first switch,
	// between the switches, after the last) before the test goes on.
	switchAcks    = 200 // idempotent producer acknowledgments
	switchTxns    = 3   // transactions committed
	switchRecords = 100 // records consumed
	// switchLogLevel is Ferry's log level; FERRY_SWITCH_LOG overrides it
	// (debug, when chasing a failure).
	switchLogLevel = "info"
)

// streamEvent is one line of a client program's stream mode.
type streamEvent struct {
	Role       string `json:"role"`
	Ev         string `json:"ev"`
	Partition  int32  `json:"partition"`
	Offset     int64  `json:"offset"`
	Value      string `json:"value"`
	Txn        int    `json:"txn"`
	Outcome    string `json:"outcome"`
	AfterError bool   `json:"after_error"`
	Code       string `json:"code"`
	Error      string `json:"error"`
	Fatal      bool   `json:"fatal"`
	// Offsets is a commit's (committed): partition → offset.
	Offsets map[int32]int64 `json:"offsets"`

	window int // switches begun when the test read the line
	seq    int // the line's place in the program's output
}

// streamRole is what one role of a client program reported.
type streamRole struct {
	client, name string
	kind         string // produce, txn, consume
	topic, group string
	readCommit   bool

	acks []streamEvent // produce, txn: acknowledged records
	recs []streamEvent // consume: records read, in order
	// commits: what each commit that succeeded acknowledged, in order.
	commits []streamEvent
	errs    []streamEvent
	ends    map[int]streamEvent // txn: outcome by transaction
	done    bool
	retrys  int // txn: retriable errors the client retried by itself
}

func (r *streamRole) label() string { return r.client + "/" + r.name }

// streamProc is a client program running its stream mode.
type streamProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	window *atomic.Int32
	lines  int // events read so far (under mu)

	mu     sync.Mutex
	roles  map[string]*streamRole
	order  []string
	bad    []string // lines that were not events
	stderr bytes.Buffer
	exited chan struct{}
	err    error
}

func (p *streamProc) addRole(r *streamRole) {
	r.client = p.name
	r.ends = map[int]streamEvent{}
	p.roles[r.name] = r
	p.order = append(p.order, r.name)
}

func (p *streamProc) start(t *testing.T) {
	t.Helper()
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	p.exited = make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			p.line(sc.Bytes())
		}
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.exited)
	}()
}

func (p *streamProc) line(b []byte) {
	var e streamEvent
	err := json.Unmarshal(b, &e)
	e.window = int(p.window.Load())
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lines++
	e.seq = p.lines
	r := p.roles[e.Role]
	if err != nil || r == nil {
		p.bad = append(p.bad, string(b))
		return
	}
	switch e.Ev {
	case "ack":
		r.acks = append(r.acks, e)
	case "rec":
		r.recs = append(r.recs, e)
	case "committed":
		r.commits = append(r.commits, e)
	case "end":
		r.ends[e.Txn] = e
	case "error":
		r.errs = append(r.errs, e)
	case "retry":
		r.retrys++
	case "done":
		r.done = true
	default:
		p.bad = append(p.bad, string(b))
	}
}

// stop asks the program to stop a role.
func (p *streamProc) stop(t *testing.T, role string) {
	t.Helper()
	if _, err := fmt.Fprintf(p.stdin, "stop %s\n", role); err != nil {
		t.Fatalf("%s: stop %s: %v", p.name, role, err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() < 1<<20 {
		l.w.Write(b)
	}
	return len(b), nil
}

// ferryServe is the ferry binary running `serve`.
type ferryServe struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    string // its log file
	addr   string // Kafka bootstrap
	admin  string // admin API host:port
	seat   *fleetSeat
}

// keepPath is where a failed run keeps one of its logs, named name, beyond
// its temporary directory: under FERRY_KEEP_LOGS, or "" when that is unset.
// Each run of a test gets its own prefix (with -count, a failure's logs
// would overwrite another's): the time the run first asked.
func keepPath(t *testing.T, name string) string {
	keep := os.Getenv("FERRY_KEEP_LOGS")
	if keep == "" || os.MkdirAll(keep, 0o755) != nil {
		return ""
	}
	stamp, _ := keepStamps.LoadOrStore(t, time.Now().Format("150405.000"))
	return filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_")+"-"+stamp.(string)+"-"+name)
}

var keepStamps sync.Map

// keepLog keeps a failed run's log text as name under FERRY_KEEP_LOGS.
func keepLog(t *testing.T, name, text string) {
	if keep := keepPath(t, name); keep != "" {
		os.WriteFile(keep, []byte(text), 0o644)
	}
}

// fleetSeat is a member's place in a fleet: its node ID and gossip
// address, every member's gossip address (the seeds) and the gossip key.
type fleetSeat struct {
	nodeID  int32
	gossip  string
	seeds   []string
	keyFile string
	// unmirrored, when set, is a regular expression of topics the mirror
	// leaves alone.
	unmirrored string
	// listen is the address the member served clients at when it first
	// started: a restarted member listens there again, as a member
	// behind a fixed address would, so that a client bootstrapping
	// afresh still finds the fleet.
	listen string
	// env is added to the member's environment (the fault hooks of a
	// -tags faults build read theirs there).
	env []string
}

// mirrorExclude is the mirror section's topic selection for seat.
func mirrorExclude(seat *fleetSeat) string {
	if seat == nil || seat.unmirrored == "" {
		return ""
	}
	return fmt.Sprintf(", topics: {exclude: [%q]}", seat.unmirrored)
}

// buildFerry builds cmd/ferry once into dir, with the build tags given
// ("faults": the fault-injection hooks of cmd/ferry/faults.go).
func buildFerry(dir string, tags ...string) (string, error) {
	bin := filepath.Join(dir, "ferry")
	out, err := exec.Command("go", "build", "-tags="+strings.Join(tags, ","), "-o", bin, "github.com/ferry-gw/ferry/cmd/ferry").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/ferry: %w\n%s", err, out)
	}
	return bin, nil
}

var (
	adminListening = regexp.MustCompile(`"msg":"admin API listening".*"admin":"([^"]+)"`)
	servingClients = regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`)
)

// startFerryServe runs `ferry serve` with a configuration of two clusters
// and the mirror on, logging to a file, until the test ends; it returns
// once Ferry serves clients.
func startFerryServe(t *testing.T, bin string, primary, standby *kafkatest.Cluster) *ferryServe {
	t.Helper()
	return startFerryMember(t, bin, primary, standby, nil)
}

// startFerryMember is startFerryServe for one member of a fleet when seat
// is not nil: the configuration gets its node ID and a fleet section.
func startFerryMember(t *testing.T, bin string, primary, standby *kafkatest.Cluster, seat *fleetSeat) *ferryServe {
	t.Helper()
	return startFerryWith(t, bin, primary, standby, seat, "")
}

// startFerryWith is startFerryMember with extra configuration lines
// (e.g. a policy section).
func startFerryWith(t *testing.T, bin string, primary, standby *kafkatest.Cluster, seat *fleetSeat, extra string) *ferryServe {
	t.Helper()
	for attempt := 1; ; attempt++ {
		f, clash := startFerryOnce(t, bin, primary, standby, seat, extra)
		if !clash {
			return f
		}
		// A gossip port is picked free before the member binds it, and
		// another process (a broker, another test's member) can take it
		// in between: the member starts again on a new one. Its peers'
		// seed lists keep the old address; a member joins through any seed
		// that answers.
		if seat == nil || attempt == 3 {
			b, _ := os.ReadFile(f.log)
			t.Fatalf("ferry serve exited, its address taken (%v):\n%s", f.cmd.ProcessState, b)
		}
		old := seat.gossip
		seat.gossip = freeGossipAddr(t)
		t.Logf("%s: an address was taken before it bound it (gossip %s); starting again with gossip on %s", f.name(), old, seat.gossip)
	}
}

// startFerryOnce is one attempt of startFerryWith; clash is true when the
// member exited because an address it was to listen on was taken.
func startFerryOnce(t *testing.T, bin string, primary, standby *kafkatest.Cluster, seat *fleetSeat, extra string) (_ *ferryServe, clash bool) {
	t.Helper()
	dir := t.TempDir()
	level := switchLogLevel
	if l := os.Getenv("FERRY_SWITCH_LOG"); l != "" {
		level = l
	}
	listen := "127.0.0.1:0"
	if seat != nil && seat.listen != "" {
		listen = seat.listen
	}
	cfg := fmt.Sprintf(`cluster_id: ferry-switch-clients
listen: %s
admin_listen: 127.0.0.1:0
log_level: %s
clusters:
  - {name: primary, bootstrap: [%s]}
  - {name: standby, bootstrap: [%s]}
mirror: {sync_interval: 1s%s}
`, listen, level, strings.Join(primary.Addrs(), ", "), strings.Join(standby.Addrs(), ", "), mirrorExclude(seat))
	cfg += extra
	if seat != nil {
		cfg += fmt.Sprintf("node_id: %d\nfleet: {bind: %q, seeds: [%s], key_file: %q}\n",
			seat.nodeID, seat.gossip, strings.Join(seat.seeds, ", "), seat.keyFile)
	}
	path := filepath.Join(dir, "ferry.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &ferryServe{log: filepath.Join(dir, "ferry.log"), seat: seat, exited: make(chan struct{})}
	logf, err := os.Create(f.log)
	if err != nil {
		t.Fatal(err)
	}
	f.cmd = exec.Command(bin, "serve", "--config", path)
	if seat != nil && len(seat.env) > 0 {
		f.cmd.Env = append(os.Environ(), seat.env...)
	}
	f.cmd.Stdout, f.cmd.Stderr = logf, logf
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := f.exited
	go func() { f.cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		f.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			f.cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s log (%s), its warnings and errors and its last lines:\n%s", f.name(), f.log, f.logTail(200))
			// The temporary directory's name tells a restarted member's
			// logs apart.
			if keep := keepPath(t, strings.ReplaceAll(f.name(), " ", "-")+"-"+filepath.Base(dir)+".log"); keep != "" {
				if b, err := os.ReadFile(f.log); err == nil {
					os.WriteFile(keep, b, 0o644)
				}
			}
		}
	})
	testwait.Eventually(t, 90*time.Second, "ferry serve serving", func() error {
		b, _ := os.ReadFile(f.log)
		if m := adminListening.FindSubmatch(b); m != nil {
			f.admin = string(m[1])
		}
		if m := servingClients.FindSubmatch(b); m != nil {
			f.addr = string(m[1])
		}
		select {
		case <-exited:
			b, _ = os.ReadFile(f.log) // all of it, now that it is closed
			if bytes.Contains(b, []byte("already in use")) {
				clash = true
				return nil
			}
			t.Fatalf("ferry serve exited (%v):\n%s", f.cmd.ProcessState, b)
		default:
		}
		if f.addr == "" || f.admin == "" {
			return fmt.Errorf("its log:\n%s", b)
		}
		return nil
	})
	if clash {
		return f, true
	}
	if seat != nil {
		seat.listen = f.addr
	}
	return f, false
}

func (f *ferryServe) name() string {
	if f.seat == nil {
		return "ferry"
	}
	return fmt.Sprintf("ferry member %d", f.seat.nodeID)
}

// logTail is Ferry's warnings and errors (the last n), then its last n lines.
func (f *ferryServe) logTail(n int) string {
	b, _ := os.ReadFile(f.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var warn []string
	for _, l := range lines {
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
			warn = append(warn, l)
		}
	}
	return strings.Join(warn[max(0, len(warn)-n):], "\n") + "\n…\n" + strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// switchAnswer is POST /switchover's answer.
type switchAnswer struct {
	Generation uint32 `json:"generation"`
	Active     string `json:"active"`
	Phase      string `json:"phase"`
	LastSwitch *struct {
		Duration string `json:"duration"`
		Outcome  string `json:"outcome"`
		// Lost is a forced switch's lost ranges.
		Lost []routing.LostRange `json:"lost"`
	} `json:"last_switch"`
	Error   string `json:"error"`
	Message string `json:"message"`
}

// askSwitch asks the member for a planned switch to `to` within timeout
// and returns its answer, its status code (0 when it did not answer) and
// its body (or why there was none).
func (f *ferryServe) askSwitch(ctx context.Context, to string, timeout time.Duration) (switchAnswer, int, string) {
	return f.askSwitchMode(ctx, to, "planned", timeout)
}

// askSwitchMode is askSwitch for a switch of mode "planned" or "forced".
func (f *ferryServe) askSwitchMode(ctx context.Context, to, mode string, timeout time.Duration) (switchAnswer, int, string) {
	body := fmt.Sprintf(`{"to":%q,"mode":%q,"timeout":%q}`, to, mode, timeout)
	var a switchAnswer
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.admin+"/switchover", strings.NewReader(body))
	if err != nil {
		a.Error = err.Error()
		return a, 0, a.Error
	}
	resp, err := (&http.Client{Timeout: timeout + 2*time.Minute}).Do(req)
	if err != nil {
		a.Error = err.Error()
		return a, 0, a.Error
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &a); err != nil {
		a.Error = string(b)
	}
	return a, resp.StatusCode, string(b)
}

// switchover asks for a planned switch to `to` and returns how long the
// switch took by Ferry's account.
func (f *ferryServe) switchover(t *testing.T, ctx context.Context, to string, gen uint32) string {
	t.Helper()
	a, code, b := f.askSwitch(ctx, to, time.Minute)
	if code != http.StatusOK {
		t.Fatalf("POST /switchover to %s: %d %s", to, code, b)
	}
	if a.Generation != gen || a.Active != to || a.Phase != "serving" || a.LastSwitch == nil || a.LastSwitch.Outcome != "switched" {
		t.Fatalf("switch to %s answered %s, want generation %d, %s active, serving, switched", to, b, gen, to)
	}
	return a.LastSwitch.Duration
}

// mirrorStatus reads the fleet's mirror status from the member (GET
// /status/mirror).
func (f *ferryServe) mirrorStatus(ctx context.Context) (ferryadmin.MirrorStatus, error) {
	var m ferryadmin.MirrorStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.admin+"/status/mirror", nil)
	if err != nil {
		return m, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("/status/mirror: %v: %s", err, head(string(b), 300))
	}
	return m, nil
}

// routingState reads the member's routing state in full (GET
// /status/routing).
func (f *ferryServe) routingState(ctx context.Context) (routing.State, error) {
	var st routing.State
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.admin+"/status/routing", nil)
	if err != nil {
		return st, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("/status/routing: %v: %s", err, head(string(b), 300))
	}
	return st, nil
}

// restartHalted asks the member to restart every halted mirror partition
// of the fleet (POST /mirror/restart).
func (f *ferryServe) restartHalted(ctx context.Context) error {
	return f.postAdmin(ctx, "/mirror/restart", `{"halted":true}`)
}

// haltTopic asks the member to halt every mirror partition of topic in the
// fleet (POST /mirror/halt).
func (f *ferryServe) haltTopic(ctx context.Context, topic string) error {
	return f.postAdmin(ctx, "/mirror/halt", `{"topic":`+strconv.Quote(topic)+`}`)
}

// postAdmin posts body to the member's admin API at path and wants a 200.
func (f *ferryServe) postAdmin(ctx context.Context, path, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.admin+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, head(string(b), 300))
	}
	return nil
}

// mirrorCaughtUp polls the member's mirror status until every partition
// is caught up or timeout passes, and returns the last status read and
// whether it was caught up (lastErr: why the last poll read nothing).
func (f *ferryServe) mirrorCaughtUp(ctx context.Context, timeout time.Duration) (last ferryadmin.MirrorStatus, caught bool, lastErr error) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		st, err := f.mirrorStatus(ctx)
		if err != nil {
			lastErr = err
			continue
		}
		last, lastErr = st, nil
		if st.Summary.AllCaughtUp {
			return last, true, nil
		}
	}
	return last, false, lastErr
}

// waitMirrorCaughtUp waits until the mirror reports every partition caught
// up.
func (f *ferryServe) waitMirrorCaughtUp(t *testing.T, timeout time.Duration) {
	t.Helper()
	testwait.Eventually(t, timeout, "the mirror caught up", func() error {
		st, err := f.mirrorStatus(context.Background())
		if err != nil {
			return err
		}
		if !st.Summary.AllCaughtUp {
			b, _ := json.MarshalIndent(st, "", "  ")
			return fmt.Errorf("%s", head(string(b), 3000))
		}
		return nil
	})
}

// startPair starts two one-broker clusters, a primary and a standby, while
// cmd/ferry builds (with tags), and returns the binary and both.
func startPair(t *testing.T, primaryName, standbyName string, tags ...string) (bin string, primary, standby *kafkatest.Cluster) {
	t.Helper()
	var buildErr error
	built := make(chan struct{})
	binDir := t.TempDir()
	go func() { defer close(built); bin, buildErr = buildFerry(binDir, tags...) }()
	cs := startClusters(t, primaryName, standbyName)
	<-built
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin, cs[0], cs[1]
}

// createReadyTopic creates topic with rf replicas through adm and waits
// until every partition answers ListOffsets.
func createReadyTopic(ctx context.Context, t *testing.T, adm *kadm.Client, topic string, partitions int32, rf int16) {
	t.Helper()
	resp, err := adm.CreateTopic(ctx, partitions, rf, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	waitTopicReady(ctx, t, adm, topic, int(partitions))
}

// startClusters starts two one-broker clusters at once.
func startClusters(t *testing.T, names ...string) []*kafkatest.Cluster {
	t.Helper()
	cs := make([]*kafkatest.Cluster, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { cs[i], errs[i] = kafkatest.New(kafkatest.Config{Brokers: 1, Name: name}) })
	}
	wg.Wait()
	for i, c := range cs {
		if c == nil {
			continue
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("kafkatest: cluster %s (%s) logs:\n%s", names[i], c.Dir(), c.LogTail(60))
				if keep := keepPath(t, names[i]); keep != "" {
					exec.Command("cp", "-r", c.Dir(), keep).Run()
				}
			}
			c.Close()
		})
	}
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return cs
}

// TestPlannedSwitchoverClients runs Java (classic and consumer group
// protocols), librdkafka (both too), kafkajs (classic), kafka-python
// (classic) and confluent-kafka-go (both) programs through `ferry serve`
// while it switches primary → standby → primary, planned.
// Per client:
//   - the idempotent producer sees no error; every acknowledged record is
//     on the cluster active at the end, once, at its acknowledged offset,
//     and each partition holds its records in the order sent;
//   - each consumer group sees every acknowledged record, and re-reads only
//     records at or above the offsets its group had committed when a
//     switch began (read on the cluster the switch left, where commits were
//     held), and nothing before the first switch;
//   - the transactional producer gets at most an abortable error per
//     switch, aborts and commits transactions again after each switch; a
//     read_committed group through Ferry, and read_committed readers on
//     either cluster directly, see every committed record at its offset
//     and none of an aborted transaction.
func TestPlannedSwitchoverClients(t *testing.T) {
	switchoverClients(t, 1)
}

// TestFleetSwitchoverClients is TestPlannedSwitchoverClients through a
// fleet of three members, each switch asked of another member: a
// transactional ID's coordinator requests, its group's offset commits and
// its partitions' produce requests reach different members, and a producer
// still writing under a producer ID of the generation before the switch
// (kafkajs never asks for a new one) must find the same mapping on each.
func TestFleetSwitchoverClients(t *testing.T) {
	switchoverClients(t, fleetSize)
}

// switchoverClients runs the client programs through a fleet of members
// (one: a lone `ferry serve`) across two planned switches.
func switchoverClients(t *testing.T, members int) {
	if testing.Short() {
		t.Skip("conformance: real Kafka and client programs are not run in -short mode")
	}
	cls := clients(t)
	javaClasses(t)
	begin := time.Now()
	bin, primary, standby := startPair(t, "switch-primary", "switch-standby")
	var ms []*ferryServe
	if members == 1 {
		ms = []*ferryServe{startFerryServe(t, bin, primary, standby)}
	} else {
		ms = startFerryFleet(t, bin, primary, standby, members)
	}
	addrs := fleetAddrs(ms)
	bootstrap := strings.Join(addrs, ",")
	t.Logf("clusters, ferry binary and %d Ferry member(s) up in %v", len(ms), time.Since(begin).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sfx := randomSuffix()
	viaFerry, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer viaFerry.Close()
	adm := kadm.NewClient(viaFerry)

	var window atomic.Int32
	// Every client with the stream mode, each consumer group protocol it has.
	var procs []*streamProc
	var topics []string
	for _, fam := range streamClients(cls) {
		topic, txnTopic := fmt.Sprintf("sw-%s-%s", fam.name, sfx), fmt.Sprintf("sw-%s-txn-%s", fam.name, sfx)
		for _, tp := range []string{topic, txnTopic} {
			createReadyTopic(ctx, t, adm, tp, switchPartitions, 1)
			topics = append(topics, tp)
		}
		p := &streamProc{name: fam.name, window: &window, roles: map[string]*streamRole{}}
		p.addRole(&streamRole{name: "produce", kind: "produce", topic: topic})
		p.addRole(&streamRole{name: "txn", kind: "txn", topic: txnTopic})
		args := []string{"stream", "--bootstrap", bootstrap, "--partitions", strconv.Itoa(switchPartitions),
			"--rate", strconv.Itoa(switchRate), "--produce", topic,
			"--txn", txnTopic + ":sw-txn-" + fam.name + "-" + sfx}
		for _, proto := range fam.groupProtocols {
			r := &streamRole{name: proto, kind: "consume", topic: topic, group: fmt.Sprintf("sw-%s-%s-%s", fam.name, proto, sfx)}
			p.addRole(r)
			args = append(args, "--consume", strings.Join([]string{r.name, r.topic, r.group, proto, "read_uncommitted"}, ":"))
		}
		rc := &streamRole{name: "read-committed", kind: "consume", topic: txnTopic, group: fmt.Sprintf("sw-%s-rc-%s", fam.name, sfx), readCommit: true}
		p.addRole(rc)
		args = append(args, "--consume", strings.Join([]string{rc.name, rc.topic, rc.group, "classic", "read_committed"}, ":"))
		p.cmd = fam.command(ctx, t, args...)
		procs = append(procs, p)
	}
	for _, p := range procs {
		p.start(t)
	}
	defer func() {
		for _, p := range procs {
			p.stdin.Close()
		}
		if t.Failed() {
			for _, p := range procs {
				p.mu.Lock()
				t.Logf("%s stderr:\n%s\nunexpected lines: %q", p.name, tail(p.stderr.String(), 3000), p.bad[:min(5, len(p.bad))])
				if keep := keepPath(t, p.name+".stderr"); keep != "" {
					os.WriteFile(keep, p.stderr.Bytes(), 0o644)
				}
				p.mu.Unlock()
			}
		}
	}()

	// progress waits until every role has made a window's progress since
	// window w began.
	progress := func(w int, what string) {
		t.Helper()
		start := time.Now()
		// A role stuck after a switch fails the test, and the others are
		// still checked to the end.
		waitStreams(t, procs, time.Minute, w == 0, what, func(r *streamRole) string {
			switch r.kind {
			case "produce":
				if n := countFrom(r.acks, w); n < switchAcks {
					return fmt.Sprintf("%d acks", n)
				}
			case "txn":
				n := 0
				for _, e := range r.ends {
					if e.window >= w && e.Outcome == "committed" {
						n++
					}
				}
				if n < switchTxns {
					return fmt.Sprintf("%d transactions committed", n)
				}
			case "consume":
				if n := countFrom(r.recs, w); n < switchRecords {
					return fmt.Sprintf("%d records read", n)
				}
			}
			return ""
		})
		t.Logf("%s: %v", what, time.Since(start).Round(time.Millisecond))
	}
	progress(0, "every role under way")
	closedBefore, acceptedBefore := connectionCounts(t, ms)

	var durations []string
	for i, to := range []string{"standby", "primary"} {
		w := i + 1
		window.Store(int32(w))
		start := time.Now()
		d := ms[i%len(ms)].switchover(t, ctx, to, uint32(w))
		durations = append(durations, d)
		t.Logf("switched to %s: %s by Ferry's account, %v answered", to, d, time.Since(start).Round(time.Millisecond))
		progress(w, "every role under way after the switch to "+to)
	}

	// Clients kept their connections: Ferry closed none of them across
	// the switches (a client may still close and open its own).
	closedAfter, acceptedAfter := connectionCounts(t, ms)
	for reason, n := range closedAfter {
		if reason != "client_closed" && n > closedBefore[reason] {
			t.Errorf("Ferry closed %v client connections (%s) across the switches", n-closedBefore[reason], reason)
		}
	}
	t.Logf("client connections across the switches: %v opened, %v closed by the clients", acceptedAfter-acceptedBefore,
		closedAfter["client_closed"]-closedBefore["client_closed"])

	// Stop the producers, then the consumers once they have read what the
	// producers had acknowledged.
	for _, p := range procs {
		p.stop(t, "produce")
		p.stop(t, "txn")
	}
	waitStreams(t, procs, 90*time.Second, true, "producers done", func(r *streamRole) string {
		if r.kind != "consume" && !r.done {
			return "not done"
		}
		return ""
	})
	waitStreams(t, procs, 90*time.Second, true, "consumers caught up", func(r *streamRole) string {
		if r.kind != "consume" {
			return ""
		}
		missing := len(expected(procsRole(procs, r.client, r.readCommit))) - len(distinct(r.recs))
		if missing > 0 {
			return fmt.Sprintf("%d records still to read", missing)
		}
		return ""
	})
	stopStreams(t, procs)

	// The cluster active at the end holds every acknowledged record; the
	// standby, once the mirror caught up, the same.
	ms[0].waitMirrorCaughtUp(t, 90*time.Second)
	onPrimary := readCommitted(t, ctx, primary, topics)
	onStandby := readCommitted(t, ctx, standby, topics)

	for _, p := range procs {
		prod, txn := p.roles["produce"], p.roles["txn"]
		if bad := checkStreamProduced(t, prod, onPrimary[prod.topic]); len(bad) > 0 {
			logProducers(t, ctx, primary, prod.topic, bad)
			logProducers(t, ctx, standby, prod.topic, bad)
		}
		checkTxn(t, txn, "primary", onPrimary[txn.topic])
		checkTxn(t, txn, "standby", onStandby[txn.topic])
		for _, name := range p.order {
			if r := p.roles[name]; r.kind == "consume" {
				checkStreamConsumed(t, r, expected(procsRole(procs, p.name, r.readCommit)), txn)
			}
		}
	}
	reportStreams(t, procs, durations)
}

// procsRole is the producing role of client whose records a consumer reads.
// stopStreams ends the client programs' input and requires each to exit
// cleanly, having printed nothing but events.
func stopStreams(t *testing.T, procs []*streamProc) {
	t.Helper()
	for _, p := range procs {
		p.stdin.Close()
	}
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-time.After(60 * time.Second):
			t.Fatalf("%s did not exit within 60 s of the end of its input", p.name)
		}
		if p.err != nil {
			t.Errorf("%s exited: %v", p.name, p.err)
		}
		if len(p.bad) > 0 {
			t.Errorf("%s printed %d lines that are not events, e.g. %q", p.name, len(p.bad), p.bad[0])
		}
	}
}

func procsRole(procs []*streamProc, client string, txn bool) *streamRole {
	for _, p := range procs {
		if p.name == client {
			if txn {
				return p.roles["txn"]
			}
			return p.roles["produce"]
		}
	}
	return nil
}

// waitStreams waits until pending is "" for every role, failing early when
// a program exits or a role fails fatally. Not fatal, a role that does not
// get there within timeout fails the test, which goes on.
func waitStreams(t *testing.T, procs []*streamProc, timeout time.Duration, fatal bool, what string, pending func(*streamRole) string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for _, p := range procs {
			select {
			case <-p.exited:
				t.Fatalf("%s: %s exited (%v) early", what, p.name, p.err)
			default:
			}
			p.mu.Lock()
			for _, name := range p.order {
				r := p.roles[name]
				for _, e := range r.errs {
					if e.Fatal {
						p.mu.Unlock()
						t.Fatalf("%s: %s failed: %s %s", what, r.label(), e.Code, e.Error)
					}
				}
				if s := pending(r); s != "" {
					left = append(left, r.label()+": "+s)
				}
			}
			p.mu.Unlock()
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			report := t.Fatalf
			if !fatal {
				report = t.Errorf
			}
			var errs []string
			for _, p := range procs {
				p.mu.Lock()
				for _, name := range p.order {
					seen := map[string]int{}
					for _, e := range p.roles[name].errs {
						if seen[e.Code]++; seen[e.Code] == 1 {
							errs = append(errs, fmt.Sprintf("%s/%s (window %d): %s %s", p.name, name, e.window, e.Code, head(e.Error, 300)))
						}
					}
				}
				p.mu.Unlock()
			}
			report("%s: not within %v: %s\nerrors so far: %s", what, timeout, strings.Join(left, "; "), strings.Join(errs[:min(20, len(errs))], "\n"))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func countFrom(es []streamEvent, w int) int {
	n := 0
	for _, e := range es {
		if e.window >= w {
			n++
		}
	}
	return n
}

type partOff struct {
	p int32
	o int64
}

func distinct(es []streamEvent) map[partOff]string {
	m := map[partOff]string{}
	for _, e := range es {
		m[partOff{e.Partition, e.Offset}] = e.Value
	}
	return m
}

// expected is what a consumer of r's topic must read: every acknowledged
// record (of a committed transaction, for the transactional producer).
// Called with r's process locked or stopped.
func expected(r *streamRole) map[partOff]string {
	m := map[partOff]string{}
	for _, a := range r.acks {
		if r.kind == "txn" && r.ends[a.Txn].Outcome != "committed" {
			continue
		}
		m[partOff{a.Partition, a.Offset}] = a.Value
	}
	return m
}

// txnOf returns the transaction number a transactional record's value
// carries (p<P>-<seq>-t<N>-<run>).
func txnOf(v string) int {
	f := strings.Split(v, "-")
	if len(f) != 4 || !strings.HasPrefix(f[2], "t") {
		return -1
	}
	n, err := strconv.Atoi(f[2][1:])
	if err != nil {
		return -1
	}
	return n
}

// seqOf returns the per-partition sequence number a record's value carries.
func seqOf(v string) int {
	f := strings.Split(v, "-")
	if len(f) < 3 {
		return -1
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return n
}

// readCommitted reads topics directly from a cluster, read_committed, to
// their end offsets, and returns each partition's records by offset, the
// mirror's fillers left out.
func readCommitted(t *testing.T, ctx context.Context, c *kafkatest.Cluster, topics []string) map[string]map[partOff]string {
	t.Helper()
	return readTopics(t, ctx, c, topics, kgo.ReadCommitted())
}

// readTopics is readCommitted at the isolation level given: read
// uncommitted, it holds records of transactions aborted or still open.
func readTopics(t *testing.T, ctx context.Context, c *kafkatest.Cluster, topics []string, isolation kgo.IsolationLevel) map[string]map[partOff]string {
	t.Helper()
	// A broker just continued or restarted may still be electing its
	// partitions' leaders: retried for up to 30 s.
	var ends kadm.ListedOffsets
	var err error
	testwait.Eventually(t, 30*time.Second, fmt.Sprintf("the end offsets of %v without a retriable error", topics), func() error {
		ends, err = admin(t, c).ListEndOffsets(ctx, topics...)
		if err == nil {
			err = ends.Error()
		}
		if err != nil && kerr.IsRetriable(err) {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			if left[o.Topic] == nil {
				left[o.Topic] = map[int32]int64{}
			}
			left[o.Topic][o.Partition] = o.Offset
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(isolation),
		kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	out := map[string]map[partOff]string{}
	for _, tp := range topics {
		out[tp] = map[partOff]string{}
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for len(left) > 0 {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			t.Fatalf("reading %s (%v): partitions short of their end offsets: %v", c.Bootstrap(), isolation, left)
		}
		fs.EachRecord(func(r *kgo.Record) {
			// Fillers are the mirror's (one stands where the source has a
			// transaction marker with no data of its transaction on the
			// partition); Ferry hides them from its clients.
			if !r.Attrs.IsControl() && !bytes.Equal(r.Key, protocol.FillerKey) {
				out[r.Topic][partOff{r.Partition, r.Offset}] = string(r.Value)
			}
			if end, ok := left[r.Topic][r.Partition]; ok && r.Offset+1 >= end {
				delete(left[r.Topic], r.Partition)
				if len(left[r.Topic]) == 0 {
					delete(left, r.Topic)
				}
			}
		})
	}
	return out
}

// checkStreamProduced: no error; every acknowledged record on the cluster at its
// offset, nothing else there, each partition in the order sent.
func checkStreamProduced(t *testing.T, r *streamRole, on map[partOff]string) (badAt []partOff) {
	t.Helper()
	for _, e := range r.errs {
		t.Errorf("%s: error (window %d): %s %s", r.label(), e.window, e.Code, head(e.Error, 500))
	}
	acked := distinct(r.acks)
	if len(acked) != len(r.acks) {
		t.Errorf("%s: %d acknowledgments for %d offsets", r.label(), len(r.acks), len(acked))
	}
	var where map[string][]partOff // where each value is, once an ack is not at its offset
	bad := 0
	for at, v := range acked {
		if got, ok := on[at]; !ok || got != v {
			if where == nil {
				where = make(map[string][]partOff, len(on))
				for at, v := range on {
					where[v] = append(where[v], at)
				}
			}
			if bad++; bad <= 3 {
				held := "nowhere: lost"
				if ats := where[v]; len(ats) > 0 {
					held = fmt.Sprintf("at %v", ats)
				}
				t.Errorf("%s: acknowledged %s at %d/%d; the cluster holds %q there, and the record %s", r.label(), v, at.p, at.o, got, held)
			}
			badAt = append(badAt, at)
		}
	}
	if len(on) != len(acked) {
		t.Errorf("%s: %d records on the cluster, %d acknowledged", r.label(), len(on), len(acked))
	}
	checkOrder(t, r.label(), on)
	return badAt
}

// checkOrder: in each partition, the sequence numbers grow with the offsets.
func checkOrder(t *testing.T, label string, on map[partOff]string) {
	t.Helper()
	ats := make([]partOff, 0, len(on))
	for at := range on {
		ats = append(ats, at)
	}
	sort.Slice(ats, func(i, j int) bool { return ats[i].p < ats[j].p || ats[i].p == ats[j].p && ats[i].o < ats[j].o })
	last := map[int32]int{}
	for _, at := range ats {
		s := seqOf(on[at])
		if s <= last[at.p] {
			t.Errorf("%s: partition %d offset %d holds %q after sequence %d: order broken", label, at.p, at.o, on[at], last[at.p])
			return
		}
		last[at.p] = s
	}
}

// checkTxn: errors only abortable, each transaction ended; on the cluster
// (read_committed) every committed record at its offset and nothing of an
// aborted transaction.
func checkTxn(t *testing.T, r *streamRole, cluster string, on map[partOff]string) {
	t.Helper()
	label := r.label() + " on " + cluster
	if cluster == "primary" { // the role's own checks, once
		failed := map[int]int{} // window → transactions aborted after an error
		for _, e := range r.ends {
			if e.AfterError {
				failed[e.window]++
			}
		}
		for _, e := range r.errs {
			if e.Fatal {
				t.Errorf("%s: fatal error: %s %s", r.label(), e.Code, head(e.Error, 500))
			}
		}
		for w, n := range failed {
			if w == 0 || n > 1 {
				t.Errorf("%s: %d transactions failed in window %d (before the first switch is 0); want at most one per switch", r.label(), n, w)
			}
		}
		for w := 1; w <= 2; w++ {
			committed := 0
			for _, e := range r.ends {
				if e.window == w && e.Outcome == "committed" {
					committed++
				}
			}
			if committed == 0 {
				t.Errorf("%s: no transaction committed after switch %d", r.label(), w)
			}
		}
	}
	want := expected(r)
	bad := 0
	for at, v := range want {
		if got, ok := on[at]; !ok || got != v {
			if bad++; bad <= 3 {
				t.Errorf("%s: committed %s at %d/%d; a read_committed reader finds %q there", label, v, at.p, at.o, got)
			}
		}
	}
	aborted := 0
	for at, v := range on {
		if r.ends[txnOf(v)].Outcome != "committed" {
			if aborted++; aborted <= 3 {
				t.Errorf("%s: a read_committed reader sees %q at %d/%d, of transaction %d (%s)", label, v, at.p, at.o, txnOf(v), r.ends[txnOf(v)].Outcome)
			}
		}
	}
	checkOrder(t, label, on)
}

// checkStreamConsumed: every expected record read, with its value; nothing of an
// aborted transaction read; nothing read again before the first switch, and
// never an offset below one the group had acknowledged committing before
// (the client's `committed` events, in the order it printed them): a group
// resumes where it committed.
func checkStreamConsumed(t *testing.T, r *streamRole, want map[partOff]string, txn *streamRole) {
	t.Helper()
	if len(r.recs) > 0 && len(r.commits) == 0 {
		t.Errorf("%s read %d records and reported no commit: what it committed is unknown", r.label(), len(r.recs))
	}
	seen := map[partOff]string{}
	committed := map[int32]int64{}
	ci := 0
	below := 0
	for _, e := range r.recs {
		for ; ci < len(r.commits) && r.commits[ci].seq < e.seq; ci++ {
			for p, o := range r.commits[ci].Offsets {
				committed[p] = max(committed[p], o)
			}
		}
		at := partOff{e.Partition, e.Offset}
		if r.readCommit && txn.ends[txnOf(e.Value)].Outcome != "committed" {
			t.Errorf("%s: read %q at %d/%d, of transaction %d (%s)", r.label(), e.Value, at.p, at.o, txnOf(e.Value), txn.ends[txnOf(e.Value)].Outcome)
		}
		if prev, ok := seen[at]; ok {
			if prev != e.Value {
				t.Errorf("%s: read %q at %d/%d, %q before", r.label(), e.Value, at.p, at.o, prev)
			}
			if e.window == 0 || at.o < committed[at.p] {
				if below++; below <= 3 {
					t.Errorf("%s: re-read %d/%d in window %d; the group had acknowledged committing %d there",
						r.label(), at.p, at.o, e.window, committed[at.p])
				}
			}
		}
		seen[at] = e.Value
	}
	missing := 0
	for at, v := range want {
		if got, ok := seen[at]; !ok || got != v {
			if missing++; missing <= 3 {
				t.Errorf("%s: did not read %q at %d/%d (read %q)", r.label(), v, at.p, at.o, got)
			}
		}
	}
}

// reportStreams logs per client what each role did.
func reportStreams(t *testing.T, procs []*streamProc, durations []string) {
	if durations != nil {
		t.Logf("switch durations (Ferry's account): %s", strings.Join(durations, ", "))
	}
	for _, p := range procs {
		for _, name := range p.order {
			r := p.roles[name]
			codes := map[string]int{}
			for _, e := range r.errs {
				codes[fmt.Sprintf("%s@w%d", e.Code, e.window)]++
			}
			var cs []string
			for c, n := range codes {
				cs = append(cs, fmt.Sprintf("%s×%d", c, n))
			}
			slices.Sort(cs)
			switch r.kind {
			case "produce":
				t.Logf("%-26s acked %5d; errors: %v", r.label(), len(r.acks), cs)
			case "txn":
				committed, aborted, failed := 0, 0, 0
				for _, e := range r.ends {
					switch {
					case e.AfterError:
						failed++
					case e.Outcome == "committed":
						committed++
					default:
						aborted++
					}
				}
				t.Logf("%-26s %d transactions committed, %d aborted on purpose, %d aborted after an error, %d retried calls; records acked %d; errors: %v",
					r.label(), committed, aborted, failed, r.retrys, len(r.acks), cs)
			case "consume":
				rereads := len(r.recs) - len(distinct(r.recs))
				t.Logf("%-26s read %5d records, %d re-read, %d commits; errors: %v", r.label(), len(r.recs), rereads, len(r.commits), cs)
			}
		}
	}
}

// connectionCounts sums, over the members, Ferry's client connections
// closed by reason (ferry_client_connections_closed_total) and accepted
// (ferry_client_connections_total), read from /metrics.
func connectionCounts(t *testing.T, ms []*ferryServe) (closed map[string]float64, accepted float64) {
	t.Helper()
	closed = map[string]float64{}
	for _, m := range ms {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + m.admin + "/metrics")
		if err != nil {
			t.Fatalf("%s /metrics: %v", m.name(), err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s /metrics: %v", m.name(), err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			name, val, ok := strings.Cut(line, " ")
			if !ok || strings.HasPrefix(name, "#") {
				continue
			}
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				continue
			}
			switch {
			case strings.HasPrefix(name, `ferry_client_connections_closed_total{reason="`):
				closed[strings.TrimSuffix(strings.TrimPrefix(name, `ferry_client_connections_closed_total{reason="`), `"}`)] += v
			case name == "ferry_client_connections_total":
				accepted += v
			}
		}
	}
	return closed, accepted
}

// logProducers, for a failed check, logs who wrote the records of c around
// the offsets at: each record's producer ID and epoch, read directly, and
// the producers the partition's leader holds state for.
func logProducers(t *testing.T, ctx context.Context, c *kafkatest.Cluster, topic string, at []partOff) {
	t.Helper()
	near := map[int32]map[int64]bool{}
	for _, a := range at[:min(len(at), 5)] {
		if near[a.p] == nil {
			near[a.p] = map[int64]bool{}
		}
		for o := max(0, a.o-3); o <= a.o+3; o++ {
			near[a.p][o] = true
		}
		for o := int64(0); o < 4; o++ {
			near[a.p][o] = true
		}
	}
	parts := map[int32]kgo.Offset{}
	last := map[int32]int64{} // the highest offset of interest, per partition
	for p, offs := range near {
		parts[p] = kgo.NewOffset().AtStart()
		for o := range offs {
			last[p] = max(last[p], o)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Log(err)
		return
	}
	defer cl.Close()
	var lines []string
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for len(last) > 0 && rctx.Err() == nil {
		fs := cl.PollFetches(rctx)
		fs.EachRecord(func(r *kgo.Record) {
			if near[r.Partition][r.Offset] {
				lines = append(lines, fmt.Sprintf("%d/%d %q producer %d epoch %d", r.Partition, r.Offset, r.Value, r.ProducerID, r.ProducerEpoch))
			}
			if r.Offset >= last[r.Partition] {
				delete(last, r.Partition)
			}
		})
	}
	sort.Strings(lines)
	t.Logf("%s on %s, records near the failed acknowledgments:\n%s", topic, c.Bootstrap(), strings.Join(lines, "\n"))
	ps := map[int32]struct{}{}
	for p := range near {
		ps[p] = struct{}{}
	}
	var set kadm.TopicsSet = map[string]map[int32]struct{}{topic: ps}
	dp, err := admin(t, c).DescribeProducers(ctx, set)
	if err != nil {
		t.Logf("describing producers on %s: %v", c.Bootstrap(), err)
		return
	}
	dp.EachProducer(func(p kadm.DescribedProducer) {
		t.Logf("%s: %s/%d producer %d epoch %d last sequence %d last timestamp %d", c.Bootstrap(), p.Topic, p.Partition, p.ProducerID, p.ProducerEpoch, p.LastSequence, p.LastTimestamp)
	})
}
