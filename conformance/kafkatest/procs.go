package kafkatest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// markerProp is the system property put on every JVM's command line. Its
// value is the owner directory of the test process that started the JVM;
// the orphan reaper kills a JVM only if its /proc/<pid>/cmdline carries the
// marker of an owner that is no longer alive.
const markerProp = "-Dferry.kafkatest="

// tempDirsName is the file in an owner directory listing the temporary
// cluster directories its process created, removed when it is reaped.
const tempDirsName = "tempdirs"

// ownerLockName is the file in an owner directory that its test process
// holds flocked for as long as it lives.
const ownerLockName = "owner.lock"

// procs is the process-wide registry of everything that must die with this
// test process.
var procs struct {
	sync.Mutex
	owner     string   // owner directory: <cache>/kafkatest-pids/<pid>-<random>
	ownerLock *os.File // flocked while this process lives
	running   map[*process]struct{}
	cmds      map[*exec.Cmd]struct{} // from JavaCmd; started by callers
	clusters  map[*Cluster]struct{}
	reapOnce  sync.Once
}

// pidsDir is the directory holding one owner directory per live test process.
func pidsDir() (string, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "kafkatest-pids"), nil
}

// ownerDir returns this process's owner directory, creating and flocking it
// on first use (after reaping orphans of dead owners).
func ownerDir() (string, error) {
	reapOrphans()
	procs.Lock()
	defer procs.Unlock()
	if procs.owner != "" {
		return procs.owner, nil
	}
	base, err := pidsDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(rnd[:]))
	// Build the directory under a dot name the reaper ignores, lock it,
	// then rename it into place, so no reaper ever sees it unlocked.
	tmp := filepath.Join(base, "."+name)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return "", err
	}
	f, err := os.OpenFile(filepath.Join(tmp, ownerLockName), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return "", fmt.Errorf("flock owner lock: %w", err)
	}
	fmt.Fprintf(f, "pid %d\n", os.Getpid())
	dir := filepath.Join(base, name)
	if err := os.Rename(tmp, dir); err != nil {
		f.Close()
		return "", err
	}
	procs.owner, procs.ownerLock = dir, f
	return dir, nil
}

// reapOrphans kills, once per process, the JVMs of every owner directory
// whose test process is gone (its lock can be taken), then removes the
// directory.
func reapOrphans() {
	procs.reapOnce.Do(func() {
		base, err := pidsDir()
		if err != nil {
			return
		}
		entries, err := os.ReadDir(base)
		if err != nil {
			return
		}
		for _, e := range entries {
			if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
				continue
			}
			reapOwner(filepath.Join(base, e.Name()))
		}
	})
}

func reapOwner(owner string) {
	f, err := os.OpenFile(filepath.Join(owner, ownerLockName), os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return // owner alive
	}
	for _, pid := range markedPids(owner) {
		fmt.Fprintf(os.Stderr, "kafkatest: killing orphaned JVM pid %d of dead test process %s\n", pid, filepath.Base(owner))
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if b, err := os.ReadFile(filepath.Join(owner, tempDirsName)); err == nil {
		for _, d := range strings.Split(string(b), "\n") {
			if d != "" {
				_ = os.RemoveAll(d)
			}
		}
	}
	_ = os.RemoveAll(owner)
}

// markedPids lists processes whose command line carries owner's marker.
func markedPids(owner string) []int {
	want := []byte(markerProp + owner)
	dirs, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(cmdline, []byte{0}) {
			if bytes.Equal(arg, want) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// Main runs the tests of a package that starts Kafka: use it as
//
//	func TestMain(m *testing.M) { kafkatest.Main(m) }
//
// It reaps JVMs left by earlier crashed test processes, runs the tests, and
// on exit, SIGINT or SIGTERM closes every cluster and kills every JVM this
// process started.
func Main(m *testing.M) {
	reapOrphans()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigc:
			fmt.Fprintf(os.Stderr, "kafkatest: %v: killing every JVM\n", s)
			cleanupAll()
			os.Exit(128 + int(s.(syscall.Signal)))
		case <-done:
		}
	}()
	code := m.Run()
	signal.Stop(sigc)
	close(done)
	cleanupAll()
	os.Exit(code)
}

// cleanupAll closes every open cluster, kills every other JVM this process
// started and releases the owner directory.
func cleanupAll() {
	procs.Lock()
	clusters := make([]*Cluster, 0, len(procs.clusters))
	for c := range procs.clusters {
		clusters = append(clusters, c)
	}
	procs.Unlock()
	for _, c := range clusters {
		_ = c.Close()
	}

	procs.Lock()
	defer procs.Unlock()
	for p := range procs.running {
		p.signal(syscall.SIGKILL)
	}
	for cmd := range procs.cmds {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	if procs.owner != "" {
		_ = os.RemoveAll(procs.owner)
		procs.ownerLock.Close()
		procs.owner, procs.ownerLock = "", nil
	}
}

// recordTempDir notes a temporary directory in the owner directory so that
// a reaper removes it if this process dies without closing its cluster.
func recordTempDir(owner, dir string) {
	procs.Lock()
	defer procs.Unlock()
	f, err := os.OpenFile(filepath.Join(owner, tempDirsName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintln(f, dir)
	f.Close()
}

// process is a started JVM in its own process group.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // Wait's result, valid after done
}

// sysProcAttr puts a child in its own process group (so the whole group can
// be killed) and has the kernel kill it if this process dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// startProcess starts cmd and tracks it until it exits.
func startProcess(cmd *exec.Cmd) (*process, error) {
	cmd.SysProcAttr = sysProcAttr()
	p := &process{cmd: cmd, done: make(chan struct{})}
	procs.Lock()
	defer procs.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if procs.running == nil {
		procs.running = make(map[*process]struct{})
	}
	procs.running[p] = struct{}{}
	go func() {
		p.err = cmd.Wait()
		procs.Lock()
		delete(procs.running, p)
		procs.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process group unless the process has exited.
func (p *process) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// stop sends sig, waits up to grace for the exit, then SIGKILLs and waits.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	p.signal(sig)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.signal(syscall.SIGKILL)
	<-p.done
}

// baseJVMArgs are the flags every JVM gets before the class path.
func baseJVMArgs(owner string) []string {
	return []string{
		"-XX:+ExitOnOutOfMemoryError",
		"-XX:-UsePerfData",
		"-Djava.awt.headless=true",
		"-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
		markerProp + owner,
	}
}

// JavaCmd returns an unstarted java command running mainClass with Kafka's
// class path (perf tools, client programs). Its JVM gets -Xmx512m; it runs
// in its own process group, is killed when ctx is done, when the test ends,
// and by Main or the kernel if the test process dies.
func JavaCmd(ctx context.Context, t testing.TB, mainClass string, args ...string) *exec.Cmd {
	t.Helper()
	cp := Classpath(t)
	owner, err := ownerDir()
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	argv := append(baseJVMArgs(owner), cdsArgs(cdsArchive(kafkaVersion, JarDir(t)))...)
	argv = append(argv, "-Xmx512m", "-cp", cp, mainClass)
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, "java", argv...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	procs.Lock()
	if procs.cmds == nil {
		procs.cmds = make(map[*exec.Cmd]struct{})
	}
	procs.cmds[cmd] = struct{}{}
	procs.Unlock()
	t.Cleanup(func() {
		procs.Lock()
		delete(procs.cmds, cmd)
		procs.Unlock()
		if cmd.Process != nil {
			if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				t.Logf("kafkatest: killing %s: %v", mainClass, err)
			}
		}
	})
	return cmd
}
