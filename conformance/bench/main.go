// Command bench measures Ferry against a direct connection to the same real
// Apache Kafka cluster, side by side in one run (issue 2 §7).
//
// It starts a 3-broker KRaft cluster (conformance/kafkatest), runs Ferry as a
// separate process in front of it (`ferry serve`, built from ./cmd/ferry, so
// that Ferry's CPU is not mixed with the load generator's), and drives both
// paths with the same franz-go load generator:
// 1 KiB records, lz4, acks=all idempotent (the client's defaults otherwise),
// one topic of -partitions partitions with replication factor 3. Runs
// alternate direct, relay, Ferry, direct… so that drift on a shared machine
// hits every path alike; every figure is the median over -rounds.
//
// The relay is a third path: a process that copies bytes between clients
// and every broker with splice(2) and parses nothing, reached through a
// second listener on each broker that advertises the relay's ports. It is
// the cheapest hop a gateway could be, so relay/direct is what any extra
// hop costs on this machine, and Ferry/relay what Ferry's own work costs.
//
// Phases, in order:
//
//  1. warm-up: each path produces for -warmup, unmeasured (and reads a
//     quarter of -records before the consume phase);
//  2. produce at full speed for -duration: MB/s, per-record latency p50/p99;
//  3. produce at half of the direct maximum rate for -duration: p99 direct
//     vs through Ferry, and the difference (the added latency);
//  4. consume -records records from the start of the topic: MB/s.
//
// The CPU time of Ferry's process and of the relay's (utime+stime from
// /proc/<pid>/stat) is read before and after each of their runs and divided
// by the record bytes moved through it.
// The results are printed as a table with the floors of issue 2 and, with
// -out, written as markdown (docs/BENCHMARKS.md). With -cpuprofile, Ferry
// runs as this binary re-executed with FERRY_BENCH_CHILD set
// (proxy.New/Start/Serve, as `ferry serve` does) and writes a CPU profile
// for `go tool pprof`.
//
// A quick smoke run (about 2 minutes, most of it starting Kafka):
//
//	go run ./conformance/bench -duration 3s -warmup 2s -records 30000 -rounds 1
//
// The real measurement (about 8 minutes):
//
//	go run ./conformance/bench -out docs/BENCHMARKS.md
//
// Consuming after a switch against before it (generation 1 against 0):
//
//	go run ./conformance/bench -consume-generation 1 -duration 20s
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
)

// options are the command-line flags.
type options struct {
	benchutil.Load        // Rounds: direct+Ferry pairs per phase
	out            string // markdown report path, or ""
	cpuprofile     string // Ferry's CPU profile path, or ""
	ferryBin       string // prebuilt ferry binary, or "" to build cmd/ferry
	ferryBaseBin   string // a second ferry binary measured beside it, or ""
	ferryCPUs      string // taskset CPU list to pin Ferry (and the relay) to, or ""
	relay          bool   // also measure the relay path
	relayCopy      bool   // the relay reads and writes through a buffer instead of splicing
	relayFrames    bool   // the relay reads each frame whole before writing it
	clients        []int  // -clients: the many-clients mode's client counts
	generation     uint32 // -consume-generation: compare consuming under it with generation 0
}

func parseFlags(args []string) (options, error) {
	o := options{Load: benchutil.Load{Duration: 20 * time.Second, Warmup: 10 * time.Second, Records: 4_000_000, Rounds: 3, Partitions: 6, Size: 1024}}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	o.Flags(fs, benchutil.LoadHelp{
		Duration: "length of one produce run (full speed and half rate)",
		Warmup:   "unmeasured produce run per path before the measured ones",
		Rounds:   "direct+Ferry pairs per phase; figures are medians over rounds",
	})
	fs.StringVar(&o.out, "out", "", "write the results as markdown to this file (e.g. docs/BENCHMARKS.md)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write Ferry's CPU profile (of the whole run) to this file; runs Ferry as this binary re-executed instead of `ferry serve`")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary to run as `ferry serve` (default: build ./cmd/ferry)")
	fs.StringVar(&o.ferryBaseBin, "ferry-base-bin", "", "also measure this ferry binary, as the path \""+pathBase+"\" run alongside: an older build against the new in the same run (CPU per GiB of both in the report)")
	fs.StringVar(&o.ferryCPUs, "ferry-cpus", "", "pin `ferry serve` (and the relay) to these CPUs (a taskset list); run the benchmark itself under taskset on the others to give Ferry cores of its own, as in a deployment")
	fs.BoolVar(&o.relay, "relay", true, "also measure a third path through a bare TCP relay (splice both ways, nothing parsed): what any extra hop costs here")
	fs.BoolVar(&o.relayCopy, "relay-copy", false, "the relay reads each connection's bytes into a buffer and writes them from it (read(2) and write(2), 256 KiB) instead of splicing: the two copies through user space that any gateway looking at the bytes makes, so that Ferry/relay is Ferry's work beyond them")
	fs.BoolVar(&o.relayFrames, "relay-frames", false, "the relay reads each Kafka frame whole into a buffer of its size and then writes it (store and forward, nothing parsed) instead of splicing: what a gateway that must see a whole request before sending it pays in copies and cache, so that Ferry/relay is Ferry's work beyond them")
	clients := fs.String("clients", "", "instead of the full benchmark: produce and consume MB/s with this many clients at once on each path, a comma-separated list of counts (e.g. 10,1000), each client with connections of its own")
	gen := fs.Uint("consume-generation", 0, "instead of the full benchmark: fill the topic for -duration, then compare consume MB/s through a Ferry at generation 0 and one at this generation (both treating the cluster as a mirror target), and directly")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := o.Check(); err != nil {
		return o, err
	}
	for _, c := range strings.Split(*clients, ",") {
		if c == "" {
			continue
		}
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return o, fmt.Errorf("-clients: %q is not a count of clients", c)
		}
		o.clients = append(o.clients, n)
	}
	slices.Sort(o.clients) // the report sets the largest beside the smallest
	if o.relayCopy && o.relayFrames {
		return o, errors.New("-relay-copy and -relay-frames are two relays: choose one")
	}
	if *gen >= 1<<11 {
		return o, errors.New("-consume-generation must be below 2048")
	}
	o.generation = uint32(*gen)
	return o, nil
}

func main() {
	if spec, ok := os.LookupEnv(relayEnv); ok {
		if err := runRelay(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench: relay child:", err)
			os.Exit(1)
		}
		return
	}
	if bootstrap, ok := os.LookupEnv(childEnv); ok {
		if err := runChild(bootstrap, os.Getenv(profileEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "bench: ferry child:", err)
			os.Exit(1)
		}
		return
	}
	benchutil.Main("bench", "./conformance/bench", "Ferry, the relay and Kafka", parseFlags, run)
}
