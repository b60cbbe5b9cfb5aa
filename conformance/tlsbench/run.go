package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/conformance/testpki"
)

const (
	topic          = "ferry-tlsbench"
	secureListener = "SECURE"
)

// mode is one way to the cluster.
type mode struct {
	name      string
	clientTLS bool // the client's connection is TLS (to Ferry, or to the broker)
	ferry     bool // through Ferry
	upTLS     bool // Ferry's connections to the brokers are TLS
	noSplice  bool // Ferry with splice_fetches: false
}

var allModes = []mode{
	{name: "direct"},
	{name: "direct-TLS", clientTLS: true},
	{name: "Ferry", ferry: true},
	{name: "Ferry-no-splice", ferry: true, noSplice: true},
	{name: "Ferry-TLS-client", ferry: true, clientTLS: true},
	{name: "Ferry-TLS-upstream", ferry: true, upTLS: true},
	{name: "Ferry-TLS-both", ferry: true, clientTLS: true, upTLS: true},
}

func modeNamed(name string) mode {
	for _, m := range allModes {
		if m.name == name {
			return m
		}
	}
	panic("tlsbench: no mode " + name)
}

// path is a mode set up: the client options and, through Ferry, its
// process and /metrics.
type path struct {
	mode
	opts    []kgo.Opt
	proc    *benchutil.Proc // nil for the direct paths
	metrics string          // Ferry's /metrics URL
}

// sample is one run: the load's result, with CPU the Ferry process's, and
// what the run cost elsewhere.
type sample struct {
	benchutil.RunResult
	brokerCPU time.Duration // the three broker JVMs together
	sent      float64       // ferry_client_bytes_sent_total over the run
	spliced   float64       // ferry_fetch_spliced_bytes_total over the run
	streamed  float64       // ferry_fetch_streamed_total over the run
}

// results is everything the report needs.
type results struct {
	opts     options
	command  string
	machine  benchutil.Machine
	loadEnd  string // load average at the end
	started  time.Time
	took     time.Duration
	produce  map[string][]sample
	consume  map[string][]sample
	consumeN int64
	tlsNote  map[string]string // negotiated TLS, by who answered
}

func run(ctx context.Context, o options, cmd string) error {
	res := &results{opts: o, command: cmd, machine: benchutil.ReadMachine(), started: time.Now(),
		produce: map[string][]sample{}, consume: map[string][]sample{}, tlsNote: map[string]string{}}
	vals := benchutil.Values(256, o.Size)

	dir, err := os.MkdirTemp("", "ferry-tlsbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ca, err := testpki.NewCA("ferry-tlsbench-ca")
	if err != nil {
		return err
	}
	caFile, err := ca.WriteFile(dir, "ca")
	if err != nil {
		return err
	}
	leaf, err := ca.Issue(testpki.LeafOptions{CommonName: "ferry", Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		return err
	}
	certFile, keyFile, err := leaf.WriteFiles(dir, "ferry")
	if err != nil {
		return err
	}
	clientTLS := &tls.Config{RootCAs: ca.Pool()}

	// Retention is checked every 10 s, so that the topic's bound
	// (benchutil.CreateTopic) holds while the produce runs write.
	cfg := kafkatest.Config{Brokers: 3, Name: "tlsbench", BrokerConfig: map[string]string{"log.retention.check.interval.ms": "10000"}}
	kafkatest.WithSecureListener(kafkatest.Secure{Name: secureListener, CA: ca})(&cfg)
	step("starting a 3-broker Kafka %s cluster with PLAINTEXT and SSL listeners", kafkatest.Version())
	cluster, err := benchutil.StartCluster(ctx, cfg, topic, o.Partitions)
	if err != nil {
		return err
	}
	defer benchutil.CloseCluster(cluster)
	var brokerPids []int
	for _, id := range cluster.NodeIDs() {
		brokerPids = append(brokerPids, cluster.Pid(id))
	}
	plainAddrs, tlsAddrs := cluster.Addrs(), cluster.ListenerAddrs(secureListener)
	res.tlsNote["broker (Java)"] = negotiated(tlsAddrs[0], clientTLS)

	bin := o.ferryBin
	if bin == "" {
		step("building ./cmd/ferry")
		if bin, err = benchutil.BuildFerry(ctx, dir); err != nil {
			return err
		}
	}
	var paths []path
	for _, name := range o.paths {
		m := modeNamed(name)
		p := path{mode: m, opts: baseOpts(plainAddrs)}
		switch {
		case !m.ferry && m.clientTLS:
			p.opts = append(baseOpts(tlsAddrs), kgo.DialTLSConfig(clientTLS))
		case m.ferry:
			var y strings.Builder
			if m.noSplice {
				y.WriteString("splice_fetches: false\n")
			}
			if m.clientTLS {
				fmt.Fprintf(&y, "tls: {cert_file: %q, key_file: %q}\n", certFile, keyFile)
			}
			up := plainAddrs
			if m.upTLS {
				up = tlsAddrs
			}
			fmt.Fprintf(&y, "clusters:\n  - name: primary\n    bootstrap: [%s]\n", strings.Join(up, ", "))
			if m.upTLS {
				fmt.Fprintf(&y, "    tls: {enabled: true, ca_file: %q}\n", caFile)
			}
			step("starting %s: `ferry serve`, log_level warn", m.name)
			f, metrics, err := startServe(ctx, bin, filepath.Join(dir, m.name+".yaml"), y.String(), len(plainAddrs))
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			defer func() {
				step("stopping %s", m.name)
				f.Stop()
			}()
			p.proc, p.metrics = f, metrics
			p.opts = baseOpts([]string{f.Addr})
			if m.clientTLS {
				p.opts = append(p.opts, kgo.DialTLSConfig(clientTLS))
				if _, ok := res.tlsNote["Ferry (Go)"]; !ok {
					res.tlsNote["Ferry (Go)"] = negotiated(f.Addr, clientTLS)
				}
			}
		}
		paths = append(paths, p)
	}

	// Warm-up: JIT in the brokers, connections, page cache.
	if o.Warmup > 0 {
		for _, p := range paths {
			step("warm-up: produce %s for %v", p.name, o.Warmup)
			if _, err := benchutil.Produce(ctx, p.opts, topic, vals, o.Warmup, 0); err != nil {
				return fmt.Errorf("warm-up %s: %w", p.name, err)
			}
		}
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, p := range paths {
			s, err := measure(p, brokerPids, func() (benchutil.RunResult, error) {
				return benchutil.Produce(ctx, p.opts, topic, vals, o.Duration, 0)
			})
			if err != nil {
				return fmt.Errorf("produce %s: %w", p.name, err)
			}
			res.produce[p.name] = append(res.produce[p.name], s)
			step("round %d/%d produce %-18s %7.1f MB/s%s", round, o.Rounds, p.name, s.MBps(), cpuNote(s))
		}
	}
	var produced int64
	for _, ss := range res.produce {
		for _, s := range ss {
			produced += s.Records
		}
	}
	res.consumeN = min(o.Records, produced)
	if o.Warmup > 0 {
		for _, p := range paths {
			step("warm-up: consume %s", p.name)
			if _, err := benchutil.Consume(ctx, p.opts, topic, o.Partitions, res.consumeN/4); err != nil {
				return fmt.Errorf("warm-up consume %s: %w", p.name, err)
			}
		}
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, p := range paths {
			s, err := measure(p, brokerPids, func() (benchutil.RunResult, error) {
				return benchutil.Consume(ctx, p.opts, topic, o.Partitions, res.consumeN)
			})
			if err != nil {
				return fmt.Errorf("consume %s: %w", p.name, err)
			}
			res.consume[p.name] = append(res.consume[p.name], s)
			note := cpuNote(s)
			if p.ferry {
				note += fmt.Sprintf("  spliced %.0f%% of bytes sent", 100*s.spliced/max(s.sent, 1))
			}
			step("round %d/%d consume %-18s %7.1f MB/s%s", round, o.Rounds, p.name, s.MBps(), note)
		}
	}
	res.took = time.Since(res.started)
	res.loadEnd = benchutil.ReadMachine().Load

	rep := report(res)
	return benchutil.Publish(rep.text, rep.markdown, o.out, writeReport)
}

func baseOpts(addrs []string) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ProducerBatchCompression(kgo.Lz4Compression())}
}

// measure runs f and charges it the CPU time of the path's Ferry and of
// the brokers, and Ferry's counters.
func measure(p path, brokerPids []int, f func() (benchutil.RunResult, error)) (sample, error) {
	var s sample
	brokers := func() (time.Duration, error) {
		var sum time.Duration
		for _, pid := range brokerPids {
			d, err := benchutil.PidCPU(pid)
			if err != nil {
				return 0, err
			}
			sum += d
		}
		return sum, nil
	}
	var ferryBefore time.Duration
	var mBefore map[string]float64
	if p.proc != nil {
		var err error
		if ferryBefore, err = p.proc.CPU(); err != nil {
			return s, err
		}
		if mBefore, err = scrape(p.metrics); err != nil {
			return s, err
		}
	}
	bBefore, err := brokers()
	if err != nil {
		return s, err
	}
	if s.RunResult, err = f(); err != nil {
		return s, err
	}
	bAfter, err := brokers()
	if err != nil {
		return s, err
	}
	s.brokerCPU = bAfter - bBefore
	if p.proc == nil {
		return s, nil
	}
	after, err := p.proc.CPU()
	if err != nil {
		return s, err
	}
	s.CPU = after - ferryBefore
	mAfter, err := scrape(p.metrics)
	if err != nil {
		return s, err
	}
	s.sent = mAfter[metricSent] - mBefore[metricSent]
	s.spliced = mAfter[metricSpliced] - mBefore[metricSpliced]
	s.streamed = mAfter[metricStreamed] - mBefore[metricStreamed]
	return s, nil
}

// Ferry's counters read from /metrics.
const (
	metricSent     = "ferry_client_bytes_sent_total"
	metricSpliced  = "ferry_fetch_spliced_bytes_total"
	metricStreamed = "ferry_fetch_streamed_total"
)

// scrape reads the counters above from a Prometheus text exposition.
func scrape(url string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch name {
		case metricSent, metricSpliced, metricStreamed:
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", url, sc.Text(), err)
			}
			out[name] = f
		}
	}
	return out, sc.Err()
}

// startServe runs bin as `ferry serve` with the configuration file at file:
// a listen port (and lanes after it), an admin port and extra (tls: and
// clusters:); it waits until /readyz answers 200 and returns the process
// and the URL of its /metrics.
func startServe(ctx context.Context, bin, file, extra string, lanes int) (*benchutil.Proc, string, error) {
	base, err := benchutil.FreePortRun(lanes)
	if err != nil {
		return nil, "", err
	}
	admin, err := benchutil.FreePorts(1)
	if err != nil {
		return nil, "", err
	}
	if admin[0] >= base && admin[0] < base+lanes {
		return nil, "", fmt.Errorf("admin port %d among the lanes' %d..%d", admin[0], base, base+lanes-1)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(base))
	adminAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(admin[0]))
	y := fmt.Sprintf("cluster_id: ferry-tlsbench\nlisten: %s\nadmin_listen: %s\nlog_level: warn\nlanes: %d\n%s", addr, adminAddr, lanes, extra)
	if err := os.WriteFile(file, []byte(y), 0o644); err != nil {
		return nil, "", err
	}
	f, err := benchutil.Launch(exec.Command(bin, "serve", "--config", file), addr)
	if err != nil {
		return nil, "", err
	}
	return f, "http://" + adminAddr + "/metrics", f.WaitReady(ctx, benchutil.HTTPReady("http://"+adminAddr+"/readyz"))
}

// negotiated is the TLS version and cipher suite a Go client with cfg
// gets from addr.
func negotiated(addr string, cfg *tls.Config) string {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "handshake failed: " + err.Error()
	}
	defer c.Close()
	st := c.ConnectionState()
	return tls.VersionName(st.Version) + " " + tls.CipherSuiteName(st.CipherSuite)
}

var step = benchutil.Step

func cpuNote(s sample) string {
	n := fmt.Sprintf("  brokers %.1fs", s.brokerCPU.Seconds())
	if s.CPU > 0 {
		n = fmt.Sprintf("  Ferry CPU %.1fs", s.CPU.Seconds()) + n
	}
	return n
}
