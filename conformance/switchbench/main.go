// Command switchbench measures Ferry's switchover on real Apache Kafka
// (issue 8 §8): `make bench-switchover`.
//
// It starts two 1-broker KRaft clusters (conformance/kafkatest; the harness
// sets group.initial.rebalance.delay.ms=0, as a production cluster with few
// group members effectively has after the first join), builds cmd/ferry and
// runs `ferry serve` in front of them with the mirror on, then:
//
//  1. consume: -consume-bytes of 1 KiB records are produced through Ferry
//     into a topic of -partitions partitions; once mirrored, a fresh
//     franz-go consumer reads all of it through Ferry, -rounds times under
//     generation 0 (nothing to rewrite), then once more -rounds times after a
//     planned switch (generation 1: every batch's leader epoch rewritten,
//     fillers dropped). MB/s = record value bytes (10^6) over the read.
//  2. planned: an idempotent franz-go producer writes -rate records/s and
//     -groups consumer groups read them, through Ferry, continuously. With
//     the mirror caught up, POST /switchover (planned) to the other cluster,
//     -rounds times, alternating. Measured from the call: its answer; the
//     first produce acknowledged by the new active cluster (an ack at an
//     offset at or above the old cluster's end, read directly after the
//     switch); and every group consuming again (each group's first record
//     at or above that end).
//  3. forced: mode forced (the old cluster stays up). The producer pauses
//     until the mirror has everything, so nothing is lost and the mirror
//     the other way finds both clusters equal, and resumes when the switch
//     answers: call → first acknowledgement of a record produced after it.
//
// Medians of -rounds with min and max are printed, with the floors; -out
// writes them as markdown.
//
//	go run ./conformance/switchbench -out docs/SWITCHOVER-BENCHMARKS.md
//
// With -automatic, automatic failover instead (automatic.go): the active
// cluster's broker killed under traffic, each round on fresh clusters.
//
// With -shapes the switches are measured as the clusters grow, with the
// member's memory, idle CPU and Metadata time at each size (scale.go,
// `make bench-scale`).
// With -fake as well, the two clusters are in-process kfake clusters
// (fake.go): the member's own costs at shapes past what real brokers hold
// here (100,000 partitions).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

type options struct {
	rounds       int
	groups       int
	partitions   int
	rate         int
	consumeBytes int64
	out          string
	shapes       []shape // the scale mode (scale.go)
	idleConns    int     // the scale mode: idle client connections opened at the first shape
	profileDir   string  // the scale mode: the member's heap and idle CPU profiles per shape
	catchUpBytes int64   // the scale mode: the backlog the mirror copies in each catch-up round (catchup.go)
	// syncInterval is the member's mirror.sync_interval (0: 1 s in the
	// switch mode, so a forced switch's groups re-read at most a second's
	// commits; Ferry's default in the scale mode, whose idle CPU it sets).
	syncInterval time.Duration
	// rtt: the member reaches the standby through a relay adding this
	// round-trip time (a standby a region away); the bench itself reads
	// the standby directly.
	rtt      time.Duration
	logLevel string // the member's log_level
	// brokerHeap is each broker's -Xmx (and -Xms). The harness's 512 MiB
	// fits the tests' shapes; 10,000 partitions and their writers' 50,000
	// transactional IDs held a 512 MiB broker heap 80-90% full, so the
	// scale mode measured the brokers' collector. Production brokers at
	// that size run with several GiB.
	brokerHeap string
	// automatic: measure automatic failover instead (automatic.go), each
	// of -rounds on fresh clusters, with failover.after failoverAfter.
	automatic     bool
	failoverAfter time.Duration
	// ferryBin is a prebuilt ferry binary to run instead of building
	// cmd/ferry (an older build, to compare with in turn).
	ferryBin string
	// brokerConfig are server.properties entries set on every broker of
	// both clusters (an operator's setting, e.g.
	// socket.listen.backlog.size), named in the report.
	brokerConfig map[string]string
	// fake: the two clusters are kfake clusters in this process (fake.go)
	// instead of real brokers, for shapes past what this machine's
	// brokers hold: the member's own per-partition costs.
	fake bool
	// mirrorExclude is the member's mirror.topics.exclude (a regular
	// expression; "": none): with -fake, shapes whose idle topics are
	// served but not mirrored.
	mirrorExclude string
}

func main() {
	var o options
	var cb, cub string
	fs := flag.NewFlagSet("switchbench", flag.ExitOnError)
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary to run as the member (default: build ./cmd/ferry)")
	fs.IntVar(&o.rounds, "rounds", 5, "switches measured per kind (medians of this many)")
	fs.IntVar(&o.groups, "groups", 3, "consumer groups reading through Ferry during the switches")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of each benchmark topic")
	fs.IntVar(&o.rate, "rate", 1000, "records/s the producer writes during the switches")
	fs.StringVar(&cb, "consume-bytes", "256MiB", "record value bytes read in each consume round (KiB, MiB, GiB)")
	fs.StringVar(&o.out, "out", "", "write the results as markdown to this file")
	fs.IntVar(&o.idleConns, "idle-conns", 0, "the scale mode: open this many idle client connections at the first shape and read the member's memory per connection")
	fs.StringVar(&o.profileDir, "profile-dir", "", "the scale mode: save the member's heap profile and a CPU profile of its idle period at each shape here (go tool pprof)")
	fs.DurationVar(&o.rtt, "rtt", 0, "the member reaches the standby through a relay adding this round-trip time (e.g. 50ms: a standby a region away)")
	fs.StringVar(&cub, "catchup-bytes", "512MiB", "the scale mode: record value bytes of the backlog the mirror copies in each catch-up round, spread over a tenth of the shape's partitions (0: none)")
	fs.StringVar(&o.logLevel, "log-level", "warn", "the member's log_level (its log: $TMPDIR/switchbench-ferry.log)")
	fs.DurationVar(&o.syncInterval, "sync-interval", 0, "the member's mirror.sync_interval (default: 1s in the switch mode, Ferry's default in the scale mode)")
	fs.StringVar(&o.brokerHeap, "broker-heap", "", "each broker's JVM heap, e.g. 2g (default: 2g in the scale mode, the harness's 512m in the switch mode)")
	fs.BoolVar(&o.automatic, "automatic", false, "measure automatic failover: the active cluster's broker killed under traffic, -rounds times on fresh clusters (automatic.go)")
	fs.DurationVar(&o.failoverAfter, "failover-after", 5*time.Second, "with -automatic, the member's failover.after")
	brokerConfig := fs.String("broker-config", "", "server.properties entries set on every broker of both clusters, KEY=VALUE,... (e.g. socket.listen.backlog.size=1024)")
	fs.BoolVar(&o.fake, "fake", false, "the scale mode: the two clusters are in-process kfake clusters (franz-go's fake Kafka, one broker each) instead of real brokers, for shapes past what this machine's brokers hold (100000 partitions): the member's own memory, idle CPU, Metadata and switch steps per partition, not a broker's (fake.go)")
	fs.StringVar(&o.mirrorExclude, "mirror-exclude", "", "the member's mirror.topics.exclude, a regular expression (e.g. 'scale-.*': the idle topics served through the member but not mirrored, the switch copying only the traffic topic)")
	shapes := fs.String("shapes", "", "the scale mode: PARTITIONSxGROUPS,... (e.g. 100x10,1000x100,10000x1000), each shape growing the last (scale.go); -consume-bytes 0 skips the consume rounds")
	fs.Parse(os.Args[1:])
	if *shapes != "" {
		var err error
		if o.shapes, err = parseShapes(*shapes); err != nil {
			fmt.Fprintln(os.Stderr, "switchbench: -shapes:", err)
			os.Exit(2)
		}
	}
	if *brokerConfig != "" {
		o.brokerConfig = map[string]string{}
		for _, kv := range strings.Split(*brokerConfig, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				fmt.Fprintf(os.Stderr, "switchbench: -broker-config: %q is not KEY=VALUE\n", kv)
				os.Exit(2)
			}
			o.brokerConfig[k] = v
		}
	}
	n, err := benchutil.ParseBytes(cb)
	if err != nil {
		fmt.Fprintln(os.Stderr, "switchbench: -consume-bytes:", err)
		os.Exit(2)
	}
	o.consumeBytes = n
	if o.catchUpBytes, err = benchutil.ParseBytes(cub); err != nil {
		fmt.Fprintln(os.Stderr, "switchbench: -catchup-bytes:", err)
		os.Exit(2)
	}
	if o.syncInterval == 0 && len(o.shapes) == 0 {
		o.syncInterval = time.Second
	}
	if o.fake && (len(o.shapes) == 0 || o.automatic || o.rtt > 0) {
		fmt.Fprintln(os.Stderr, "switchbench: -fake measures -shapes only (not -automatic or -rtt)")
		os.Exit(2)
	}
	if o.brokerHeap == "" && len(o.shapes) > 0 {
		o.brokerHeap = "2g"
	}
	benchutil.Run("switchbench", "Ferry and Kafka", func(ctx context.Context) error { return run(ctx, o) })
}

// step logs one line of progress.
var step = benchutil.Step

// bench is one run: the clusters, Ferry, and what it measured.
type bench struct {
	o            options
	clusters     map[string]cluster
	active       string
	addr, admin  string
	consume      map[int][]float64 // generation → MB/s per round
	planned      map[string][]time.Duration
	forced       []time.Duration
	forcedAnswer []time.Duration
	// reread is, per planned switch, the most records any group read
	// again, and during the records produced while it ran.
	reread, during []int
	lastSteps      string // the last switch's steps, as it answered them
	ferryPID       int
	standbyAddr    string         // the standby's bootstrap as the member has it (through the relay with -rtt)
	shapes         []*shapeResult // the scale mode's
	lastGroups     string         // the last planned switch's time to each group consuming
	idleConns      *idleConnsResult
}

func run(ctx context.Context, o options) error {
	if o.automatic {
		return runAutomatic(ctx, o)
	}
	b := &bench{o: o, active: "primary", consume: map[int][]float64{}, planned: map[string][]time.Duration{}}
	if o.fake {
		step("starting two in-process kfake clusters (primary, standby)")
		var err error
		if b.clusters, err = startFakeClusters("primary", "standby"); err != nil {
			return err
		}
		b.standbyAddr = b.clusters["standby"].Bootstrap()
	} else {
		closeReal, err := b.startRealClusters(o)
		if err != nil {
			return err
		}
		defer closeReal()
	}
	defer closeClusters(b.clusters)
	dir, err := os.MkdirTemp("", "switchbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	step("building and starting ferry serve")
	stop, err := b.startFerry(ctx, dir)
	if err != nil {
		return err
	}
	defer stop()

	if b.o.consumeBytes > 0 {
		if err := b.measureConsume(ctx); err != nil {
			return fmt.Errorf("consume: %w", err)
		}
	}
	if len(b.o.shapes) > 0 {
		if err := b.measureShapes(ctx, b.o.shapes); err != nil {
			return fmt.Errorf("shapes: %w", err)
		}
		return b.reportShapes(os.Stdout)
	}
	if err := b.measureSwitches(ctx); err != nil {
		return fmt.Errorf("switches: %w", err)
	}
	return b.report(os.Stdout)
}

// startRealClusters starts the two 1-broker Kafka clusters (with -rtt, the
// standby behind a delaying relay) and returns what closes the relay.
func (b *bench) startRealClusters(o options) (func(), error) {
	heapNote := ""
	if o.brokerHeap != "" {
		heapNote = ", heap " + o.brokerHeap
	}
	step("starting two 1-broker Kafka %s clusters (primary, standby%s)", kafkatest.Version(), heapNote)
	var err error
	var relay *benchutil.DelayRelay
	closeRelay := func() {
		if relay != nil {
			relay.Close()
		}
	}
	// broker applies -broker-heap and -broker-config to a cluster.
	broker := func(c *kafkatest.Config) {
		if o.brokerHeap != "" {
			c.JVMArgs = append(c.JVMArgs, "-Xms"+o.brokerHeap, "-Xmx"+o.brokerHeap)
		}
		for k, v := range o.brokerConfig {
			if c.BrokerConfig == nil {
				c.BrokerConfig = map[string]string{}
			}
			c.BrokerConfig[k] = v
		}
	}
	adjust := func(_ string, c *kafkatest.Config) { broker(c) }
	if o.rtt > 0 {
		// The standby also listens behind the relay
		// (benchutil.DelayedListener): the member, bootstrapped there,
		// reaches it only through it.
		if relay, err = benchutil.ListenDelayRelay(o.rtt); err != nil {
			return nil, err
		}
		adjust = func(name string, c *kafkatest.Config) {
			broker(c)
			if name == "standby" {
				c.Listeners = []kafkatest.Listener{relay.Listener()}
			}
		}
	}
	real, err := benchutil.StartClustersWith("switchbench-", adjust, "primary", "standby")
	if err != nil {
		closeRelay()
		return nil, err
	}
	b.clusters = realClusters(real)
	b.standbyAddr = real["standby"].Bootstrap()
	if relay != nil {
		relay.ServeCluster(real["standby"])
		b.standbyAddr = relay.Addr()
		step("the member reaches the standby through a relay adding %v round trip", o.rtt)
	}
	return closeRelay, nil
}

func (b *bench) startFerry(ctx context.Context, dir string) (func(), error) {
	bin := b.o.ferryBin
	if bin == "" {
		var err error
		if bin, err = benchutil.BuildFerry(ctx, dir); err != nil {
			return nil, err
		}
	}
	ports, err := benchutil.FreePorts(2)
	if err != nil {
		return nil, err
	}
	b.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	b.admin = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	cfg := fmt.Sprintf(`cluster_id: ferry-switchbench
listen: %s
admin_listen: %s
log_level: %s
clusters:
  - {name: primary, bootstrap: [%s]}
  - {name: standby, bootstrap: [%s]}
`, b.addr, b.admin, b.o.logLevel, b.clusters["primary"].Bootstrap(), b.standbyAddr)
	if b.o.syncInterval > 0 || b.o.mirrorExclude != "" {
		cfg += "mirror:\n"
		if b.o.syncInterval > 0 {
			cfg += fmt.Sprintf("  sync_interval: %v\n", b.o.syncInterval)
		}
		if b.o.mirrorExclude != "" {
			cfg += fmt.Sprintf("  topics: {exclude: [%q]}\n", b.o.mirrorExclude)
		}
	}
	if b.o.automatic {
		cfg += fmt.Sprintf("failover: {automatic: true, after: %v, max_loss: {records: 1000000}, min_interval: 1s}\n", b.o.failoverAfter)
	}
	file := filepath.Join(dir, "ferry.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(os.TempDir(), "switchbench-ferry.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "--config", file)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b.ferryPID = cmd.Process.Pid
	stop := func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get("http://" + b.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return stop, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, fmt.Errorf("ferry not ready after 2 minutes (log: %s)", logf.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *bench) client(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.addr)}, opts...)...)
}

func (b *bench) createTopic(ctx context.Context, topic string) error {
	cl, err := b.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(b.o.partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	return err
}

// waitCaughtUp polls /status until the mirror has at least minPartitions
// partitions and every one lags by at most maxLag records (under
// continuous traffic the lag at one instant is rarely 0: "caught up" is
// the steady state, not an empty pipe). The count matters while topics
// are being created: the mirror learns of new ones at its next sync, and
// until then what it has is all caught up.
func (b *bench) waitCaughtUp(ctx context.Context, maxLag int64, minPartitions int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var st struct {
			Mirror struct {
				Running    bool `json:"running"`
				Partitions []struct {
					State string `json:"state"`
					Lag   int64  `json:"lag_records"`
				} `json:"partitions"`
			} `json:"mirror"`
		}
		resp, err := http.Get("http://" + b.admin + "/status")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
		}
		ok := err == nil && st.Mirror.Running && len(st.Mirror.Partitions) > 0 && len(st.Mirror.Partitions) >= minPartitions
		for _, p := range st.Mirror.Partitions {
			// A writer still starting (after a switch, every partition's
			// writer starts again in the other direction) has no lag
			// yet: it is not caught up.
			ok = ok && p.Lag <= maxLag && p.State != "halted" && p.State != "starting"
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			states := map[string]int{}
			var worst int64
			for _, p := range st.Mirror.Partitions {
				states[p.State]++
				worst = max(worst, p.Lag)
			}
			return fmt.Errorf("mirror not caught up: running %v, %d partitions (want %d) by state %v, the most lag %d records (%v)", st.Mirror.Running, len(st.Mirror.Partitions), minPartitions, states, worst, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMirrored waits until the other cluster holds every offset of topic
// the active cluster holds, both read directly. (The mirror's own lag,
// in /status, is against source ends listed once a second: a forced
// switch called on it could lose the last second's records.)
func (b *bench) waitMirrored(ctx context.Context, topic string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		want, err := endOffsets(ctx, b.clusters[b.active], topic)
		var have map[int32]int64
		if err == nil {
			have, err = endOffsets(ctx, b.clusters[b.other()], topic)
		}
		behind := 0
		for p, o := range want {
			if have[p] < o {
				behind++
			}
		}
		if err == nil && behind == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not mirrored to %s: %d partitions behind (%v)", topic, b.other(), behind, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// switchTo asks for a switch and returns how long the answer took. The
// switch's own steps, as it reports them, are kept in b.lastSteps.
func (b *bench) switchTo(ctx context.Context, to, mode string) (time.Duration, error) {
	body, _ := json.Marshal(map[string]string{"to": to, "mode": mode, "timeout": "60s"})
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+b.admin+"/switchover", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	took := time.Since(start)
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("switch to %s (%s): %d %s", to, mode, resp.StatusCode, out)
	}
	b.active = to
	var st struct {
		LastSwitch struct {
			Steps []struct {
				Step string `json:"step"`
				Took string `json:"took"`
			} `json:"steps"`
		} `json:"last_switch"`
	}
	b.lastSteps = ""
	if json.Unmarshal(out, &st) == nil {
		var steps []string
		for _, s := range st.LastSwitch.Steps {
			steps = append(steps, s.Step+" "+s.Took)
		}
		b.lastSteps = strings.Join(steps, ", ")
	}
	return took, nil
}

func (b *bench) other() string {
	if b.active == "primary" {
		return "standby"
	}
	return "primary"
}

func (b *bench) measureConsume(ctx context.Context) error {
	const topic = "switchbench-consume"
	if err := b.createTopic(ctx, topic); err != nil {
		return err
	}
	n := int(b.o.consumeBytes / 1024)
	step("consume: producing %d records of 1 KiB through Ferry", n)
	prod, err := b.client(kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(1<<20))
	if err != nil {
		return err
	}
	values := benchutil.Values(256, 1024)
	var perr error
	var pmu sync.Mutex
	for i := range n {
		prod.Produce(ctx, &kgo.Record{Value: values[i%len(values)]}, func(_ *kgo.Record, err error) {
			if err != nil {
				pmu.Lock()
				perr = err
				pmu.Unlock()
			}
		})
	}
	if err := prod.Flush(ctx); err != nil {
		return err
	}
	prod.Close()
	if perr != nil {
		return perr
	}
	if err := b.waitCaughtUp(ctx, 0, 0); err != nil {
		return err
	}
	read := func(gen int) error {
		for r := range b.o.rounds {
			cl, err := b.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20))
			if err != nil {
				return err
			}
			var got, size int
			start := time.Now()
			for got < n {
				fs := cl.PollFetches(ctx)
				if ctx.Err() != nil {
					cl.Close()
					return ctx.Err()
				}
				fs.EachRecord(func(rec *kgo.Record) { got++; size += len(rec.Value) })
			}
			mbs := float64(size) / 1e6 / time.Since(start).Seconds()
			cl.Close()
			b.consume[gen] = append(b.consume[gen], mbs)
			step("consume: generation %d round %d: %.1f MB/s", gen, r+1, mbs)
		}
		return nil
	}
	if err := read(0); err != nil {
		return err
	}
	if _, err := b.switchTo(ctx, b.other(), "planned"); err != nil {
		return err
	}
	return read(1)
}

// event is an ack or a received record.
type event struct {
	at        time.Time
	partition int32
	offset    int64
	sent      time.Time // when the acknowledged record was produced
}

type recorder struct {
	mu     sync.Mutex
	events []event
	errs   int
}

func (r *recorder) add(e event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// first returns the time of the first event after t0 at or above ends.
func (r *recorder) first(t0 time.Time, ends map[int32]int64) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best time.Time
	for _, e := range r.events {
		if e.at.After(t0) && e.offset >= ends[e.partition] && (best.IsZero() || e.at.Before(best)) {
			best = e.at
		}
	}
	return best, !best.IsZero()
}

// readAgain counts the events after t0 and before t1 (zero: no end) at an
// offset already read before them: records a group read again.
func (r *recorder) readAgain(t0, t1 time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[int32]map[int64]bool{}
	n := 0
	for _, e := range r.events {
		if seen[e.partition] == nil {
			seen[e.partition] = map[int64]bool{}
		}
		if seen[e.partition][e.offset] && e.at.After(t0) && (t1.IsZero() || e.at.Before(t1)) {
			n++
		}
		seen[e.partition][e.offset] = true
	}
	return n
}

// sentBetween counts the acknowledged records produced after t0 and before t1.
func (r *recorder) sentBetween(t0, t1 time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.sent.After(t0) && e.sent.Before(t1) {
			n++
		}
	}
	return n
}

// firstSent returns the time of the first ack of a record produced at or
// after t.
func (r *recorder) firstSent(t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best time.Time
	for _, e := range r.events {
		if !e.sent.Before(t) && (best.IsZero() || e.at.Before(best)) {
			best = e.at
		}
	}
	return best, !best.IsZero()
}

// traffic is what runs through Ferry during the switches: an idempotent
// producer at -rate records/s and -groups consumer groups, on one topic.
type traffic struct {
	topic  string
	prod   *kgo.Client
	acks   *recorder
	groups []*recorder
	kip848 bool // odd groups use KIP-848
	paused atomic.Bool
}

// groupKind names group i's protocol.
func (tr *traffic) groupKind(i int) string {
	if tr.kip848 && i%2 == 1 {
		return "KIP-848"
	}
	return "classic"
}

// startTraffic starts the traffic on a new topic; stop ends it.
func (b *bench) startTraffic(ctx context.Context, topic string) (tr *traffic, stop func(), err error) {
	if err := b.createTopic(ctx, topic); err != nil {
		return nil, nil, err
	}
	// The traffic's goroutines end when tctx does: cancel, then wait.
	tctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var closers []func()
	stop = func() {
		cancel()
		wg.Wait()
		for _, c := range closers {
			c()
		}
	}
	tr = &traffic{topic: topic, acks: &recorder{}, kip848: len(b.o.shapes) > 0} // the scale mode's groups are half KIP-848
	if tr.prod, err = b.client(kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(time.Millisecond), kgo.RecordDeliveryTimeout(2*time.Minute)); err != nil {
		stop()
		return nil, nil, err
	}
	closers = append(closers, tr.prod.Close)
	wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(b.o.rate))
		defer tick.Stop()
		for tctx.Err() == nil {
			<-tick.C
			if tr.paused.Load() {
				continue
			}
			sent := time.Now()
			tr.prod.Produce(tctx, &kgo.Record{Value: []byte("switchbench")}, func(r *kgo.Record, err error) {
				if err != nil {
					if tctx.Err() == nil {
						tr.acks.mu.Lock()
						tr.acks.errs++
						tr.acks.mu.Unlock()
					}
					return
				}
				tr.acks.add(event{time.Now(), r.Partition, r.Offset, sent})
			})
		}
	})
	tr.groups = make([]*recorder, b.o.groups)
	for g := range tr.groups {
		tr.groups[g] = &recorder{}
		opts := []kgo.Opt{kgo.ConsumeTopics(topic), kgo.ConsumerGroup(fmt.Sprintf("switchbench-%d", g)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
		if tr.kip848 && g%2 == 1 {
			opts = append(opts, kgo.ServerSideBalancer())
		}
		cl, err := b.client(opts...)
		if err != nil {
			stop()
			return nil, nil, err
		}
		closers = append(closers, cl.Close)
		wg.Go(func() {
			for tctx.Err() == nil {
				fs := cl.PollFetches(tctx)
				now := time.Now()
				fs.EachRecord(func(r *kgo.Record) { tr.groups[g].add(event{at: now, partition: r.Partition, offset: r.Offset}) })
			}
		})
	}
	time.Sleep(3 * time.Second) // groups joined, traffic flowing
	return tr, stop, nil
}

// errs is how many produces failed.
func (tr *traffic) errs() int {
	tr.acks.mu.Lock()
	defer tr.acks.mu.Unlock()
	return tr.acks.errs
}

// plannedSwitch runs one planned switch to the other cluster under the traffic:
// its call, and from the call its answer, the first produce acknowledged by
// the new active cluster and every group consuming again.
func (b *bench) plannedSwitch(ctx context.Context, tr *traffic) (call time.Time, answer, firstAck, allGroups time.Duration, err error) {
	if err := b.waitCaughtUp(ctx, int64(b.o.rate/10), 0); err != nil {
		return call, 0, 0, 0, err
	}
	left := b.active
	call = time.Now()
	answer, err = b.switchTo(ctx, b.other(), "planned")
	if err != nil {
		return call, 0, 0, 0, err
	}
	ends, err := endOffsets(ctx, b.clusters[left], tr.topic)
	if err != nil {
		return call, 0, 0, 0, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		a, ok := tr.acks.first(call, ends)
		all := ok
		var last time.Time
		var each []string
		for i, g := range tr.groups {
			t, gok := g.first(call, ends)
			all = all && gok
			if t.After(last) {
				last = t
			}
			each = append(each, fmt.Sprintf("%s %v", tr.groupKind(i), t.Sub(call).Round(time.Millisecond)))
		}
		if all {
			b.lastGroups = strings.Join(each, ", ")
			return call, answer, a.Sub(call), last.Sub(call), nil
		}
		if time.Now().After(deadline) {
			return call, 0, 0, 0, fmt.Errorf("planned switch to %s: no ack or group back within a minute of the call", b.active)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// forcedSwitch runs one forced switch to the other cluster. The producer pauses
// until the mirror has everything (so the switch loses nothing and the
// mirror the other way finds the clusters identical), and resumes once the
// switch has answered, as producers retrying against a dead cluster would:
// measured is the call to the first acknowledgement of a record produced
// after it.
func (b *bench) forcedSwitch(ctx context.Context, tr *traffic) (answer, firstAck time.Duration, err error) {
	tr.paused.Store(true)
	defer tr.paused.Store(false)
	if err := tr.prod.Flush(ctx); err != nil {
		return 0, 0, err
	}
	if err := b.waitMirrored(ctx, tr.topic); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if answer, err = b.switchTo(ctx, b.other(), "forced"); err != nil {
		return 0, 0, err
	}
	resumed := time.Now()
	tr.paused.Store(false)
	deadline := time.Now().Add(time.Minute)
	for {
		if a, ok := tr.acks.firstSent(resumed); ok {
			return answer, a.Sub(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("forced switch to %s: no ack within a minute", b.active)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (b *bench) measureSwitches(ctx context.Context) error {
	tr, stop, err := b.startTraffic(ctx, "switchbench-traffic")
	if err != nil {
		return err
	}
	defer stop()
	var starts []time.Time // each planned switch's call
	for r := range b.o.rounds {
		call, answer, ack, grp, err := b.plannedSwitch(ctx, tr)
		if err != nil {
			return err
		}
		starts = append(starts, call)
		b.during = append(b.during, tr.acks.sentBetween(call, call.Add(answer)))
		b.planned["answer"] = append(b.planned["answer"], answer)
		b.planned["ack"] = append(b.planned["ack"], ack)
		b.planned["groups"] = append(b.planned["groups"], grp)
		step("planned %d → %s: answer %v, first ack %v, every group consuming %v (steps: %s)", r+1, b.active, answer, ack, grp, b.lastSteps)
		time.Sleep(2 * time.Second)
	}
	// Records each group read again after each planned switch (until the
	// next one), against the records produced while it ran: what a group
	// can have read and not committed when it moves. Read once the last
	// round's reads have settled.
	time.Sleep(3 * time.Second)
	for r, t0 := range starts {
		var t1 time.Time
		if r+1 < len(starts) {
			t1 = starts[r+1]
		}
		worst := 0
		for _, g := range tr.groups {
			worst = max(worst, g.readAgain(t0, t1))
		}
		b.reread = append(b.reread, worst)
		step("planned %d: the most any group read again %d, records produced while it ran %d", r+1, worst, b.during[r])
	}
	for r := range b.o.rounds {
		answer, ack, err := b.forcedSwitch(ctx, tr)
		if err != nil {
			return err
		}
		b.forcedAnswer = append(b.forcedAnswer, answer)
		b.forced = append(b.forced, ack)
		step("forced %d → %s: answer %v, first ack %v", r+1, b.active, answer, ack)
		time.Sleep(2 * time.Second)
	}
	if n := tr.errs(); n > 0 {
		return fmt.Errorf("%d produces failed during the switches", n)
	}
	return nil
}

func endOffsets(ctx context.Context, c cluster, topic string) (map[int32]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return benchutil.EndOffsets(ctx, kadm.NewClient(cl), topic)
}

func dur(xs []time.Duration) string {
	m, lo, hi := benchutil.Spread(xs)
	r := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	return fmt.Sprintf("%s (%s – %s)", r(m), r(lo), r(hi))
}

func (b *bench) report(w io.Writer) error {
	m := benchutil.ReadMachine()
	c0, c0lo, c0hi := benchutil.Spread(b.consume[0])
	c1, c1lo, c1hi := benchutil.Spread(b.consume[1])
	pass := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	pa, _, _ := benchutil.Spread(b.planned["ack"])
	pg, _, _ := benchutil.Spread(b.planned["groups"])
	fa, _, _ := benchutil.Spread(b.forced)
	var sb strings.Builder
	fmt.Fprintf(&sb, "# Switchover benchmark\n\n")
	fmt.Fprintf(&sb, "`%s` on %d CPUs (%s), %.0f GiB, Linux %s, load %s, Go %s, Kafka %s (two 1-broker KRaft clusters on this machine, group.initial.rebalance.delay.ms=0), franz-go clients.\n\n",
		benchutil.Command("./conformance/switchbench", os.Args[1:]), m.CPUs, m.Model, m.MemGiB, m.Kernel, m.Load, m.GoVersion, kafkatest.Version())
	fmt.Fprintf(&sb, "Medians of %d, with the lowest and highest in brackets. Traffic during the switches: one idempotent producer at %d records/s and %d consumer groups over %d partitions, through Ferry; the mirror caught up before each switch.\n\n", b.o.rounds, b.o.rate, b.o.groups, b.o.partitions)
	fmt.Fprintf(&sb, "| measure | result | floor | |\n|---|---|---|---|\n")
	fmt.Fprintf(&sb, "| planned: call → answer | %s | | |\n", dur(b.planned["answer"]))
	fmt.Fprintf(&sb, "| planned: call → first produce acknowledged by the new active cluster | %s | ≤ 2 s | %s |\n", dur(b.planned["ack"]), pass(pa <= 2*time.Second))
	fmt.Fprintf(&sb, "| planned: call → every consumer group consuming again | %s | ≤ 5 s | %s |\n", dur(b.planned["groups"]), pass(pg <= 5*time.Second))
	within := len(b.reread) > 0
	for r, n := range b.reread {
		within = within && n <= b.during[r]
	}
	fmt.Fprintf(&sb, "| planned: records any group read again, per switch | %s | ≤ records produced while the switch ran, every switch | %s |\n", ints(b.reread), pass(within))
	fmt.Fprintf(&sb, "| forced: call → answer | %s | | |\n", dur(b.forcedAnswer))
	fmt.Fprintf(&sb, "| forced: call → first produce acknowledged by the new active cluster | %s | ≤ 2 s | %s |\n", dur(b.forced), pass(fa <= 2*time.Second))
	fmt.Fprintf(&sb, "| consume through Ferry before any switch (generation 0), MB/s | %.1f (%.1f – %.1f) | | |\n", c0, c0lo, c0hi)
	fmt.Fprintf(&sb, "| consume through Ferry after a switch (generation 1), MB/s | %.1f (%.1f – %.1f) | | |\n", c1, c1lo, c1hi)
	fmt.Fprintf(&sb, "| after / before | %.2f× | ≥ 0.9× | %s |\n", c1/c0, pass(c1/c0 >= 0.9))
	fmt.Fprintf(&sb, "\nConsume: %s of 1 KiB records over %d partitions, read from the start by a fresh franz-go consumer (no group), %d rounds per generation; after the switch the same records are read from the other cluster, where the mirror put them at the same offsets.\n",
		benchutil.HumanBytes(b.o.consumeBytes), b.o.partitions, b.o.rounds)
	fmt.Fprint(w, sb.String())
	if b.o.out != "" {
		return os.WriteFile(b.o.out, []byte(sb.String()), 0o644)
	}
	return nil
}

// ints is xs's median with its lowest and highest.
func ints(xs []int) string {
	if len(xs) == 0 {
		return "–"
	}
	m, lo, hi := benchutil.Spread(xs)
	return fmt.Sprintf("%d (%d – %d)", m, lo, hi)
}
