package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// formatTimeout bounds kafka.tools.StorageTool format.
	formatTimeout = 60 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
	stopGrace = 60 * time.Second
	// startAttempts is how often New retries after a port bind clash.
	startAttempts = 3
)

// readyTimeout bounds the wait for a cluster (or a restarted node) to be
// usable: 90 s, generous for a 2-core machine, or FERRY_KAFKATEST_READY_TIMEOUT
// (a Go duration) for a heavily loaded one.
var readyTimeout = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("FERRY_KAFKATEST_READY_TIMEOUT")); err == nil && d > 0 {
		return d
	}
	return 90 * time.Second
}()

// errBindClash means a node could not bind a port picked for it because
// something else took it in between.
var errBindClash = errors.New("port bind clash")

// Config describes a cluster for New.
type Config struct {
	// Brokers is the number of nodes; each is broker and controller.
	Brokers int
	// Name labels the cluster in directory names and logs; default "kafka".
	Name string
	// BrokerConfig overrides or adds server.properties entries on every
	// node, applied after the harness defaults.
	BrokerConfig map[string]string
	// Dir holds node directories and logs; it is kept after Close. If
	// empty, a temporary directory is used and removed by Close (unless
	// FERRY_KAFKATEST_KEEP is set).
	Dir string
	// JVMArgs are appended to the broker JVM flags (later flags win), e.g.
	// "-XX:TieredStopAtLevel=1", which cuts start-up CPU by about 45% here
	// at the cost of peak throughput.
	JVMArgs []string
	// Listeners are extra client listeners on every node, on ports the
	// harness picks.
	Listeners []Listener
	// Version is the Apache Kafka version the nodes run, one of Versions;
	// "" is the default, Version().
	Version string
	// ZooKeeper runs the cluster in ZooKeeper mode: one ZooKeeper JVM
	// (ZooKeeperServerMain) beside the nodes, which are brokers only, one
	// of them elected controller. Versions before 4.0 only, and the only
	// mode 2.8 is run in.
	ZooKeeper bool
}

// Listener is an extra client listener (Config.Listeners), PLAINTEXT like
// the default one unless Protocol says otherwise.
type Listener struct {
	// Name is the listener's name in server.properties, e.g. "RELAY".
	Name string
	// Advertise returns the host:port that metadata answered on this
	// listener names for a node: something a test puts between clients
	// and the brokers gives its own address there, so that clients reach
	// every broker through it. nil: the listener's own address.
	Advertise func(nodeID int32) string
	// Protocol is its security protocol: PLAINTEXT (default), SSL,
	// SASL_PLAINTEXT or SASL_SSL (see WithSecureListener).
	Protocol string
	// Config are properties of this listener only, written as
	// listener.name.<name>.<key> (lower-case name), e.g.
	// "ssl.keystore.type": "PEM".
	Config map[string]string
}

// Option adjusts the Config built by Start.
type Option func(*Config)

// WithBrokerConfig sets one server.properties entry on every node.
func WithBrokerConfig(k, v string) Option {
	return func(c *Config) {
		if c.BrokerConfig == nil {
			c.BrokerConfig = make(map[string]string)
		}
		c.BrokerConfig[k] = v
	}
}

// WithVersion runs the cluster on another Kafka version (see
// Config.Version and Versions).
func WithVersion(v string) Option { return func(c *Config) { c.Version = v } }

// WithZooKeeper runs the cluster in ZooKeeper mode (see Config.ZooKeeper).
func WithZooKeeper() Option { return func(c *Config) { c.ZooKeeper = true } }

// WithName names the cluster (see Config.Name).
func WithName(name string) Option { return func(c *Config) { c.Name = name } }

// WithListener adds an extra client listener to every node (see
// Config.Listeners).
func WithListener(l Listener) Option {
	return func(c *Config) { c.Listeners = append(c.Listeners, l) }
}

// Cluster is a running KRaft cluster of combined broker+controller JVMs,
// or a ZooKeeper-mode cluster of broker JVMs and one ZooKeeper JVM.
type Cluster struct {
	cfg       Config
	zk        *zkNode // ZooKeeper mode only
	dir       string
	removeDir bool
	clusterID string
	jars      string
	cds       string // class data sharing archive to use, or ""
	cdsDump   string // where node 1 dumps an archive at exit, or ""
	owner     string
	nodes     []*node // ordered by id, ids 1..n

	mu     sync.Mutex // guards node.proc and closed
	closed bool

	closeOnce sync.Once
	closeErr  error
}

type node struct {
	id       int32
	port     int   // PLAINTEXT listener
	ctrlPort int   // CONTROLLER listener
	extra    []int // Config.Listeners, in order
	dir      string
	props    string
	log      string
	proc     *process // last started JVM; nil before the first start
}

func (n *node) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

func (n *node) running() bool { return n.proc != nil && !n.proc.exited() }

// Start starts a cluster of the given size for t, closes it when the test
// ends and, if the test failed, logs the tail of every node's log. It skips
// the test under -short and fails it if the cluster cannot start.
func Start(t testing.TB, brokers int, opts ...Option) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("kafkatest: real Kafka is not started in -short mode")
	}
	cfg := Config{Brokers: brokers, Name: t.Name()}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kafkatest: cluster %q (%s) logs:\n%s", c.cfg.Name, c.dir, c.LogTail(100))
		}
		if err := c.Close(); err != nil {
			t.Errorf("kafkatest: closing cluster %q: %v", c.cfg.Name, err)
		}
	})
	return c
}

var nameClean = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// New starts a cluster and waits until every node is in the metadata. It
// does not need a testing.T, so TestMain can share a cluster between tests;
// the caller must Close it (Main does so on exit).
func New(cfg Config) (*Cluster, error) {
	if cfg.Version == "" {
		cfg.Version = kafkaVersion
	}
	if err := checkMode(cfg); err != nil {
		return nil, err
	}
	jars, err := jarDirFor(cfg.Version)
	if err != nil {
		return nil, fmt.Errorf("kafkatest: %w", err)
	}
	return newCluster(cfg, jars, cdsArchive(cfg.Version, jars), "")
}

// checkMode refuses a version in a mode it does not have (or that the
// harness does not run it in).
func checkMode(cfg Config) error {
	if _, _, err := parseVersion(cfg.Version); err != nil {
		return err
	}
	switch {
	case cfg.ZooKeeper && !hasZooKeeper(cfg.Version):
		return fmt.Errorf("kafkatest: Kafka %s has no ZooKeeper mode", cfg.Version)
	case !cfg.ZooKeeper && !hasKRaft(cfg.Version):
		return fmt.Errorf("kafkatest: Kafka %s runs in ZooKeeper mode only here (KRaft before 3.3 was not production-ready): add WithZooKeeper()", cfg.Version)
	}
	return nil
}

// parseVersion reads a version's major and minor numbers.
func parseVersion(v string) (major, minor int, err error) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, fmt.Errorf("kafkatest: version %q is not major.minor[.patch]", v)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("kafkatest: version %q is not major.minor[.patch]", v)
	}
	return major, minor, nil
}

// atLeast reports whether version v is major.minor or later.
func atLeast(v string, major, minor int) bool {
	ma, mi, err := parseVersion(v)
	return err == nil && (ma > major || ma == major && mi >= minor)
}

// hasKRaft: KRaft is production-ready from 3.3.
func hasKRaft(v string) bool { return atLeast(v, 3, 3) }

// hasZooKeeper: 4.0 removed ZooKeeper mode.
func hasZooKeeper(v string) bool { return !atLeast(v, 4, 0) }

// newCluster starts a cluster whose JVMs share the class archive cds (if
// not empty); a non-empty cdsDump makes node 1 write an archive to that
// path when it exits normally.
func newCluster(cfg Config, jars, cds, cdsDump string) (*Cluster, error) {
	if cfg.Brokers < 1 {
		return nil, fmt.Errorf("kafkatest: Config.Brokers is %d, want at least 1", cfg.Brokers)
	}
	if cfg.Version == "" {
		cfg.Version = kafkaVersion
	}
	cfg.Name = nameClean.ReplaceAllString(cfg.Name, "_")
	if len(cfg.Name) > 40 {
		cfg.Name = cfg.Name[:40]
	}
	if cfg.Name == "" {
		cfg.Name = "kafka"
	}
	owner, err := ownerDir()
	if err != nil {
		return nil, fmt.Errorf("kafkatest: %w", err)
	}
	c := &Cluster{cfg: cfg, jars: jars, cds: cds, cdsDump: cdsDump, owner: owner, clusterID: newClusterID()}
	if cfg.Dir != "" {
		c.dir, err = filepath.Abs(cfg.Dir)
		if err == nil {
			err = os.MkdirAll(c.dir, 0o755)
		}
	} else {
		c.dir, err = os.MkdirTemp("", "ferry-kafkatest-"+cfg.Name+"-")
		c.removeDir = os.Getenv("FERRY_KAFKATEST_KEEP") == ""
		if err == nil && c.removeDir {
			recordTempDir(owner, c.dir)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kafkatest: cluster dir: %w", err)
	}
	if cfg.ZooKeeper {
		d := filepath.Join(c.dir, "zookeeper")
		c.zk = &zkNode{dir: d, props: d + ".properties", log: d + ".log"}
	}
	for i := 1; i <= cfg.Brokers; i++ {
		d := filepath.Join(c.dir, fmt.Sprintf("node-%d", i))
		c.nodes = append(c.nodes, &node{
			id:    int32(i),
			dir:   d,
			props: d + ".properties",
			log:   d + ".log",
		})
	}
	procs.Lock()
	if procs.clusters == nil {
		procs.clusters = make(map[*Cluster]struct{})
	}
	procs.clusters[c] = struct{}{}
	procs.Unlock()

	for attempt := 1; ; attempt++ {
		err = c.start(attempt)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, errBindClash) || attempt == startAttempts {
			break
		}
		c.killAll()
	}
	tail := c.LogTail(60)
	c.killAll()
	err = fmt.Errorf("kafkatest: starting %d-node cluster %q in %s: %w\n%s", cfg.Brokers, cfg.Name, c.dir, err, tail)
	if c.removeDir {
		// Keep the directory of a failed start for inspection.
		c.removeDir = false
	}
	_ = c.Close()
	return nil, err
}

// newClusterID returns 16 random bytes in base64url without padding, never
// starting with '-' (StorageTool would read it as a flag).
func newClusterID() string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:])
		id := base64.RawURLEncoding.EncodeToString(b[:])
		if id[0] != '-' {
			return id
		}
	}
}

// start picks ports, writes and formats every node, launches the JVMs and
// waits until the cluster is ready.
func (c *Cluster) start(attempt int) error {
	per := 2 + len(c.cfg.Listeners)
	ports, err := pickPorts(per*len(c.nodes) + 1)
	if err != nil {
		return err
	}
	for i, n := range c.nodes {
		n.port, n.ctrlPort, n.extra = ports[per*i], ports[per*i+1], ports[per*i+2:per*(i+1)]
	}
	if c.cfg.Version != kafkaVersion || c.zk != nil {
		// Kafka before 4.0 logs through log4j 1, configured by a file.
		if err := os.WriteFile(c.log4jProps(), []byte(log4jProperties), 0o644); err != nil {
			return err
		}
	}
	if c.zk != nil {
		c.zk.port = ports[len(ports)-1]
		if err := c.startZooKeeper(attempt); err != nil {
			return err
		}
	}
	for _, n := range c.nodes {
		if err := os.RemoveAll(n.dir); err != nil {
			return err
		}
		if err := os.WriteFile(n.props, []byte(c.properties(n)), 0o644); err != nil {
			return err
		}
		appendLog(n.log, fmt.Sprintf("kafkatest: attempt %d: node %d PLAINTEXT %s CONTROLLER %d", attempt, n.id, n.addr(), n.ctrlPort))
	}
	if c.zk == nil {
		if err := c.format(); err != nil {
			return err
		}
	}
	c.mu.Lock()
	for _, n := range c.nodes {
		if err := c.launch(n); err != nil {
			c.mu.Unlock()
			return err
		}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := c.waitReady(ctx, c.NodeIDs(), c.nodes); err != nil {
		return err
	}
	if c.zk != nil {
		// ZooKeeper mode: the cluster ID is made by the first broker.
		id, err := c.readClusterID(ctx)
		if err != nil {
			return err
		}
		c.clusterID = id
	}
	return nil
}

// pickPorts is freePorts; tests replace it to force a bind clash.
var pickPorts = freePorts

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// properties renders node n's server.properties: harness defaults, then
// Config.BrokerConfig.
func (c *Cluster) properties(n *node) string {
	brokers := len(c.nodes)
	rf := min(3, brokers)
	minISR := max(1, rf-1) // tolerate one node down
	var voters []string
	for _, m := range c.nodes {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", m.id, m.ctrlPort))
	}
	listeners := fmt.Sprintf("PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", n.port, n.ctrlPort)
	advertised := fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", n.port)
	protocols := "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
	for i, l := range c.cfg.Listeners {
		listeners += fmt.Sprintf(",%s://127.0.0.1:%d", l.Name, n.extra[i])
		adv := net.JoinHostPort("127.0.0.1", strconv.Itoa(n.extra[i]))
		if l.Advertise != nil {
			adv = l.Advertise(n.id)
		}
		advertised += fmt.Sprintf(",%s://%s", l.Name, adv)
		proto := l.Protocol
		if proto == "" {
			proto = "PLAINTEXT"
		}
		protocols += "," + l.Name + ":" + proto
	}
	props := map[string]string{
		"process.roles":                  "broker,controller",
		"node.id":                        strconv.Itoa(int(n.id)),
		"controller.quorum.voters":       strings.Join(voters, ","),
		"listeners":                      listeners,
		"advertised.listeners":           advertised,
		"controller.listener.names":      "CONTROLLER",
		"inter.broker.listener.name":     "PLAINTEXT",
		"listener.security.protocol.map": protocols,
		"log.dirs":                       filepath.Join(n.dir, "data"),

		"num.partitions":                                   "1",
		"default.replication.factor":                       strconv.Itoa(rf),
		"auto.create.topics.enable":                        "false",
		"unclean.leader.election.enable":                   "false",
		"offsets.topic.replication.factor":                 strconv.Itoa(rf),
		"offsets.topic.num.partitions":                     "4",
		"transaction.state.log.replication.factor":         strconv.Itoa(rf),
		"transaction.state.log.min.isr":                    strconv.Itoa(minISR),
		"transaction.state.log.num.partitions":             "4",
		"share.coordinator.state.topic.replication.factor": strconv.Itoa(rf),
		"share.coordinator.state.topic.min.isr":            strconv.Itoa(minISR),
		"group.initial.rebalance.delay.ms":                 "0",
		"group.coordinator.rebalance.protocols":            "classic,consumer",
		"log.cleaner.dedupe.buffer.size":                   "16777216",
		// Tests write records with fixed timestamps years in the past
		// (to compare them exactly); time-based retention would delete
		// them at the next retention check, whenever that falls.
		"log.retention.ms": "-1",
	}
	if c.zk != nil {
		// Brokers only, registered in ZooKeeper; one is elected controller.
		for _, k := range []string{"process.roles", "node.id", "controller.quorum.voters", "controller.listener.names"} {
			delete(props, k)
		}
		props["broker.id"] = strconv.Itoa(int(n.id))
		props["zookeeper.connect"] = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.zk.port))
		props["listeners"] = strings.Replace(listeners, fmt.Sprintf(",CONTROLLER://127.0.0.1:%d", n.ctrlPort), "", 1)
		props["listener.security.protocol.map"] = strings.TrimPrefix(protocols, "CONTROLLER:PLAINTEXT,")
	}
	if atLeast(c.cfg.Version, 4, 2) {
		// Kafka Streams groups (KIP-1071), for the tests of Streams with
		// group.protocol=streams; a client opts in.
		props["group.coordinator.rebalance.protocols"] = "classic,consumer,streams"
		// A member left behind on the cluster a switch left expires
		// there within 20 s (the broker's default: 45 s), but is still
		// there when a test switches back a few seconds later, so the
		// switch removes it (the mirror's evictStreamsMembers).
		props["group.streams.min.session.timeout.ms"] = "6000"
		props["group.streams.session.timeout.ms"] = "20000"
		props["group.streams.min.heartbeat.interval.ms"] = "1000"
		props["group.streams.heartbeat.interval.ms"] = "1500"
	}
	if !atLeast(c.cfg.Version, 4, 0) {
		// Share groups and KIP-848 groups came with 4.0 (3.x had
		// KIP-848 as an early access, off here).
		for _, k := range []string{"share.coordinator.state.topic.replication.factor", "share.coordinator.state.topic.min.isr", "group.coordinator.rebalance.protocols"} {
			delete(props, k)
		}
	}
	for _, l := range c.cfg.Listeners {
		for k, v := range l.Config {
			props["listener.name."+strings.ToLower(l.Name)+"."+k] = v
		}
	}
	for k, v := range c.cfg.BrokerConfig {
		props[k] = v
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	mode := "KRaft"
	if c.zk != nil {
		mode = "ZooKeeper"
	}
	fmt.Fprintf(&b, "# written by kafkatest for cluster %s (%s), Kafka %s, %s mode\n", c.cfg.Name, c.clusterID, c.cfg.Version, mode)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	return b.String()
}

// nodeJVMArgs are the flags for broker JVMs. The JVM's default collector
// (G1 here) is kept: SerialGC measured no cheaper to start (about 4 s of CPU
// per node either way) and G1 matches what Kafka's scripts run.
var nodeJVMArgs = []string{"-Xms256m", "-Xmx512m"}

// format runs StorageTool format for every node in parallel.
func (c *Cluster) format() error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() {
			args := append(baseJVMArgs(c.owner), cdsArgs(c.cds)...)
			args = append(args, c.log4jArgs()...)
			args = append(args, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
				"-cp", c.jars+"/*", "kafka.tools.StorageTool", "format", "-t", c.clusterID, "-c", n.props)
			errs[i] = c.runLogged(n, formatTimeout, args)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runLogged runs a short-lived java command with output appended to n's log.
func (c *Cluster) runLogged(n *node, timeout time.Duration, args []string) error {
	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("java", args...)
	cmd.Stdout, cmd.Stderr = f, f
	p, err := startProcess(cmd)
	f.Close()
	if err != nil {
		return fmt.Errorf("node %d: starting java: %w", n.id, err)
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.stop(syscall.SIGKILL, timeout)
	}
	if p.err != nil {
		return fmt.Errorf("node %d: StorageTool format: %w (see %s)", n.id, p.err, n.log)
	}
	return nil
}

// launch starts node n's JVM; c.mu must be held.
func (c *Cluster) launch(n *node) error {
	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "\n==== kafkatest: %s starting node %d ====\n", time.Now().Format(time.RFC3339Nano), n.id)
	args := append(baseJVMArgs(c.owner), nodeJVMArgs...)
	args = append(args, cdsArgs(c.cds)...)
	if c.cdsDump != "" && n.id == 1 {
		args = append(args, "-XX:ArchiveClassesAtExit="+c.cdsDump)
	}
	args = append(args, c.log4jArgs()...)
	args = append(args, c.cfg.JVMArgs...)
	args = append(args, "-Dferry.kafkatest.node="+c.cfg.Name+"/"+strconv.Itoa(int(n.id)),
		"-cp", c.jars+"/*", "kafka.Kafka", n.props)
	cmd := exec.Command("java", args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = f, f
	p, err := startProcess(cmd)
	if err != nil {
		return fmt.Errorf("node %d: starting java: %w", n.id, err)
	}
	n.proc = p
	return nil
}

func appendLog(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "==== %s %s\n", time.Now().Format(time.RFC3339Nano), line)
	f.Close()
}

// exitError describes a node JVM that exited, recognising port clashes.
func (c *Cluster) exitError(n *node) error {
	err := fmt.Errorf("node %d exited during startup: %v", n.id, n.proc.err)
	if b, rerr := tailBytes(n.log, 64<<10); rerr == nil && strings.Contains(string(b), "Address already in use") {
		return fmt.Errorf("%w: %w", errBindClash, err)
	}
	return err
}

// Bootstrap returns every node's address, comma separated.
func (c *Cluster) Bootstrap() string { return strings.Join(c.Addrs(), ",") }

// Addrs returns every node's client address, ordered by node ID.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.addr()
	}
	return addrs
}

// NodeIDs returns the node IDs, 1..Brokers.
func (c *Cluster) NodeIDs() []int32 {
	ids := make([]int32, len(c.nodes))
	for i, n := range c.nodes {
		ids[i] = n.id
	}
	return ids
}

// Addr returns the client address of a node, or "" for an unknown ID.
func (c *Cluster) Addr(nodeID int32) string {
	if n := c.node(nodeID); n != nil {
		return n.addr()
	}
	return ""
}

// ListenerAddr returns the address a node listens on for the extra
// listener of that name (Config.Listeners), or "" if there is none.
func (c *Cluster) ListenerAddr(name string, nodeID int32) string {
	n := c.node(nodeID)
	for i, l := range c.cfg.Listeners {
		if n != nil && l.Name == name {
			return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.extra[i]))
		}
	}
	return ""
}

// Version returns the Kafka version the cluster runs.
func (c *Cluster) Version() string { return c.cfg.Version }

// ZooKeeper reports whether the cluster runs in ZooKeeper mode.
func (c *Cluster) ZooKeeper() bool { return c.zk != nil }

// ClusterID returns the KRaft cluster ID the nodes were formatted with, or
// in ZooKeeper mode the one the brokers made.
func (c *Cluster) ClusterID() string { return c.clusterID }

// Dir returns the directory holding the nodes' data, properties and logs.
func (c *Cluster) Dir() string { return c.dir }

// LogPath returns the path of a node's log file.
func (c *Cluster) LogPath(nodeID int32) string {
	if n := c.node(nodeID); n != nil {
		return n.log
	}
	return ""
}

func (c *Cluster) node(id int32) *node {
	if id < 1 || int(id) > len(c.nodes) {
		return nil
	}
	return c.nodes[id-1]
}

// Running reports whether a node's JVM is running.
func (c *Cluster) Running(nodeID int32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.node(nodeID)
	return n != nil && n.running()
}

// Pid returns the process ID of the node's running JVM, or 0 if it is not
// running: for a benchmark to read the broker's CPU time.
func (c *Cluster) Pid(nodeID int32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.node(nodeID)
	if n == nil || !n.running() {
		return 0
	}
	return n.proc.cmd.Process.Pid
}

// Stop sends SIGTERM to a node (a controlled shutdown) and waits for it to
// exit, sending SIGKILL after a minute.
func (c *Cluster) Stop(nodeID int32) error { return c.halt(nodeID, syscall.SIGTERM) }

// Kill sends SIGKILL to a node and waits for it to exit.
func (c *Cluster) Kill(nodeID int32) error { return c.halt(nodeID, syscall.SIGKILL) }

func (c *Cluster) halt(nodeID int32, sig syscall.Signal) error {
	c.mu.Lock()
	n := c.node(nodeID)
	if n == nil {
		c.mu.Unlock()
		return fmt.Errorf("kafkatest: no node %d", nodeID)
	}
	if !n.running() {
		c.mu.Unlock()
		return fmt.Errorf("kafkatest: node %d is not running", nodeID)
	}
	p := n.proc
	c.mu.Unlock()
	appendLog(n.log, fmt.Sprintf("kafkatest: sending %v to node %d", sig, nodeID))
	p.stop(sig, stopGrace)
	return nil
}

// Restart starts a stopped or killed node again with the same ports and
// directories, and waits until every running node lists it in its metadata.
func (c *Cluster) Restart(nodeID int32) error {
	c.mu.Lock()
	n := c.node(nodeID)
	switch {
	case c.closed:
		c.mu.Unlock()
		return errors.New("kafkatest: cluster is closed")
	case n == nil:
		c.mu.Unlock()
		return fmt.Errorf("kafkatest: no node %d", nodeID)
	case n.running():
		c.mu.Unlock()
		return fmt.Errorf("kafkatest: node %d is running; Stop or Kill it first", nodeID)
	}
	err := c.launch(n)
	var want []int32
	for _, m := range c.nodes {
		if m.running() {
			want = append(want, m.id)
		}
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kafkatest: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := c.waitReady(ctx, want, []*node{n}); err != nil {
		return fmt.Errorf("kafkatest: restarting node %d: %w\n%s", nodeID, err, c.LogTail(60))
	}
	return nil
}

// killAll SIGKILLs every node (and ZooKeeper) and waits for the exits.
func (c *Cluster) killAll() {
	c.mu.Lock()
	var ps []*process
	for _, n := range c.nodes {
		if n.proc != nil {
			ps = append(ps, n.proc)
		}
	}
	if c.zk != nil && c.zk.proc != nil {
		ps = append(ps, c.zk.proc)
	}
	c.mu.Unlock()
	for _, p := range ps {
		p.signal(syscall.SIGKILL)
	}
	for _, p := range ps {
		<-p.done
	}
}

// Close kills every node and removes the cluster's temporary directory. It
// is safe to call more than once.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		// 1. Refuse restarts, then kill every JVM and wait for it.
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.killAll()
		// 2. Forget the cluster in the process registry.
		procs.Lock()
		delete(procs.clusters, c)
		procs.Unlock()
		// 3. Remove the directory we created.
		if c.removeDir {
			c.closeErr = os.RemoveAll(c.dir)
		}
	})
	return c.closeErr
}

// LogTail returns the last lines of every node's log, each block labelled
// with its node.
func (c *Cluster) LogTail(lines int) string {
	var b strings.Builder
	type logFile struct{ label, path string }
	var logs []logFile
	if c.zk != nil {
		logs = append(logs, logFile{fmt.Sprintf("zookeeper (127.0.0.1:%d)", c.zk.port), c.zk.log})
	}
	for _, n := range c.nodes {
		logs = append(logs, logFile{fmt.Sprintf("node %d (%s)", n.id, n.addr()), n.log})
	}
	for _, n := range logs {
		fmt.Fprintf(&b, "---- %s %s ----\n", n.label, n.path)
		data, err := tailBytes(n.path, int64(lines)*300+4096)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
			continue
		}
		ls := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		for _, l := range ls {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// tailBytes reads at most the last max bytes of a file.
func tailBytes(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if off := st.Size() - max; off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(f)
}
