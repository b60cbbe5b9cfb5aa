package main

// Ferry as a separate process: this binary re-executed with childEnv set
// runs proxy.New/Start/Serve on a loopback port, prints "ready <addr>" on
// stdout and serves until its stdin closes or it gets SIGINT/SIGTERM. The
// parent reads the child's CPU time from /proc/<pid>/stat.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/proxy"
)

const (
	// childEnv holds the upstream bootstrap servers; its presence makes
	// this binary run Ferry instead of the benchmark.
	childEnv = "FERRY_BENCH_CHILD"
	// profileEnv is where the child writes its CPU profile, if set.
	profileEnv = "FERRY_BENCH_CPUPROFILE"
	// clockTicks is USER_HZ, the unit of utime and stime in /proc: 100 on
	// every Linux architecture Go supports.
	clockTicks = 100
)

// runChild is the Ferry process.
func runChild(bootstrap, profile string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	host, portS, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portS)
	lcfg := zap.NewProductionConfig()
	lcfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	lcfg.Encoding = "console"
	log, err := lcfg.Build()
	if err != nil {
		return err
	}
	s, err := proxy.New(
		proxy.WithClusterID("ferry-bench"),
		proxy.WithClusters(proxy.Cluster{Name: "primary", Bootstrap: strings.Split(bootstrap, ",")}),
		proxy.WithFleet(proxy.NewStaticFleet(proxy.Broker{NodeID: 0, Host: host, Port: int32(port)})),
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
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	fmt.Printf("ready %s\n", ln.Addr())

	stdinClosed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-stdinClosed:
	case <-sigc:
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// ferryProc is the running child, seen from the benchmark.
type ferryProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
	done  chan struct{} // closed when the child has exited and been reaped
}

// startFerry starts the child in front of bootstrap and waits until it
// serves.
func startFerry(ctx context.Context, bootstrap, profile string) (*ferryProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+bootstrap, profileEnv+"="+profile)
	cmd.Stderr = os.Stderr
	// The kernel kills the child if the benchmark dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	f := &ferryProc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				ready <- addr
			}
		}
	}()
	go func() {
		cmd.Wait()
		close(f.done)
	}()
	select {
	case f.addr = <-ready:
		return f, nil
	case <-f.done:
		return nil, fmt.Errorf("ferry exited before serving: %v", cmd.ProcessState)
	case <-ctx.Done():
		f.stop()
		return nil, ctx.Err()
	case <-time.After(3 * time.Minute):
		f.stop()
		return nil, errors.New("ferry did not start serving within 3 minutes")
	}
}

// cpu returns the child's CPU time so far, user plus system, all threads.
func (f *ferryProc) cpu() (time.Duration, error) {
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

// stop asks the child to exit (closing its stdin), then kills it after 15
// seconds; it returns once the child is reaped. Safe to call twice.
func (f *ferryProc) stop() {
	f.stdin.Close()
	select {
	case <-f.done:
		return
	case <-time.After(15 * time.Second):
	}
	f.cmd.Process.Kill()
	<-f.done
}
