package main

// The JVMs of the benchmark: MirrorMaker 2 and ProducerPerformance, both
// started through kafkatest.JavaCmd, so that they carry the harness's
// marker (a later kafkatest user reaps them if this process dies), run in
// their own process group and die with this process.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// mm2Version is connect-mirror's version in conformance/maven-mm2/pom.xml:
// 4.4.0 is not on Maven Central, 4.3.1 is, and runs against 4.4.0 brokers.
const mm2Version = "4.3.1"

// jvmPerfArgs are the flags kafka-run-class.sh gives every Kafka tool
// (KAFKA_JVM_PERFORMANCE_OPTS).
var jvmPerfArgs = []string{"-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
	"-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent"}

// mm2HeapArgs is connect-mirror-maker.sh's heap (KAFKA_HEAP_OPTS).
var mm2HeapArgs = []string{"-Xms256m", "-Xmx2g"}

// javaCmd is kafkatest.JavaCmd with errors instead of test failures. The
// caller must call tb.cleanup once the JVM is no longer needed.
//
// JavaCmd runs `java <flags> -Xmx512m -cp <Kafka 4.4.0 jars> mainClass
// args...`; the java launcher reads options up to the first non-option, and
// a later -cp or -Xmx replaces an earlier one, so JVM flags and a class path
// of our own go first in args, followed by the real main class.
func javaCmd(ctx context.Context, name, mainClass string, args ...string) (cmd *exec.Cmd, tb *benchutil.JavaTB, err error) {
	tb = benchutil.NewJavaTB(name, step)
	defer func() {
		if benchutil.RecoverJava(recover(), &err) {
			tb.Close()
			cmd, tb = nil, nil
		}
	}()
	cmd = kafkatest.JavaCmd(ctx, tb, mainClass, args...)
	return cmd, tb, nil
}

// mm2Jars returns the directory of connect-mirror's jars and their runtime
// dependencies, resolving them with Maven on first use into
// <cache>/mm2-<version> (the cache of kafkatest: $FERRY_CACHE, else
// <repo root>/.cache), as kafkatest resolves Kafka's.
func mm2Jars() (string, error) {
	root, err := kafkatest.RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := kafkatest.CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "mm2-"+mm2Version)
	pom := filepath.Join(root, "conformance", "maven-mm2", "pom.xml")
	if err := kafkatest.ResolveJars(pom, dir, "MirrorMaker 2", mm2Version, "connect-mirror-"+mm2Version+".jar"); err != nil {
		return "", err
	}
	return dir, nil
}

// mm2Config is one MirrorMaker 2 run: source alias → "target", one topic.
type mm2Config struct {
	sourceAlias string // unique per run, so Connect's internal topics start empty
	source      string // bootstrap servers
	target      string
	topic       string
	tasks       int
	codec       string // compression.type of MM2's producer
}

// properties renders mm2.properties: IdentityReplicationPolicy, tasks.max
// = partitions, the producer batching of the load and the ceiling with the
// topic's codec, and everything the benchmark does not use switched off
// (heartbeats, checkpoints, offset syncs, group offset and ACL sync), which
// only spares MM2 work.
func (c mm2Config) properties() string {
	a, b := c.sourceAlias, "target"
	props := map[string]string{
		"clusters":                             a + ", " + b,
		a + ".bootstrap.servers":               c.source,
		b + ".bootstrap.servers":               c.target,
		a + "->" + b + ".enabled":              "true",
		a + "->" + b + ".topics":               regexp.QuoteMeta(c.topic),
		b + "->" + a + ".enabled":              "false",
		"replication.policy.class":             "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
		"tasks.max":                            strconv.Itoa(c.tasks),
		"emit.heartbeats.enabled":              "false",
		"emit.checkpoints.enabled":             "false",
		"emit.offset-syncs.enabled":            "false",
		"sync.group.offsets.enabled":           "false",
		"sync.topic.acls.enabled":              "false",
		"refresh.topics.interval.seconds":      "600",
		"refresh.groups.interval.seconds":      "600",
		"replication.factor":                   "1",
		"heartbeats.topic.replication.factor":  "1",
		"checkpoints.topic.replication.factor": "1",
		"config.storage.replication.factor":    "1",
		"offset.storage.replication.factor":    "1",
		"status.storage.replication.factor":    "1",
	}
	for k, v := range producerProps(c.codec) {
		props[b+".producer."+k] = v
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s=%s\n", k, props[k])
	}
	return sb.String()
}

// producerProps is the Java producer configuration of MM2 and of the
// ceiling run: the batching of franz-go's defaults, which produced the
// source topic (10 ms linger, batches up to about 1 MB), acks=all, and the
// topic's codec.
func producerProps(codec string) map[string]string {
	return map[string]string{
		"acks":             "all",
		"linger.ms":        "10",
		"batch.size":       "1000000",
		"max.request.size": "8388608",
		"compression.type": codec,
	}
}

// mm2Fatal are MM2 log lines after which the copy never completes: MM2
// logs them and goes on running.
var mm2Fatal = []string{
	"Failed to configure MirrorSourceConnector",
	"Task threw an uncaught and unrecoverable exception",
	"Task is being killed and will not recover",
}

// mm2LogErrors returns an error for the first fatal line in MM2's log.
func mm2LogErrors(logFile string) error {
	b, err := os.ReadFile(logFile)
	if err != nil {
		return nil
	}
	lines := strings.Split(string(b), "\n")
	for i, line := range lines {
		for _, f := range mm2Fatal {
			if strings.Contains(line, f) {
				return fmt.Errorf("MirrorMaker 2 failed (%s):\n%s", logFile, strings.Join(lines[i:min(i+4, len(lines))], "\n"))
			}
		}
	}
	return nil
}

// startMM2 writes mm2.properties into dir and starts MirrorMaker 2 with its
// log in dir.
func startMM2(ctx context.Context, dir, jars string, c mm2Config) (*proc, *benchutil.JavaTB, error) {
	propsFile := filepath.Join(dir, "mm2-"+c.sourceAlias+".properties")
	if err := os.WriteFile(propsFile, []byte(c.properties()), 0o644); err != nil {
		return nil, nil, err
	}
	args := append(append([]string{}, mm2HeapArgs...), jvmPerfArgs...)
	args = append(args, "-cp", jars+"/*", "org.apache.kafka.connect.mirror.MirrorMaker", propsFile)
	cmd, tb, err := javaCmd(ctx, "mm2", args[0], args[1:]...)
	if err != nil {
		return nil, nil, err
	}
	logFile := filepath.Join(dir, "mm2-"+c.sourceAlias+".log")
	f, err := os.Create(logFile)
	if err != nil {
		tb.Close()
		return nil, nil, err
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	p, err := startProc(cmd)
	if err != nil {
		tb.Close()
		return nil, nil, fmt.Errorf("starting MirrorMaker 2: %w", err)
	}
	return p, tb, nil
}

// ceilingResult is one ProducerPerformance run.
type ceilingResult struct {
	records int64
	rps     float64 // records per second, as ProducerPerformance reports
	mbps    float64 // record value MB/s (10^6), rps × record size
	cpu     time.Duration
	summary string // ProducerPerformance's last line
}

var ppSummary = regexp.MustCompile(`^(\d+) records sent, ([0-9.]+) records/sec`)

// producerPerf runs ProducerPerformance: n records picked at random from
// payloadFile (one value a line), into topic, with producerProps(codec).
func producerPerf(ctx context.Context, bootstrap, topic, payloadFile, codec string, n int64, size int) (ceilingResult, error) {
	args := append([]string{}, jvmPerfArgs...)
	args = append(args, "org.apache.kafka.tools.ProducerPerformance",
		"--topic", topic, "--num-records", strconv.FormatInt(n, 10), "--throughput", "-1",
		"--payload-file", payloadFile, "--producer-props", "bootstrap.servers="+bootstrap)
	pp := producerProps(codec)
	keys := make([]string, 0, len(pp))
	for k := range pp {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, k+"="+pp[k])
	}
	cmd, tb, err := javaCmd(ctx, "ProducerPerformance", args[0], args[1:]...)
	if err != nil {
		return ceilingResult{}, err
	}
	defer tb.Close()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	p, err := startProc(cmd)
	if err != nil {
		return ceilingResult{}, err
	}
	// Read the JVM's CPU just before it is reaped: poll while it runs.
	var cpu time.Duration
	for !p.exited() {
		if c, err := p.cpu(); err == nil {
			cpu = c
		}
		select {
		case <-p.done:
		case <-time.After(200 * time.Millisecond):
		}
	}
	if p.err != nil {
		return ceilingResult{}, fmt.Errorf("ProducerPerformance: %v\n%s\n%s", p.err, tail(out.String(), 20), tail(errOut.String(), 20))
	}
	var res ceilingResult
	for _, line := range strings.Split(out.String(), "\n") {
		if m := ppSummary.FindStringSubmatch(line); m != nil && strings.Contains(line, "50th") {
			res.records, _ = strconv.ParseInt(m[1], 10, 64)
			res.rps, _ = strconv.ParseFloat(m[2], 64)
			res.summary = strings.TrimSpace(line)
		}
	}
	if res.records != n {
		return ceilingResult{}, fmt.Errorf("ProducerPerformance: no summary for %d records in its output:\n%s\n%s", n, tail(out.String(), 20), tail(errOut.String(), 20))
	}
	res.mbps = res.rps * float64(size) / 1e6
	res.cpu = cpu
	return res, nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}
