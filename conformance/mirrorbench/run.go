package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// copyResult is one mirror's copy of one variant's topic.
type copyResult struct {
	name      string
	bytes     int64         // record value bytes copied
	startup   time.Duration // from the process start to the first records on the target
	window    time.Duration // from the first records on the target to all of them
	cpuWindow time.Duration // the process's CPU time over window
	cpuTotal  time.Duration // the process's CPU time from its start to the end of window
	fid       fidelity
	ran       bool
}

// mbps is record value MB/s (10^6) over the copy window.
func (r copyResult) mbps() float64 {
	if r.window <= 0 {
		return 0
	}
	return float64(r.bytes) / 1e6 / r.window.Seconds()
}

// cpuPerGiB is CPU-seconds over the copy window per GiB of record values.
func (r copyResult) cpuPerGiB() float64 {
	if r.bytes == 0 {
		return 0
	}
	return r.cpuWindow.Seconds() / (float64(r.bytes) / (1 << 30))
}

// variant is everything measured for one codec.
type variant struct {
	codec      string
	topic      string
	load       loadResult
	onDisk     int64 // the source topic's log size
	ceiling    ceilingResult
	ferry, mm2 copyResult
	distance   []distanceResult // Ferry's copy with the target behind a delaying relay
	loadAvg    string           // at the start of the variant
}

// distanceResult is Ferry's copy at one round-trip time to the target.
type distanceResult struct {
	rtt time.Duration
	copyResult
}

// results is everything the report needs.
type results struct {
	opts     options
	command  string
	machine  benchutil.Machine
	started  time.Time
	took     time.Duration
	mm2Jars  string
	revision string // the Ferry commit measured
	variants []*variant
}

func run(ctx context.Context, o options, cmd string) error {
	res := &results{opts: o, command: cmd, machine: benchutil.ReadMachine(), started: time.Now(), revision: revision()}

	dir, err := os.MkdirTemp("", "ferry-mirrorbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	vals := benchutil.Values(valuePool, o.size)
	payload := filepath.Join(dir, "payloads.txt")
	if err := writePayloadFile(payload, vals); err != nil {
		return err
	}
	if !o.skipMM2 {
		step("resolving MirrorMaker 2 %s jars (conformance/maven-mm2/pom.xml)", mm2Version)
		if res.mm2Jars, err = mm2Jars(); err != nil {
			return err
		}
	}

	// With -rtts, the target also listens behind a relay that adds the
	// round-trip time (benchutil.DelayedListener).
	var relay *benchutil.DelayRelay
	adjust := func(string, *kafkatest.Config) {}
	if len(o.rtts) > 0 {
		if relay, err = benchutil.ListenDelayRelay(0); err != nil {
			return err
		}
		defer relay.Close()
		adjust = func(name string, c *kafkatest.Config) {
			if name == "target" {
				c.Listeners = []kafkatest.Listener{relay.Listener()}
			}
		}
	}
	step("starting two 1-broker Kafka %s clusters (source, target)", kafkatest.Version())
	clusters, err := benchutil.StartClustersWith("mirrorbench-", adjust, "source", "target")
	if err != nil {
		return err
	}
	defer func() {
		step("closing the Kafka clusters")
		benchutil.CloseClusters(clusters)
	}()
	source, target := clusters["source"], clusters["target"]
	if relay != nil {
		relay.ServeCluster(target)
	}
	// The admin clients poll end offsets and topic lists: kgo answers
	// those from metadata at most MetadataMinAge old (5 s by default,
	// during which a new topic stays unknown), so allow fresh metadata on
	// every poll.
	srcCl, err := newClient(source.Bootstrap(), kgo.MetadataMinAge(pollInterval))
	if err != nil {
		return err
	}
	defer srcCl.Close()
	dstCl, err := newClient(target.Bootstrap(), kgo.MetadataMinAge(pollInterval))
	if err != nil {
		return err
	}
	defer dstCl.Close()
	env := &benchEnv{o: o, dir: dir, payload: payload, vals: vals, mm2Jars: res.mm2Jars, relay: relay,
		source: source.Bootstrap(), target: target.Bootstrap(),
		srcAdm: kadm.NewClient(srcCl), dstAdm: kadm.NewClient(dstCl)}

	for _, codec := range o.codecs {
		v := &variant{codec: codec, topic: "mirrorbench-" + codec, loadAvg: benchutil.ReadMachine().Load}
		res.variants = append(res.variants, v)
		if err := env.runVariant(ctx, v); err != nil {
			return fmt.Errorf("%s: %w", codec, err)
		}
	}

	res.took = time.Since(res.started)
	rep := report(res)
	return benchutil.Publish(rep.text, rep.markdown, o.out, nil)
}

// benchEnv is what every variant shares.
type benchEnv struct {
	o              options
	dir            string
	payload        string
	vals           [][]byte
	mm2Jars        string
	source, target string // bootstrap servers
	srcAdm, dstAdm *kadm.Client
	relay          *benchutil.DelayRelay // in front of the target (-rtts), or nil
}

// runVariant loads the source topic, measures the ceiling, Ferry and MM2,
// and removes the topics again (so the next variant starts on empty disks).
func (e *benchEnv) runVariant(ctx context.Context, v *variant) error {
	o := e.o
	n := o.records()
	perPartition := (n + int64(o.partitions) - 1) / int64(o.partitions)

	// 1. The source topic.
	if err := createTopic(ctx, e.srcAdm, v.topic, o.partitions); err != nil {
		return err
	}
	step("%s: loading %d records of %d bytes (%.2f GiB) into the source", v.codec, n, o.size, float64(n*int64(o.size))/(1<<30))
	lctx, cancel := context.WithTimeout(ctx, o.timeout)
	var err error
	v.load, err = produceSource(lctx, e.source, v.topic, v.codec, o.partitions, n, e.vals, o.batchBytes)
	cancel()
	if err != nil {
		return fmt.Errorf("loading the source: %w", err)
	}
	v.onDisk = topicSize(ctx, e.srcAdm, v.topic)
	step("%s: loaded in %v (%.1f MB/s); %.1f MB on the source's disk", v.codec, v.load.elapsed.Round(time.Millisecond), v.load.mbps(), float64(v.onDisk)/1e6)
	idx, err := indexSource(ctx, e.source, v.topic, o.partitions, perPartition)
	if err != nil {
		return fmt.Errorf("reading the source: %w", err)
	}

	// 2. The target's raw produce ceiling, into a scratch topic.
	scratch := "mirrorbench-ceiling-" + v.codec
	if err := createTopic(ctx, e.dstAdm, scratch, o.partitions); err != nil {
		return err
	}
	step("%s: ProducerPerformance into the target (%d records)", v.codec, n)
	cctx, cancel := context.WithTimeout(ctx, o.timeout)
	v.ceiling, err = producerPerf(cctx, e.target, scratch, e.payload, v.codec, n, o.size)
	cancel()
	if err != nil {
		return err
	}
	step("%s: ceiling %.1f MB/s (%s)", v.codec, v.ceiling.mbps, v.ceiling.summary)
	if err := deleteTopic(ctx, e.dstAdm, scratch); err != nil {
		return err
	}

	// 3. Ferry's mirror.
	profile := ""
	if o.cpuprofile != "" {
		profile = o.cpuprofile + "." + v.codec
	}
	step("%s: Ferry's mirror (child process running mirror.New/Run)", v.codec)
	p, err := startFerry(e.source, e.target, v.topic, profile)
	if err != nil {
		return err
	}
	v.ferry, err = e.measureCopy(ctx, "Ferry", p, v.topic, idx.ends, nil)
	p.stop(syscall.SIGTERM, 15*time.Second)
	if err != nil {
		return err
	}
	if profile != "" {
		step("%s: CPU profile in %s", v.codec, profile)
	}
	if v.ferry.fid, err = idx.compare(ctx, e.target, v.topic); err != nil {
		return fmt.Errorf("comparing Ferry's copy: %w", err)
	}
	step("%s: Ferry's copy: %s", v.codec, v.ferry.fid)
	if err := deleteTopic(ctx, e.dstAdm, v.topic); err != nil {
		return err
	}

	// 3b. Ferry's mirror again, with the target a round trip away.
	for _, rtt := range o.rtts {
		e.relay.SetRTT(rtt)
		step("%s: Ferry's mirror with the target %v away (round trip, through a delaying relay)", v.codec, rtt)
		p, err := startFerry(e.source, e.relay.Addr(), v.topic, "")
		if err != nil {
			return err
		}
		d := distanceResult{rtt: rtt}
		d.copyResult, err = e.measureCopy(ctx, fmt.Sprintf("Ferry at %v", rtt), p, v.topic, idx.ends, nil)
		p.stop(syscall.SIGTERM, 15*time.Second)
		if err != nil {
			return err
		}
		if d.fid, err = idx.compare(ctx, e.target, v.topic); err != nil {
			return fmt.Errorf("comparing Ferry's copy at %v: %w", rtt, err)
		}
		step("%s: at %v: %.1f MB/s (%s of the copy at 0 ms); %s", v.codec, rtt, d.mbps(), benchutil.Ratio(d.mbps(), v.ferry.mbps()), d.fid)
		v.distance = append(v.distance, d)
		if err := deleteTopic(ctx, e.dstAdm, v.topic); err != nil {
			return err
		}
	}

	// 4. MirrorMaker 2, into a fresh topic of the same name.
	if !o.skipMM2 {
		step("%s: MirrorMaker 2 %s (dedicated mode, %d tasks)", v.codec, mm2Version, o.partitions)
		mc := mm2Config{sourceAlias: "source_" + v.codec, source: e.source, target: e.target,
			topic: v.topic, tasks: o.partitions, codec: v.codec}
		p, tb, err := startMM2(ctx, e.dir, e.mm2Jars, mc)
		if err != nil {
			return err
		}
		logFile := filepath.Join(e.dir, "mm2-"+mc.sourceAlias+".log")
		v.mm2, err = e.measureCopy(ctx, "MM2", p, v.topic, idx.ends, func() error { return mm2LogErrors(logFile) })
		p.stop(syscall.SIGTERM, 15*time.Second)
		tb.Close()
		if err != nil {
			log, _ := os.ReadFile(logFile)
			return fmt.Errorf("%w\nMirrorMaker 2 log (tail):\n%s", err, tail(string(log), 40))
		}
		if v.mm2.fid, err = idx.compare(ctx, e.target, v.topic); err != nil {
			return fmt.Errorf("comparing MM2's copy: %w", err)
		}
		step("%s: MM2's copy: %s", v.codec, v.mm2.fid)
		if err := deleteTopic(ctx, e.dstAdm, v.topic); err != nil {
			return err
		}
	}
	return deleteTopic(ctx, e.srcAdm, v.topic)
}

// pollInterval is how often measureCopy lists the target's end offsets:
// short enough that a copy of a GiB lasting under a second is timed to a
// few percent.
const pollInterval = 10 * time.Millisecond

// measureCopy polls the target's end offsets of topic every pollInterval until
// every partition reaches want, and charges p's CPU time to the copy. The
// copy window starts at the last poll that saw no records on the target
// (so a copy shorter than a poll interval still has a window) and ends at
// the first that sees them all. check, if not nil, is called every few
// seconds and ends the wait with its error (MM2 logs configuration errors
// and goes on running).
func (e *benchEnv) measureCopy(ctx context.Context, name string, p *proc, topic string, want map[int32]int64, check func() error) (copyResult, error) {
	r := copyResult{name: name, ran: true}
	var total int64
	for _, w := range want {
		total += w
	}
	deadline := time.Now().Add(e.o.timeout)
	firstBy := time.Now().Add(min(e.o.timeout, 5*time.Minute))
	var (
		started            bool
		emptyAt            = p.started // last poll that saw no records
		cpuEmpty, cpuFirst time.Duration
		lastLog, lastCheck = time.Now(), time.Now()
	)
	for {
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-p.done:
			return r, fmt.Errorf("%s exited before the target caught up: %v", name, p.err)
		case <-time.After(pollInterval):
		}
		now := time.Now()
		cpu, err := p.cpu()
		if err != nil {
			return r, err
		}
		switch {
		case now.After(deadline):
			return r, fmt.Errorf("%s: the target did not catch up within %v", name, e.o.timeout)
		case !started && now.After(firstBy):
			return r, fmt.Errorf("%s: no records on the target %v after the start", name, firstBy.Sub(p.started).Round(time.Second))
		}
		if check != nil && now.Sub(lastCheck) >= 2*time.Second {
			lastCheck = now
			if err := check(); err != nil {
				return r, fmt.Errorf("%s: %w", name, err)
			}
		}
		ends, err := endOffsets(ctx, e.dstAdm, topic)
		if err != nil && len(ends) == 0 {
			emptyAt, cpuEmpty = now, cpu // the topic is not there yet
			continue
		}
		var have int64
		done := len(ends) == len(want)
		for part, w := range want {
			have += ends[part]
			if ends[part] < w {
				done = false
			}
		}
		if have == 0 {
			emptyAt, cpuEmpty = now, cpu
			continue
		}
		if !started {
			started = true
			cpuFirst = cpuEmpty
			r.startup = emptyAt.Sub(p.started)
		}
		if done {
			// The CPU read before this poll: the copy was complete by then
			// or within the poll.
			r.window = now.Sub(emptyAt)
			r.cpuWindow = cpu - cpuFirst
			r.cpuTotal = cpu
			r.bytes = int64(e.o.size) * e.o.records()
			step("%s: caught up: %.1f MB/s over %v (copy began %v after the start), CPU %.1f s (%.1f s since the start)",
				name, r.mbps(), r.window.Round(time.Millisecond), r.startup.Round(time.Millisecond), r.cpuWindow.Seconds(), cpu.Seconds())
			return r, nil
		}
		if now.Sub(lastLog) >= 5*time.Second {
			lastLog = now
			step("%s: %d of %d offsets on the target", name, have, total)
		}
	}
}

func createTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int) error {
	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// deleteTopic deletes topic and waits until the metadata no longer lists
// it, so that a topic of the same name can be created afresh.
func deleteTopic(ctx context.Context, adm *kadm.Client, topic string) error {
	resp, err := adm.DeleteTopic(ctx, topic)
	if err == nil && resp.Err != nil && !errors.Is(resp.Err, kerr.UnknownTopicOrPartition) {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("delete topic %s: %w", topic, err)
	}
	for range 300 {
		td, err := adm.ListTopics(ctx, topic)
		if err == nil && !td.Has(topic) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("topic %s still listed 30 s after its deletion", topic)
}

// topicSize is the size of topic's logs on disk, or 0 if unknown.
func topicSize(ctx context.Context, adm *kadm.Client, topic string) int64 {
	ds, err := adm.DescribeAllLogDirs(ctx, nil)
	if err != nil {
		return 0
	}
	var n int64
	ds.Each(func(d kadm.DescribedLogDir) {
		for _, p := range d.Topics[topic] {
			n += p.Size
		}
	})
	return n
}

func (f fidelity) String() string {
	return fmt.Sprintf("%d of %d source records identical at their source offset, %d at another offset, %d differ, %d missing, %d extra; end offsets equal: %v",
		f.identical, f.source, f.moved, f.differs, f.missing, f.extra, f.offsetsEq)
}

// revision names the commit of the working tree and whether the mirror's
// sources differ from it.
func revision() string {
	root, err := kafkatest.RepoRoot()
	if err != nil {
		return "unknown"
	}
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--", "mirror", "protocol").Output(); err == nil && len(st) > 0 {
		rev += " with uncommitted changes in mirror/ or protocol/"
	}
	return rev
}

// step logs one line of progress.
var step = benchutil.Step
