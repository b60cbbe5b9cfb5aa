package conformance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// This file knows the client programs in clients/ (see clients/README.md):
// where each lives, how to start it, and what it supports. Every program
// follows one CLI contract, so the tests drive them alike.

const installHint = "run conformance/clients/install.sh"

// runTimeout bounds one client program run; consume gives up by itself
// after 60 s, so this only catches a hung program.
const runTimeout = 2 * time.Minute

// record is one line a client program prints for a produced or consumed
// record.
type record struct {
	Partition int32             `json:"partition"`
	Offset    int64             `json:"offset"`
	Key       string            `json:"key"`
	Value     string            `json:"value"`
	Headers   map[string]string `json:"headers"`
	Timestamp int64             `json:"timestamp"`
	// Aborted marks a record that transactional produce wrote in an
	// aborted transaction.
	Aborted bool `json:"aborted,omitempty"`
}

func (r record) String() string {
	return fmt.Sprintf("p%d@%d %s=%s h=%v ts=%d", r.Partition, r.Offset, r.Key, r.Value, r.Headers, r.Timestamp)
}

// client is one implementation of the client program contract.
type client struct {
	name string
	// produceCodecs are the --compression values its producer supports.
	produceCodecs []string
	// fetchCodecs are the codecs its consumer can decompress.
	fetchCodecs []string
	// groupProtocols are the --group-protocol values its consumer supports.
	groupProtocols []string
	// transactions says whether produce supports --transactional-id.
	transactions bool
	// streams says whether the program has the produce-steady and stream
	// modes (every client but Debian's librdkafka 2.0.2, whose program
	// predates them): the tests that run those modes take the clients
	// that have them.
	streams bool
	// ignoresSameEpochLeader declares that the client keeps a partition on
	// its old leader when metadata names a new one with the leader epoch
	// unchanged, as librdkafka from 2.4.0 does until a later release fixed
	// it. A fleet member's death moves the partitions it led to another
	// member just so (the physical leader and its epoch are unchanged), and
	// such a client loses them for good: TestFleetMemberKillClients leaves
	// it out, saying so.
	ignoresSameEpochLeader bool
	// command returns the unstarted program; args start with the mode.
	command func(ctx context.Context, t *testing.T, args ...string) *exec.Cmd
}

var allCodecs = []string{"none", "gzip", "snappy", "lz4", "zstd"}

// clients returns every client of the matrix. It fails the test if one is
// not installed: a missing client must not quietly shrink the matrix.
func clients(t *testing.T) []*client {
	t.Helper()
	venvPython := filepath.Join(cacheDir(t), "clients", "py-venv", "bin", "python")
	kpPython := mustExist(t, filepath.Join(cacheDir(t), "clients", "kafka-python-venv", "bin", "python"))
	kpClient := mustExist(t, filepath.Join("clients", "kafka-python", "client.py"))
	checkImport(t, kpPython, "kafka, snappy, lz4.frame, zstandard, crc32c")
	goClient := mustExist(t, confluentGoBinary(t))
	pyClient := mustExist(t, filepath.Join("clients", "python", "client.py"))
	nodeClient := mustExist(t, filepath.Join("clients", "node", "client.js"))
	mustExist(t, filepath.Join("clients", "node", "node_modules", "kafkajs", "package.json"))
	mustExist(t, filepath.Join("clients", "node", "node_modules", "kafkajs-snappy", "package.json"))
	mustExist(t, venvPython)
	debianPython := mustExist(t, "/usr/bin/python3")
	nodeBin := mustLookPath(t, "node")
	checkImport(t, debianPython, "confluent_kafka")

	return []*client{
		{
			name:           "java",
			produceCodecs:  allCodecs,
			fetchCodecs:    allCodecs,
			groupProtocols: []string{"classic", "consumer"},
			transactions:   true,
			streams:        true,
			command:        javaCommand,
		},
		{
			// librdkafka as shipped in PyPI's confluent-kafka wheel.
			name:           "librdkafka",
			produceCodecs:  allCodecs,
			fetchCodecs:    allCodecs,
			groupProtocols: []string{"classic", "consumer"},
			transactions:   true,
			streams:        true,
			command:        plainCommand(venvPython, pyClient),
		},
		{
			// Debian's python3-confluent-kafka: librdkafka 2.0.2, which
			// predates KIP-848 and picks features from ApiVersions the
			// old way (compression only with Produce v0 advertised).
			name:           "librdkafka-2.0.2",
			produceCodecs:  allCodecs,
			fetchCodecs:    allCodecs,
			groupProtocols: []string{"classic"},
			transactions:   true,
			streams:        false,
			command:        plainCommand(debianPython, pyClient),
		},
		{
			// kafkajs ships gzip; snappy comes from kafkajs-snappy. lz4
			// and zstd need native codecs, so it neither writes nor
			// reads them.
			name:           "kafkajs",
			produceCodecs:  []string{"none", "gzip", "snappy"},
			fetchCodecs:    []string{"none", "gzip", "snappy"},
			groupProtocols: []string{"classic"},
			transactions:   true,
			streams:        true,
			command:        plainCommand(nodeBin, nodeClient),
		},
		{
			// kafka-python 3.0.12, pure Python, with python-snappy, lz4
			// and zstandard installed for its codecs. Idempotent and
			// transactional producers; no KIP-848 consumer.
			name:           "kafka-python",
			produceCodecs:  allCodecs,
			fetchCodecs:    allCodecs,
			groupProtocols: []string{"classic"},
			transactions:   true,
			streams:        true,
			command:        plainCommand(kpPython, kpClient),
		},
		{
			// confluent-kafka-go v2.6.1 and the librdkafka 2.6.1 it
			// bundles: a Go program, built by install.sh.
			name:           "confluent-kafka-go",
			produceCodecs:  allCodecs,
			fetchCodecs:    allCodecs,
			groupProtocols: []string{"classic", "consumer"},
			transactions:   true,
			streams:        true,
			// librdkafka 2.6.1: its producer failed every record of the
			// dead member's partitions after a fleet member's kill, its
			// groups read none of them.
			ignoresSameEpochLeader: true,
			command:                binaryCommand(goClient),
		},
	}
}

// streamClients is the clients that have the produce-steady and stream
// modes.
func streamClients(cls []*client) []*client {
	var out []*client
	for _, cl := range cls {
		if cl.streams {
			out = append(out, cl)
		}
	}
	return out
}

// confluentGoBinary is where install.sh builds clients/confluent-kafka-go:
// <cache>/clients/confluent-kafka-go-<hash>/client, the hash (12 hex
// digits of SHA-256) over go.mod, go.sum and the .go files in name order,
// so that a binary built from other sources is not taken for this one.
func confluentGoBinary(t *testing.T) string {
	t.Helper()
	src := filepath.Join("clients", "confluent-kafka-go")
	gos, err := filepath.Glob(filepath.Join(src, "*.go"))
	if err != nil || len(gos) == 0 {
		t.Fatalf("no Go sources in %s (%v)", src, err)
	}
	h := sha256.New()
	for _, f := range append([]string{filepath.Join(src, "go.mod"), filepath.Join(src, "go.sum")}, gos...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("client program dependency missing: %v; %s", err, installHint)
		}
		h.Write(b)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:12]
	return filepath.Join(cacheDir(t), "clients", "confluent-kafka-go-"+sum, "client")
}

func mustExist(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err == nil {
		_, err = os.Stat(abs)
	}
	if err != nil {
		t.Fatalf("client program dependency missing: %v; %s", err, installHint)
	}
	return abs
}

func mustLookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: %v; %s", name, err, installHint)
	}
	return p
}

func checkImport(t *testing.T, python, module string) {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import "+module).CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import %s: %v\n%s%s", python, module, err, out, installHint)
	}
}

// plainCommand runs a script with an interpreter, in its own process group
// that is killed when ctx ends or the test process dies.
func plainCommand(interpreter, script string) func(context.Context, *testing.T, ...string) *exec.Cmd {
	return func(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, interpreter, append([]string{script}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 5 * time.Second
		return cmd
	}
}

// binaryCommand runs a program, as plainCommand does a script.
func binaryCommand(bin string) func(context.Context, *testing.T, ...string) *exec.Cmd {
	return func(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 5 * time.Second
		return cmd
	}
}

// javaCommand runs clients/java/Client.java, compiled once per source
// version, through kafkatest.JavaCmd with the class directory put in front
// of Kafka's class path.
func javaCommand(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	classes := javaClasses(t)
	cmd := kafkatest.JavaCmd(ctx, t, "Client", args...)
	i := slices.Index(cmd.Args, "-cp")
	if i < 0 || i+1 >= len(cmd.Args) {
		t.Fatalf("kafkatest.JavaCmd no longer passes -cp (args %q); update javaCommand", cmd.Args)
	}
	cmd.Args[i+1] = classes + string(os.PathListSeparator) + cmd.Args[i+1]
	// Short-lived client JVMs start faster with the C1 compiler alone.
	cmd.Args = slices.Insert(cmd.Args, i, "-XX:TieredStopAtLevel=1")
	return cmd
}

var javaBuild struct {
	once sync.Once
	dir  string
	err  error
}

// javaClasses compiles Client.java into <cache>/clients/java-<hash>, where
// the hash covers the source and the Kafka version, and returns that
// directory. Test binaries running at once each compile into a temporary
// directory and the first rename wins.
func javaClasses(t *testing.T) string {
	t.Helper()
	javaBuild.once.Do(func() {
		javaBuild.dir, javaBuild.err = compileJava(t)
	})
	if javaBuild.err != nil {
		t.Fatalf("compiling the Java client: %v", javaBuild.err)
	}
	return javaBuild.dir
}

func compileJava(t *testing.T) (string, error) {
	src, err := filepath.Abs(filepath.Join("clients", "java", "Client.java"))
	if err != nil {
		return "", err
	}
	text, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(append(text, kafkatest.Version()...))
	parent := filepath.Join(cacheDir(t), "clients")
	dir := filepath.Join(parent, "java-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dir, "Client.class")); err == nil {
		return dir, nil
	}
	javac, err := exec.LookPath("javac")
	if err != nil {
		return "", fmt.Errorf("%w; %s", err, installHint)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(parent, ".java-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	out, err := exec.Command(javac, "-encoding", "UTF-8", "-cp", kafkatest.Classpath(t), "-d", tmp, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("javac: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "Client.class")); statErr != nil {
			return "", err
		}
	}
	return dir, nil
}

// cacheDir is $FERRY_CACHE, else <repo root>/.cache, as for kafkatest and
// clients/install.sh.
func cacheDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("FERRY_CACHE"); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	dir, err := os.Getwd() // go test runs in the package directory
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, ".cache")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("cannot find the repo root (go.mod) above the working directory")
		}
		dir = parent
	}
}

// run runs one client program to completion and returns the records it
// printed. A non-zero exit, or a line that is not a record, fails the test
// with the program's stderr.
func (cl *client) run(t *testing.T, args ...string) []record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := cl.command(ctx, t, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w (killed after %v)", err, runTimeout)
		}
		t.Fatalf("%s %s: %v after %v\nstderr:\n%s\nstdout (%d bytes):\n%s", cl.name, strings.Join(args, " "),
			err, took, tail(stderr.String(), 4000), stdout.Len(), tail(stdout.String(), 1000))
	}
	var recs []record
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s %s: bad output line %q: %v", cl.name, args[0], sc.Text(), err)
		}
		recs = append(recs, r)
	}
	t.Logf("%s %s: %d records in %v", cl.name, strings.Join(args, " "), len(recs), took)
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("%s %s stderr:\n%s", cl.name, args[0], tail(s, 2000))
	}
	return recs
}

// produce runs produce and returns the acknowledged records.
func (cl *client) produce(t *testing.T, bootstrap, topic string, count int, codec string, extra ...string) []record {
	t.Helper()
	args := []string{"produce", "--bootstrap", bootstrap, "--topic", topic,
		"--count", fmt.Sprint(count), "--compression", codec}
	return cl.run(t, append(args, extra...)...)
}

// consume runs consume with a group and returns the records read.
func (cl *client) consume(t *testing.T, bootstrap, topic, group string, count int, protocol string, extra ...string) []record {
	t.Helper()
	args := []string{"consume", "--bootstrap", bootstrap, "--topic", topic, "--group", group,
		"--count", fmt.Sprint(count), "--group-protocol", protocol}
	return cl.run(t, append(args, extra...)...)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
