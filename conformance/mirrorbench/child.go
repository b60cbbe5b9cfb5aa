package main

// Ferry's mirror as a separate process, so that its CPU time is its own:
// this binary re-executed with childEnv set runs mirror.New/Run over one
// topic until SIGINT or SIGTERM (independent of cmd/ferry). The parent
// watches the target's end offsets and reads the child's CPU time from
// /proc/<pid>/stat.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/mirror"
)

const (
	// childEnv holds the source bootstrap servers; its presence makes this
	// binary run the mirror instead of the benchmark.
	childEnv = "FERRY_MIRRORBENCH_CHILD"
	// targetEnv and topicEnv are the child's target bootstrap servers and
	// the one topic it mirrors.
	targetEnv = "FERRY_MIRRORBENCH_TARGET"
	topicEnv  = "FERRY_MIRRORBENCH_TOPIC"
	// profileEnv is where the child writes its CPU profile, if set.
	profileEnv = "FERRY_MIRRORBENCH_CPUPROFILE"
	// logLevelEnv sets the child's log level (default warn).
	logLevelEnv = "FERRY_MIRRORBENCH_LOG_LEVEL"
	// inflightEnv, when set, is the child's mirror.InFlight (-inflight).
	inflightEnv = "FERRY_MIRRORBENCH_INFLIGHT"
)

// runChild is the mirror process: the mirror's defaults, except that group
// offsets and ACLs are not synchronised (the benchmark has neither).
func runChild() error {
	log, err := benchutil.ChildLogger(os.Getenv(logLevelEnv))
	if err != nil {
		return err
	}
	if profile := os.Getenv(profileEnv); profile != "" {
		stop, err := benchutil.StartCPUProfile(profile)
		if err != nil {
			return err
		}
		defer stop()
	}
	opts := []mirror.Option{
		mirror.Source(os.Getenv(childEnv)),
		mirror.Target(os.Getenv(targetEnv)),
		mirror.Topics([]string{regexp.QuoteMeta(os.Getenv(topicEnv))}, nil),
		mirror.SyncGroups(false),
		mirror.SyncACLs(false),
		mirror.Logger(log),
		mirror.Registerer(prometheus.NewRegistry()),
	}
	if v := os.Getenv(inflightEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%s=%q: %w", inflightEnv, v, err)
		}
		opts = append(opts, mirror.InFlight(n))
	}
	m, err := mirror.New(opts...)
	if err != nil {
		return err
	}
	defer m.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	halted := make(chan error, 1)
	// A halted partition never catches up: end the run at once, so the
	// benchmark fails with the reason instead of waiting for its timeout.
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, st := range m.Status() {
				if st.State == mirror.StateHalted {
					halted <- fmt.Errorf("%s[%d] halted: %w", st.Topic, st.Partition, st.Err)
					cancel()
					return
				}
			}
		}
	}()
	err = m.Run(ctx)
	select {
	case err := <-halted:
		return err
	default:
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, mirror.ErrClosed) {
		return err
	}
	return nil
}

// proc is a started mirror process (the Ferry child or the MM2 JVM), seen
// from the benchmark.
type proc struct {
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed when the process has exited and been reaped
	err     error         // Wait's result, valid after done
}

// childInFlight is -inflight: the children's mirror.InFlight (0: the
// mirror's default).
var childInFlight int

// startFerry starts the mirror child from source to target over topic.
func startFerry(source, target, topic, profile string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+source, targetEnv+"="+target, topicEnv+"="+topic, profileEnv+"="+profile)
	if childInFlight > 0 {
		cmd.Env = append(cmd.Env, inflightEnv+"="+strconv.Itoa(childInFlight))
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return startProc(cmd)
}

// startProc starts cmd and reaps it when it exits.
func startProc(cmd *exec.Cmd) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, started: time.Now(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// cpu returns the process's CPU time so far, user plus system, all threads.
func (p *proc) cpu() (time.Duration, error) {
	return benchutil.PidCPU(p.cmd.Process.Pid)
}

// stop sends sig to the process (its group, if it has one), then SIGKILL
// after grace; it returns once the process is reaped. Safe to call twice.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	pid := p.cmd.Process.Pid
	target := pid
	if p.cmd.SysProcAttr != nil && p.cmd.SysProcAttr.Setpgid {
		target = -pid
	}
	if !p.exited() {
		_ = syscall.Kill(target, sig)
	}
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(target, syscall.SIGKILL)
	<-p.done
}
