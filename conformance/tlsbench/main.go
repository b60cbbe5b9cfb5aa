// Command tlsbench measures what TLS costs through Ferry (issue 11 §4):
// throughput and CPU per GiB with TLS between clients and Ferry, between
// Ferry and the brokers, on both sides and on neither, side by side in one
// run on one real 3-broker Apache Kafka cluster, with direct connections to
// the brokers, plaintext and TLS, as references.
//
// The brokers have two client listeners: the harness's PLAINTEXT one and an
// SSL one (kafkatest.WithSecureListener) with a certificate from a CA made
// for the run (conformance/testpki). Five `ferry serve` processes (built
// from ./cmd/ferry) run in front of them, one per combination:
//
//	Ferry               plaintext to clients and to brokers (large fetches spliced)
//	Ferry-no-splice     the same with splice_fetches: false (fetch answers read whole)
//	Ferry-TLS-client    TLS to clients (tls:), plaintext to the brokers
//	Ferry-TLS-upstream  plaintext to clients, TLS to the brokers (clusters[].tls)
//	Ferry-TLS-both      TLS on both sides
//
// The load is conformance/bench's (benchutil.Produce and Consume: franz-go,
// 1 KiB records, lz4, acks=all idempotent), with the client's TLS trusting
// the run's CA where the path is TLS. Runs alternate between the paths
// within each round, so that drift on a shared machine hits every path
// alike; a figure is the median over -rounds, with the lowest and highest.
//
// Charged to each run: the CPU time of the path's Ferry process and of the
// three broker JVMs (utime+stime from /proc/<pid>/stat), per GiB of record
// values moved, and from Ferry's /metrics the bytes sent to clients and
// ferry_fetch_spliced_bytes_total, which shows whether fetches were spliced.
//
// A quick smoke run (about 3 minutes, most of it starting Kafka):
//
//	go run ./conformance/tlsbench -duration 3s -warmup 1s -records 50000 -rounds 1
//
// The measurement (about 10 minutes on 2 cores; `make bench-tls`):
//
//	go run ./conformance/tlsbench -out docs/TLS-BENCHMARKS.md
//
// With -out, the generated part of the file (between the markers
// "<!-- tlsbench:begin -->" and "<!-- tlsbench:end -->") is replaced and
// the text around it kept; a file without the markers is written whole.
package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
)

// options are the command-line flags.
type options struct {
	benchutil.Load
	out      string   // markdown report path, or ""
	ferryBin string   // prebuilt ferry binary, or "" to build cmd/ferry
	paths    []string // the paths measured, in this order
}

func parseFlags(args []string) (options, error) {
	o := options{Load: benchutil.Load{Duration: 12 * time.Second, Warmup: 4 * time.Second, Records: 3_000_000, Rounds: 3, Partitions: 6, Size: 1024}}
	fs := flag.NewFlagSet("tlsbench", flag.ContinueOnError)
	o.Flags(fs, benchutil.LoadHelp{
		Duration: "length of one produce run",
		Warmup:   "unmeasured produce run per path before the measured ones (and an unmeasured read of a quarter of -records)",
		Rounds:   "runs per path and phase, interleaved; figures are medians over rounds",
	})
	fs.StringVar(&o.out, "out", "", "write the results as markdown into this file (e.g. docs/TLS-BENCHMARKS.md)")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary to run as `ferry serve` (default: build ./cmd/ferry)")
	var names []string
	for _, m := range allModes {
		names = append(names, m.name)
	}
	paths := fs.String("paths", strings.Join(names, ","), "the paths to measure, comma separated, in the order each round runs them")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.paths = strings.Split(*paths, ",")
	for _, p := range o.paths {
		if !slices.Contains(names, p) {
			return o, fmt.Errorf("-paths: unknown path %q (want some of %s)", p, strings.Join(names, ","))
		}
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, o.Check()
}

func main() {
	benchutil.Main("tlsbench", "./conformance/tlsbench", "Ferry and Kafka", parseFlags, run)
}
