package main

// Ferry as a separate process, so that its CPU time is its own: by default
// `ferry serve` built from ./cmd/ferry; with -cpuprofile, this binary
// re-executed with childEnv set, which runs proxy.New/Start/Serve on a
// loopback port, prints "ready <addr>" on stdout and serves until SIGINT or
// SIGTERM. Either way the parent reads the process's CPU time from
// /proc/<pid>/stat (benchutil.Proc).

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
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
)

// runChild is the Ferry process.
func runChild(bootstrap, profile string) error {
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1})
	cl := upstream.Config{Name: "primary", Bootstrap: strings.Split(bootstrap, ",")}
	state := routing.State{Active: cl.Name}
	if g, ok := os.LookupEnv(generationEnv); ok {
		gen, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return fmt.Errorf("%s: %w", generationEnv, err)
		}
		state.Generation, cl.MirrorTarget = uint32(gen), true
	}
	log, err := benchutil.ChildLogger("")
	if err != nil {
		return err
	}
	s, err := proxy.New(
		proxy.WithClusterID("ferry-bench"),
		proxy.WithClusters(cl),
		proxy.WithRoutingTable(routing.NewTable(state)),
		proxy.WithBrokerSet(fleet),
		proxy.WithLogger(log),
		proxy.WithRegisterer(prometheus.NewRegistry()),
	)
	if err != nil {
		return err
	}
	defer s.Close()
	if profile != "" {
		stop, err := benchutil.StartCPUProfile(profile)
		if err != nil {
			return err
		}
		defer stop()
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
	fleet.Set([]routing.Broker{{NodeID: 0, Host: "127.0.0.1", Port: ports[0], LanePorts: ports}})
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

// startServe runs bin as `ferry serve` in front of bootstrap, with a
// configuration file in dir, pinned to cpus (a taskset list) unless it is
// "", and waits until its /readyz answers 200.
func startServe(ctx context.Context, bin, dir, bootstrap, cpus string) (*benchutil.Proc, error) {
	// The lanes listen on the ports after listen's, one per broker: the
	// run must be free, and the admin port outside it.
	lanes := len(strings.Split(bootstrap, ","))
	base, err := benchutil.FreePortRun(1 + lanes)
	if err != nil {
		return nil, err
	}
	admin := base
	for admin >= base && admin <= base+lanes {
		ports, err := benchutil.FreePorts(1)
		if err != nil {
			return nil, err
		}
		admin = ports[0]
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(base))
	adminAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(admin))
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
	f, err := benchutil.Launch(exec.Command(args[0], args[1:]...), addr)
	if err != nil {
		return nil, err
	}
	return f, f.WaitReady(ctx, benchutil.HTTPReady("http://"+adminAddr+"/readyz"))
}

// startChild runs this binary re-executed with env added, pinned to cpus
// (a taskset list) unless it is "", and waits until it prints
// "ready <bootstrap>": Ferry with a CPU profile (runChild), or the relay
// (runRelay).
func startChild(ctx context.Context, cpus string, env ...string) (*benchutil.Proc, error) {
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
	f, err := benchutil.Launch(cmd, "")
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
		case f.Addr = <-addrc:
			return true
		default:
			return false
		}
	}
	return f, f.WaitReady(ctx, ready)
}
