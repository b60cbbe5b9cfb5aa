// Command mirrorbench measures Ferry's offset-preserving mirror against
// MirrorMaker 2 and against the target cluster's raw produce ceiling, side by
// side in one run on this machine (issue 3 §7).
//
// It starts two 1-broker Apache Kafka KRaft clusters (conformance/kafkatest),
// a source and a target, and runs one variant per codec (-codecs, default
// none, lz4 and zstd). Each variant:
//
//  1. load: -bytes of -size-byte record values over -partitions partitions
//     into a fresh source topic, produced by franz-go in this process with
//     the variant's codec (keys, one header, client defaults otherwise:
//     acks=all, idempotent, 10 ms linger, batches up to ~1 MB);
//  2. ceiling: Kafka's ProducerPerformance writes the same number of
//     records of the same values with the same codec and batching into a
//     scratch topic of the target: the target's raw produce ceiling, MB/s;
//  3. Ferry: this binary re-executed with childEnv set runs
//     mirror.New/Run (independent of cmd/ferry) from the source to the
//     target; the parent polls the target's end offsets until they equal the
//     source's, reads the child's CPU time from /proc/<pid>/stat, stops it,
//     and compares every record of every partition on both clusters
//     (offset, key, value, headers, timestamp);
//  4. MirrorMaker 2 (connect-mirror from conformance/maven-mm2/pom.xml)
//     in dedicated mode with IdentityReplicationPolicy, tasks.max =
//     partitions, the same producer batching and codec, into the same topic
//     name on the target after Ferry's copy was deleted: measured and
//     compared the same way.
//
// Copy MB/s is record value bytes (10^6) over the copy window, from the
// first poll that sees records on the target to the one that sees all of
// them; CPU per GiB is the mirror process's utime+stime over the same
// window per GiB (2^30) of record values. Start-up (JVM, Connect rebalance,
// topic creation) is reported apart. The results are printed as a table per
// variant with the floors of issue 3 and, with -out, written as markdown
// (docs/MIRROR-BENCHMARKS.md). With -cpuprofile, the Ferry child writes a CPU
// profile per variant (<file>.<codec>) for `go tool pprof`.
//
// A quick smoke run (a few minutes, most of it starting Kafka and MM2):
//
//	go run ./conformance/mirrorbench -bytes 64MiB -partitions 4
//
// The real measurement:
//
//	go run ./conformance/mirrorbench -out docs/MIRROR-BENCHMARKS.md
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
)

// options are the command-line flags.
type options struct {
	bytes      int64    // record value bytes per variant
	partitions int      // of every benchmark topic
	size       int      // record value bytes
	codecs     []string // variants, in order
	timeout    time.Duration
	out        string // markdown report path, or ""
	cpuprofile string // prefix of the Ferry child's CPU profiles, or ""
	skipMM2    bool
	// rtts: Ferry's copy again with the target behind a delaying relay,
	// at each round-trip time (issue 20: clusters a region apart).
	rtts       []time.Duration
	batchBytes int32 // the source producer's batch cap (0: franz-go's 1 MB)
}

// records is how many records one variant writes.
func (o options) records() int64 { return (o.bytes + int64(o.size) - 1) / int64(o.size) }

var knownCodecs = map[string]bool{"none": true, "gzip": true, "snappy": true, "lz4": true, "zstd": true}

func parseFlags(args []string) (options, error) {
	var o options
	var bytes, codecs string
	fs := flag.NewFlagSet("mirrorbench", flag.ContinueOnError)
	fs.StringVar(&bytes, "bytes", "1GiB", "record value bytes per variant (suffixes KiB, MiB, GiB)")
	fs.IntVar(&o.partitions, "partitions", 8, "partitions of every benchmark topic")
	fs.IntVar(&o.size, "size", 1024, "record value size in bytes")
	fs.StringVar(&codecs, "codecs", "none,lz4,zstd", "comma-separated codecs, one variant each (none, gzip, snappy, lz4, zstd)")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "bound on one copy (Ferry or MM2) and on one load or ceiling run")
	fs.StringVar(&o.out, "out", "", "write the results as markdown to this file (e.g. docs/MIRROR-BENCHMARKS.md)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write the Ferry mirror child's CPU profile of each variant to <file>.<codec>")
	fs.BoolVar(&o.skipMM2, "skip-mm2", false, "do not run MirrorMaker 2 (development only: the MM2 floors then fail)")
	fs.IntVar(&childInFlight, "inflight", 0, "the Ferry mirror's Produce requests in flight per partition (mirror.InFlight; 0: its default)")
	var rtts string
	fs.StringVar(&rtts, "rtts", "", "comma-separated round-trip times (e.g. 20ms,50ms,100ms): Ferry's copy again with the target behind a relay adding each (a cluster a region away)")
	var batch string
	fs.StringVar(&batch, "batch-bytes", "", "the source producer's largest batch (e.g. 16KiB, the Java producer's default batch.size); default franz-go's 1 MB")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, r := range strings.Split(rtts, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		d, err := time.ParseDuration(r)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("-rtts: %q is no positive duration", r)
		}
		o.rtts = append(o.rtts, d)
	}
	if batch != "" {
		b, err := benchutil.ParseBytes(batch)
		if err != nil || b < 1<<10 || b > 1<<30 {
			return o, fmt.Errorf("-batch-bytes: %q (from 1KiB to 1GiB)", batch)
		}
		o.batchBytes = int32(b)
	}
	var err error
	if o.bytes, err = benchutil.ParseBytes(bytes); err != nil {
		return o, fmt.Errorf("-bytes: %w", err)
	}
	for _, c := range strings.Split(codecs, ",") {
		c = strings.TrimSpace(c)
		if !knownCodecs[c] {
			return o, fmt.Errorf("-codecs: unknown codec %q", c)
		}
		o.codecs = append(o.codecs, c)
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.bytes < 1 || o.partitions < 1 || o.size < 1:
		return o, errors.New("-bytes, -partitions and -size must be positive")
	case o.timeout <= 0:
		return o, errors.New("-timeout must be positive")
	}
	return o, nil
}

func main() {
	if _, ok := os.LookupEnv(childEnv); ok {
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "mirrorbench: mirror child:", err)
			os.Exit(1)
		}
		return
	}
	benchutil.Main("mirrorbench", "./conformance/mirrorbench", "the mirrors and Kafka", parseFlags, run)
}
