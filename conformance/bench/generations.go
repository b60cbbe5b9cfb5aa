package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// runGenerations is the -consume-generation mode: consume MB/s through two
// Ferrys alike but for the routing generation they serve under — 0, as
// before any switch, and o.generation, as after — and directly, runs
// alternating as in the main benchmark. Both Ferrys are this binary
// re-executed (proxy.New/Start/Serve) and treat the cluster as a mirror
// target, as cmd/ferry does with two clusters: each batch header of an
// answer is checked for fillers under both, and its leader epoch rewritten
// under the later generation. A third Ferry at generation 0 with one
// cluster (no mirror target: records spliced whole, no header read) shows
// what checking the headers costs.
func runGenerations(ctx context.Context, o options, cluster *kafkatest.Cluster) error {
	vals := benchutil.Values(256, o.Size)
	later := "Ferry-g" + strconv.FormatUint(uint64(o.generation), 10)
	paths := []path{{pathDirect, cluster.Bootstrap(), nil}}
	for _, g := range []struct {
		name string
		env  []string
	}{
		{"Ferry-1cl", nil},
		{"Ferry-g0", []string{generationEnv + "=0"}},
		{later, []string{generationEnv + "=" + strconv.FormatUint(uint64(o.generation), 10)}},
	} {
		step("starting %s (this binary re-executed as Ferry, %v)", g.name, g.env)
		f, err := startChild(ctx, o.ferryCPUs, append([]string{childEnv + "=" + cluster.Bootstrap()}, g.env...)...)
		if err != nil {
			return fmt.Errorf("%s: %w", g.name, err)
		}
		defer f.Stop()
		paths = append(paths, path{g.name, f.Addr, f})
	}

	step("filling the topic: produce directly for %v", o.Duration)
	filled, err := produce(ctx, cluster.Bootstrap(), topic, vals, o.Duration, 0)
	if err != nil {
		return err
	}
	n := min(o.Records, filled.Records)
	for _, p := range paths {
		step("warm-up: consume %s", p.name)
		if _, err := consume(ctx, p.bootstrap, topic, o.Partitions, n/4); err != nil {
			return fmt.Errorf("warm-up consume %s: %w", p.name, err)
		}
	}
	var ph phase
	for round := 1; round <= o.Rounds; round++ {
		for _, p := range paths {
			r, err := measure(p, func() (runResult, error) { return consume(ctx, p.bootstrap, topic, o.Partitions, n) })
			if err != nil {
				return fmt.Errorf("consume %s: %w", p.name, err)
			}
			ph.add(p, r)
			step("round %d/%d consume %-9s %7.1f MB/s%s", round, o.Rounds, p.name, r.MBps(), cpuNote(r))
		}
	}

	med := func(name string, f func(runResult) float64) float64 {
		var xs []float64
		for _, r := range ph.runs[name] {
			xs = append(xs, f(r))
		}
		sort.Float64s(xs)
		return xs[len(xs)/2]
	}
	fmt.Printf("\nconsume %d records of %d bytes, %d partitions, median of %d rounds\n", n, o.Size, o.Partitions, o.Rounds)
	for _, p := range paths {
		line := fmt.Sprintf("  %-9s %7.1f MB/s", p.name, med(p.name, runResult.MBps))
		if p.proc != nil {
			line += fmt.Sprintf("  Ferry CPU %.2f s/GiB", med(p.name, cpuPerGiB))
		}
		fmt.Println(line)
	}
	ratio := med(later, runResult.MBps) / med("Ferry-g0", runResult.MBps)
	// Runs of one round are closest in time: their ratio is less
	// exposed to drift on a shared machine.
	var rounds []float64
	for i, r := range ph.runs[later] {
		rounds = append(rounds, r.MBps()/ph.runs["Ferry-g0"][i].MBps())
	}
	sort.Float64s(rounds)
	verdict := "meets"
	if ratio < 0.9 {
		verdict = "BELOW"
	}
	fmt.Printf("  %s / Ferry-g0: %.3f of the medians, %.3f median of the rounds' ratios (%s the 0.9 floor)\n", later, ratio, rounds[len(rounds)/2], verdict)
	return nil
}
