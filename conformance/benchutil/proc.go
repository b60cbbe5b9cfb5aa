package benchutil

// Child processes a benchmark runs and charges CPU time to (Ferry, a
// relay): the parent reads the process's CPU time from /proc/<pid>/stat
// (what its process_cpu_seconds_total reports too).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// Proc is a child process a benchmark runs and charges CPU to.
type Proc struct {
	Cmd  *exec.Cmd
	Addr string        // Kafka bootstrap address
	done chan struct{} // closed when the process has exited and been reaped
}

// BuildFerry builds cmd/ferry into dir and returns the binary's path.
func BuildFerry(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "ferry")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ferry-gw/ferry/cmd/ferry")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/ferry: %w\n%s", err, out)
	}
	return bin, nil
}

// Launch starts cmd with its stderr on ours; the kernel kills it if the
// benchmark dies. addr is its Kafka bootstrap address, if known already.
func Launch(cmd *exec.Cmd, addr string) (*Proc, error) {
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	f := &Proc{Cmd: cmd, Addr: addr, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(f.done)
	}()
	return f, nil
}

// HTTPReady is a readiness check for WaitReady: url answers 200.
func HTTPReady(url string) func() bool {
	return func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
}

// WaitReady polls ready until it reports true; on failure it stops the
// process.
func (f *Proc) WaitReady(ctx context.Context, ready func() bool) error {
	deadline := time.After(3 * time.Minute)
	for !ready() {
		select {
		case <-f.done:
			return fmt.Errorf("%s exited before serving: %v", f.Cmd.Path, f.Cmd.ProcessState)
		case <-ctx.Done():
			f.Stop()
			return ctx.Err()
		case <-deadline:
			f.Stop()
			return fmt.Errorf("%s did not start serving within 3 minutes", f.Cmd.Path)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// CPU returns the child's CPU time so far, user plus system, all threads.
func (f *Proc) CPU() (time.Duration, error) { return PidCPU(f.Cmd.Process.Pid) }

// PidCPU returns the CPU time so far of process pid, user plus system, all
// threads.
func PidCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
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

// Stop sends SIGTERM, then SIGKILL after 15 seconds; it returns once the
// process is reaped. Safe to call twice.
func (f *Proc) Stop() {
	f.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-f.done:
		return
	case <-time.After(15 * time.Second):
	}
	f.Cmd.Process.Kill()
	<-f.done
}

// PidStatus returns a field of /proc/<pid>/status counted in kB (VmRSS,
// VmHWM), in bytes.
func PidStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// MachineCPU returns the time every CPU of the machine spent busy and in
// all since boot (the first line of /proc/stat; idle and iowait are not
// busy). Two readings give the machine's busy share between them.
func MachineCPU() (busy, total time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fs := strings.Fields(line)
	if len(fs) < 6 || fs[0] != "cpu" {
		return 0, 0, fmt.Errorf("unexpected /proc/stat %q", line)
	}
	var idle int64
	for i, f := range fs[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("unexpected /proc/stat %q: %w", line, err)
		}
		total += time.Duration(n)
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	busy = (total - time.Duration(idle)) * time.Second / clockTicks
	return busy, total * time.Second / clockTicks, nil
}
