package kafkatest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// zkStartTimeout bounds the wait for ZooKeeper to accept connections.
const zkStartTimeout = 60 * time.Second

// zkNode is a ZooKeeper-mode cluster's ZooKeeper: one standalone server
// (ZooKeeperServerMain, from the ZooKeeper jars the broker version
// brings) on a loopback port, in its own directory, under the same process
// rules as the broker JVMs (own process group, parent-death signal, the
// orphan marker), killed with the cluster.
type zkNode struct {
	port  int
	dir   string
	props string
	log   string
	proc  *process
}

func (z *zkNode) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(z.port)) }

// startZooKeeper writes ZooKeeper's configuration, starts it and waits
// until it accepts connections.
func (c *Cluster) startZooKeeper(attempt int) error {
	z := c.zk
	if err := os.RemoveAll(z.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(z.dir, 0o755); err != nil {
		return err
	}
	cfg := strings.Join([]string{
		"dataDir=" + z.dir,
		"clientPort=" + strconv.Itoa(z.port),
		"clientPortAddress=127.0.0.1",
		"tickTime=2000",
		"maxClientCnxns=0",
		// Its admin HTTP server would take port 8080.
		"admin.enableServer=false",
	}, "\n") + "\n"
	if err := os.WriteFile(z.props, []byte(cfg), 0o644); err != nil {
		return err
	}
	appendLog(z.log, fmt.Sprintf("kafkatest: attempt %d: zookeeper %s", attempt, z.addr()))
	f, err := os.OpenFile(z.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	args := append(baseJVMArgs(c.owner), "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dzookeeper.admin.enableServer=false")
	args = append(args, c.log4jArgs()...)
	args = append(args, "-Dferry.kafkatest.node="+c.cfg.Name+"/zookeeper",
		"-cp", c.jars+"/*", "org.apache.zookeeper.server.ZooKeeperServerMain", z.props)
	cmd := exec.Command("java", args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = f, f
	c.mu.Lock()
	p, err := startProcess(cmd)
	if err == nil {
		z.proc = p
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("zookeeper: starting java: %w", err)
	}
	deadline := time.Now().Add(zkStartTimeout)
	for {
		if p.exited() {
			err := fmt.Errorf("zookeeper exited during startup: %v", p.err)
			if b, rerr := tailBytes(z.log, 64<<10); rerr == nil && strings.Contains(string(b), "Address already in use") {
				return fmt.Errorf("%w: %w", errBindClash, err)
			}
			return err
		}
		conn, err := net.DialTimeout("tcp", z.addr(), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("zookeeper at %s not accepting connections after %v: %w", z.addr(), zkStartTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// readClusterID asks a broker for the cluster ID.
func (c *Cluster) readClusterID(ctx context.Context) (string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return "", fmt.Errorf("reading the cluster ID: %w", err)
	}
	if resp.ClusterID == nil || *resp.ClusterID == "" {
		return "", fmt.Errorf("metadata names no cluster ID")
	}
	return *resp.ClusterID, nil
}

// log4jProperties configures log4j 1 (Kafka before 4.0, ZooKeeper): INFO to
// stdout, which is the node's log file.
const log4jProperties = `log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.zookeeper=WARN
`

func (c *Cluster) log4jProps() string { return filepath.Join(c.dir, "log4j.properties") }

// log4jArgs point log4j 1 at the cluster's configuration, for versions
// that use it.
func (c *Cluster) log4jArgs() []string {
	if c.cfg.Version == kafkaVersion && c.zk == nil {
		return nil
	}
	return []string{"-Dlog4j.configuration=file:" + c.log4jProps()}
}
