package main

// Ferry as a separate process, so that its CPU time is its own: by default
// `ferry serve` built from ./cmd/ferry; with -cpuprofile, this binary
// re-executed with childEnv set, which runs proxy.New/Start/Serve on a
// loopback port, prints "ready <addr>" on stdout and serves until SIGINT or
// SIGTERM. Either way the parent reads the process's CPU time from
// /proc/<pid>/stat (what its process_cpu_seconds_total reports too).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
)

const (
	// childEnv holds the upstream bootstrap servers; its presence makes
	// this binary run Ferry instead of the benchmark.
	childEnv = "FERRY_BENCH_CHILD"
	// profileEnv is where the child writes its CPU profile, if set.
	profileEnv = "FERRY_BENCH_CPUPROFILE"
	// generationEnv, if set, is the routing generation the child serves
	// under; it then treats the cluster as a mirror target (checks every
	// answer for fillers), as cmd/ferry does when two clusters are
	// configured.
	generationEnv = "FERRY_BENCH_GENERATION"
	// clockTicks is USER_HZ, the unit of utime and stime in /proc: 100 on
	// every Linux architecture Go supports.
	clockTicks = 100
)

// runChild is the Ferry process.
func runChild(bootstrap, profile string) error {
	fleet := proxy.NewStaticFleet(proxy.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1})
	cl := proxy.Cluster{Name: "primary", Bootstrap: strings.Split(bootstrap, ",")}
	state := routing.State{Active: cl.Name}
	if g, ok := os.LookupEnv(generationEnv); ok {
		gen, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return fmt.Errorf("%s: %w", generationEnv, err)
		}
		state.Generation, cl.MirrorTarget = uint32(gen), true
	}
	lcfg := zap.NewProductionConfig()
	lcfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	lcfg.Encoding = "console"
	log, err := lcfg.Build()
	if err != nil {
		return err
	}
	s, err := proxy.New(
		proxy.WithClusterID("ferry-bench"),
		proxy.WithClusters(cl),
		proxy.WithRoutingTable(routing.NewTable(state)),
		proxy.WithFleet(fleet),
		proxy.WithLogger(log),
		proxy.WithRegisterer(prometheus.NewRegistry()),
	)
	if err != nil {
		return err
	}
	defer s.Close()
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	err = s.Start(ctx)
	cancel()
	if err != nil {
		return err
	}
	// One listener per lane, as ferry serve does.
	var lns []net.Listener
	var ports []int32
	for l := 0; l < s.Lanes(); l++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lns = append(lns, ln)
		ports = append(ports, int32(ln.Addr().(*net.TCPAddr).Port))
	}
	fleet.Set([]proxy.Broker{{NodeID: 0, Host: "127.0.0.1", Port: ports[0], LanePorts: ports}})
	served := make(chan error, len(lns))
	for i, ln := range lns {
		go func() { served <- s.ServeLane(ln, i) }()
	}
	ln := lns[0]
	fmt.Printf("ready %s\n", ln.Addr())

	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sigc:
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// childProc is a process the benchmark runs and charges CPU to: Ferry, or
// the relay.
type childProc struct {
	cmd  *exec.Cmd
	addr string        // Kafka bootstrap address
	done chan struct{} // closed when the process has exited and been reaped
}

// buildFerry builds cmd/ferry into dir.
func buildFerry(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "ferry")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ferry-gw/ferry/cmd/ferry")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/ferry: %w\n%s", err, out)
	}
	return bin, nil
}

// startServe runs bin as `ferry serve` in front of bootstrap, with a
// configuration file in dir, pinned to cpus (a taskset list) unless it is
// "", and waits until its /readyz answers 200.
func startServe(ctx context.Context, bin, dir, bootstrap, cpus string) (*childProc, error) {
	ports, err := benchutil.FreePorts(2)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	adminAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	var b strings.Builder
	fmt.Fprintf(&b, "cluster_id: ferry-bench\nlisten: %s\nadmin_listen: %s\nlog_level: warn\nclusters:\n  - name: primary\n    bootstrap:\n", addr, adminAddr)
	for _, a := range strings.Split(bootstrap, ",") {
		fmt.Fprintf(&b, "      - %q\n", a)
	}
	file := filepath.Join(dir, "ferry.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	args := []string{bin, "serve", "--config", file}
	if cpus != "" {
		// taskset execs Ferry: the pid (and its CPU time) is Ferry's.
		args = append([]string{"taskset", "-c", cpus}, args...)
	}
	f, err := launch(exec.Command(args[0], args[1:]...), addr)
	if err != nil {
		return nil, err
	}
	ready := func() bool {
		resp, err := http.Get("http://" + adminAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	return f, f.waitReady(ctx, ready)
}

// startChild runs this binary re-executed with env added, pinned to cpus
// (a taskset list) unless it is "", and waits until it prints
// "ready <bootstrap>": Ferry with a CPU profile (runChild), or the relay
// (runRelay).
func startChild(ctx context.Context, cpus string, env ...string) (*childProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{exe}
	if cpus != "" {
		args = append([]string{"taskset", "-c", cpus}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	f, err := launch(cmd, "")
	if err != nil {
		return nil, err
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				addrc <- addr
			}
		}
	}()
	ready := func() bool {
		select {
		case f.addr = <-addrc:
			return true
		default:
			return false
		}
	}
	return f, f.waitReady(ctx, ready)
}

// launch starts cmd with its stderr on ours; the kernel kills it if the
// benchmark dies.
func launch(cmd *exec.Cmd, addr string) (*childProc, error) {
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	f := &childProc{cmd: cmd, addr: addr, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(f.done)
	}()
	return f, nil
}

// waitReady polls ready until it reports true; on failure it stops the
// process.
func (f *childProc) waitReady(ctx context.Context, ready func() bool) error {
	deadline := time.After(3 * time.Minute)
	for !ready() {
		select {
		case <-f.done:
			return fmt.Errorf("%s exited before serving: %v", f.cmd.Path, f.cmd.ProcessState)
		case <-ctx.Done():
			f.stop()
			return ctx.Err()
		case <-deadline:
			f.stop()
			return fmt.Errorf("%s did not start serving within 3 minutes", f.cmd.Path)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// cpu returns the child's CPU time so far, user plus system, all threads.
func (f *childProc) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", f.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after its ')'
	// start with field 3 (state), so utime (14) and stime (15) are at 11
	// and 12.
	i := strings.LastIndexByte(string(b), ')')
	fs := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fs) < 13 {
		return 0, fmt.Errorf("unexpected /proc stat %q", b)
	}
	ut, err1 := strconv.ParseInt(fs[11], 10, 64)
	st, err2 := strconv.ParseInt(fs[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// stop sends SIGTERM, then SIGKILL after 15 seconds; it returns once the
// process is reaped. Safe to call twice.
func (f *childProc) stop() {
	f.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-f.done:
		return
	case <-time.After(15 * time.Second):
	}
	f.cmd.Process.Kill()
	<-f.done
}
