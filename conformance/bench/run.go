package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

const topic = "ferry-bench"

// The paths, by name.
const (
	pathDirect = "direct"
	pathRelay  = "relay"
	pathFerry  = "Ferry"
	pathBase   = "Ferry-base" // -ferry-base-bin
)

// path is one way to the cluster.
type path struct {
	name      string
	bootstrap string
	proc      *benchutil.Proc // charged the run's CPU; nil for the direct path
}

// phase is the runs of one kind, by path name, in the order they ran.
type phase struct {
	name string
	rate float64 // half-rate phase: records per second
	runs map[string][]runResult
}

// results is everything the report needs.
type results struct {
	opts      options
	command   string
	machine   benchutil.Machine
	started   time.Time
	took      time.Duration
	lz4       float64
	produce   phase
	halfRate  phase
	consume   phase
	consumeN  int64
	startCPU  time.Duration // Ferry's CPU time from its start to the first run
	ferryMode string        // how Ferry ran
	paths     []string      // the paths measured, in the order they ran
}

func run(ctx context.Context, o options, cmd string) error {
	res := &results{opts: o, command: cmd, machine: benchutil.ReadMachine(), started: time.Now()}
	vals := benchutil.Values(256, o.Size)
	res.lz4 = lz4Ratio(vals)

	// Retention is checked every 10 s, so that the topic's bound
	// (createTopic) holds while the produce runs write tens of GB.
	cfg := kafkatest.Config{Brokers: 3, Name: "bench", BrokerConfig: map[string]string{"log.retention.check.interval.ms": "10000"}}
	var relayPorts []int
	if o.relay {
		// The relay's ports are picked first: each broker advertises one
		// on its RELAY listener.
		var err error
		if relayPorts, err = benchutil.FreePorts(cfg.Brokers); err != nil {
			return err
		}
		cfg.Listeners = []kafkatest.Listener{{Name: relayListener, Advertise: func(id int32) string {
			return net.JoinHostPort("127.0.0.1", strconv.Itoa(relayPorts[id-1]))
		}}}
	}
	step("starting a 3-broker Kafka %s cluster", kafkatest.Version())
	cluster, err := benchutil.StartCluster(ctx, cfg, topic, o.Partitions)
	if err != nil {
		return err
	}
	defer benchutil.CloseCluster(cluster)
	if o.generation > 0 {
		return runGenerations(ctx, o, cluster)
	}

	dir, err := os.MkdirTemp("", "ferry-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	paths := []path{{pathDirect, cluster.Bootstrap(), nil}}
	// Every path's process is stopped when run returns, the last started
	// first.
	defer func() {
		for i := len(paths) - 1; i >= 0; i-- {
			if p := paths[i]; p.proc != nil {
				step("stopping %s", p.name)
				p.proc.Stop()
			}
		}
	}()
	if o.relay {
		var spec []string
		for i, id := range cluster.NodeIDs() {
			spec = append(spec, fmt.Sprintf("127.0.0.1:%d>%s", relayPorts[i], cluster.ListenerAddr(relayListener, id)))
		}
		step("starting the relay")
		env := []string{relayEnv + "=" + strings.Join(spec, ",")}
		if o.relayCopy {
			env = append(env, relayCopyEnv+"=1")
		}
		if o.relayFrames {
			env = append(env, relayFramesEnv+"=1")
		}
		rp, err := startChild(ctx, o.ferryCPUs, env...)
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		paths = append(paths, path{pathRelay, rp.Addr, rp})
	}

	var f *benchutil.Proc
	if o.cpuprofile != "" {
		res.ferryMode = "this benchmark binary re-executed as Ferry (proxy.New/Start/Serve, CPU profile to " + o.cpuprofile + ")"
		step("starting Ferry: %s", res.ferryMode)
		f, err = startChild(ctx, o.ferryCPUs, childEnv+"="+cluster.Bootstrap(), profileEnv+"="+o.cpuprofile)
	} else {
		bin := o.ferryBin
		if bin == "" {
			step("building ./cmd/ferry")
			if bin, err = benchutil.BuildFerry(ctx, dir); err != nil {
				return err
			}
		}
		res.ferryMode = "`ferry serve` (cmd/ferry) with log_level warn"
		if o.ferryCPUs != "" {
			res.ferryMode += ", pinned to CPUs " + o.ferryCPUs + " (taskset; the benchmark, the brokers and the load generator run on the CPUs the command was started with)"
		}
		step("starting Ferry: %s", res.ferryMode)
		f, err = startServe(ctx, bin, dir, cluster.Bootstrap(), o.ferryCPUs)
	}
	if err != nil {
		return fmt.Errorf("ferry: %w", err)
	}
	paths = append(paths, path{pathFerry, f.Addr, f})
	if res.startCPU, err = f.CPU(); err != nil {
		return err
	}
	if o.ferryBaseBin != "" {
		bdir := filepath.Join(dir, "base")
		if err := os.Mkdir(bdir, 0o755); err != nil {
			return err
		}
		step("starting the base build of Ferry, %s", o.ferryBaseBin)
		bf, err := startServe(ctx, o.ferryBaseBin, bdir, cluster.Bootstrap(), o.ferryCPUs)
		if err != nil {
			return fmt.Errorf("ferry base: %w", err)
		}
		paths = append(paths, path{pathBase, bf.Addr, bf})
	}
	for _, p := range paths {
		res.paths = append(res.paths, p.name)
	}

	// 1. Warm-up: JIT in the brokers, connections, page cache.
	if o.Warmup > 0 {
		for _, p := range paths {
			step("warm-up: produce %s for %v", p.name, o.Warmup)
			if _, err := produce(ctx, p.bootstrap, topic, vals, o.Warmup, 0); err != nil {
				return fmt.Errorf("warm-up %s: %w", p.name, err)
			}
		}
	}
	if len(o.clients) > 0 {
		return runClients(ctx, o, cmd, res.machine, paths, cluster.Bootstrap(), vals)
	}

	// 2. Produce at full speed.
	res.produce.name = "produce, full speed"
	for round := 1; round <= o.Rounds; round++ {
		for _, p := range paths {
			r, err := measure(p, func() (runResult, error) {
				return produce(ctx, p.bootstrap, topic, vals, o.Duration, 0)
			})
			if err != nil {
				return fmt.Errorf("produce %s: %w", p.name, err)
			}
			res.produce.add(p, r)
			step("round %d/%d produce %-6s %7.1f MB/s  p50 %8s  p99 %8s%s", round, o.Rounds, p.name,
				r.MBps(), ms(r.Pct(.50)), ms(r.Pct(.99)), cpuNote(r))
		}
	}

	// 3. Produce at half of the direct maximum rate.
	res.halfRate.name = "produce, half rate"
	res.halfRate.rate = median(res.produce.runs[pathDirect], runResult.RPS) / 2
	for round := 1; round <= o.Rounds; round++ {
		for _, p := range paths {
			r, err := measure(p, func() (runResult, error) {
				return produce(ctx, p.bootstrap, topic, vals, o.Duration, res.halfRate.rate)
			})
			if err != nil {
				return fmt.Errorf("half-rate produce %s: %w", p.name, err)
			}
			res.halfRate.add(p, r)
			step("round %d/%d half rate (%.0f rec/s) %-6s p50 %8s  p99 %8s%s", round, o.Rounds, res.halfRate.rate,
				p.name, ms(r.Pct(.50)), ms(r.Pct(.99)), cpuNote(r))
		}
	}

	// 4. Consume from the start of the topic.
	res.consume.name = "consume"
	res.consumeN = min(o.Records, produced(res))
	if o.Warmup > 0 {
		for _, p := range paths {
			step("warm-up: consume %s", p.name)
			if _, err := consume(ctx, p.bootstrap, topic, o.Partitions, res.consumeN/4); err != nil {
				return fmt.Errorf("warm-up consume %s: %w", p.name, err)
			}
		}
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, p := range paths {
			r, err := measure(p, func() (runResult, error) {
				return consume(ctx, p.bootstrap, topic, o.Partitions, res.consumeN)
			})
			if err != nil {
				return fmt.Errorf("consume %s: %w", p.name, err)
			}
			res.consume.add(p, r)
			step("round %d/%d consume %-6s %7.1f MB/s%s", round, o.Rounds, p.name, r.MBps(), cpuNote(r))
		}
	}

	res.took = time.Since(res.started)
	rep := report(res)
	return benchutil.Publish(rep.text, rep.markdown, o.out, nil)
}

// measure runs one run and charges it the CPU time of the path's process.
func measure(p path, f func() (runResult, error)) (runResult, error) {
	var before time.Duration
	if p.proc != nil {
		var err error
		if before, err = p.proc.CPU(); err != nil {
			return runResult{}, err
		}
	}
	r, err := f()
	if err != nil || p.proc == nil {
		return r, err
	}
	after, err := p.proc.CPU()
	r.CPU = after - before
	return r, err
}

func (ph *phase) add(p path, r runResult) {
	if ph.runs == nil {
		ph.runs = make(map[string][]runResult)
	}
	ph.runs[p.name] = append(ph.runs[p.name], r)
}

// produced is how many records the topic holds at least (warm-up records
// not counted).
func produced(res *results) int64 {
	var n int64
	for _, ph := range []*phase{&res.produce, &res.halfRate} {
		for _, rs := range ph.runs {
			for _, r := range rs {
				n += r.Records
			}
		}
	}
	return n
}

// step logs one line of progress.
var step = benchutil.Step

func cpuNote(r runResult) string {
	if r.CPU == 0 {
		return ""
	}
	return fmt.Sprintf("  CPU %.1fs", r.CPU.Seconds())
}
