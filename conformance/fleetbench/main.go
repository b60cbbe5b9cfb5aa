// Command fleetbench measures a fleet of Ferry members on real Apache Kafka
// (issue 9 §6): `make bench-fleet`.
//
// It starts two 1-broker KRaft clusters (conformance/kafkatest), a primary
// and a standby, builds cmd/ferry and runs three `ferry serve` members with
// a fleet section (gossip on loopback, a key file, Ferry's default write
// lease and memberlist timings) in front of them, the mirror on, then:
//
//  1. mirror: -mirror-bytes of 1 KiB records are written straight into a
//     fresh topic of -mirror-partitions partitions on the primary while no
//     member runs; then one member (alone, no seeds) or all three (started
//     together, seeded with each other) are started, and the copy to the
//     standby is timed from the last poll of the standby's high watermarks
//     that saw none of the records to the first that saw all of them.
//     Alternating one and three members, -mirror-rounds each; the fleet of
//     three stays up after the last.
//  2. gossip: -rounds planned switches (POST /switchover on member r mod
//     3, alternating the direction) with every member's /status polled
//     back to back: call → answer (the flip is the last step before the
//     answer), call → every member's routing.generation the new one, call
//     → every member's /status listing every member at the new generation.
//  3. death: -producers franz-go producers (idempotent, acks=all, the
//     client's defaults otherwise; bootstrap: all three members) each
//     produce a keyed record every -interval into a topic of -partitions
//     partitions. Warm (every producer acknowledged on every partition),
//     member r mod 3 is killed with SIGKILL. A producer is acknowledged
//     again once every record it produced before the kill is acknowledged
//     and a record it produced after the kill to a partition the victim led
//     (in that producer's metadata at the kill) is acknowledged; the
//     round's figure is the slowest producer's. The victim is restarted and
//     the fleet waited for (three alive in every member's view) before the
//     next round, which starts fresh producers (a client at default settings
//     would not learn of the restarted member for 5 minutes). -rounds at the
//     client's defaults (metadata max age 5m), then -rounds with the max age
//     lowered to -max-age. With -java (the default) a Java kafka-clients
//     producer (FleetProducer.java, compiled with javac against the Kafka
//     jars) runs alongside at its defaults (then metadata.max.age.ms
//     lowered likewise) and is reported apart.
//
// With -idle-partitions (a list, e.g. 0,10000) the gossip and death
// phases run once per shape: before each, idle topics of 10 partitions
// with one record in each are created on the active cluster directly until
// there are that many idle partitions, and the fleet's mirror is waited
// for until it lists them all caught up (issue 20: the fleet at 10,000
// partitions). Each switch and each restart of a killed member is then
// followed by a wait for the mirror caught up again (every writer
// restarted the other way, or handed back), which is timed and reported.
// -members runs a fleet of that many members instead of three.
//
// Medians of the rounds with min and max are printed with the issue's
// floors; -out writes them as markdown. -phases runs a part only (e.g.
// -phases gossip); -log-level debug makes the members log memberlist's
// traffic.
//
//	go run ./conformance/fleetbench -out docs/FLEET-BENCHMARKS.md
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

type options struct {
	rounds           int
	producers        int
	partitions       int
	interval         time.Duration
	maxAge           time.Duration
	mirrorBytes      int64
	mirrorPartitions int
	mirrorRounds     int
	logLevel         string
	phases           string
	java             bool
	out              string
	idle             []int // idle partitions of each shape, ascending
	members          int
}

func main() {
	var o options
	var mb, idle string
	fs := flag.NewFlagSet("fleetbench", flag.ExitOnError)
	fs.IntVar(&o.rounds, "rounds", 5, "member deaths per client setting, and planned switches (medians of this many)")
	fs.IntVar(&o.producers, "producers", 4, "producers during the member deaths")
	fs.IntVar(&o.partitions, "partitions", 12, "partitions of the topic produced to during the member deaths")
	fs.DurationVar(&o.interval, "interval", 10*time.Millisecond, "each producer produces one record this often")
	fs.DurationVar(&o.maxAge, "max-age", 2*time.Second, "the lowered metadata max age of the second set of member deaths")
	fs.StringVar(&mb, "mirror-bytes", "1GiB", "record value bytes the mirror copies in each mirror round (KiB, MiB, GiB)")
	fs.IntVar(&o.mirrorPartitions, "mirror-partitions", 8, "partitions of each mirror round's topic")
	fs.IntVar(&o.mirrorRounds, "mirror-rounds", 3, "mirror copies with one member and with three (alternating)")
	fs.StringVar(&o.logLevel, "log-level", "info", "the members' log_level (their logs go to $TMPDIR/fleetbench-member-N.log)")
	fs.BoolVar(&o.java, "java", true, "also run a Java kafka-clients producer (javac and java needed) during the member deaths")
	fs.StringVar(&o.phases, "phases", "mirror,gossip,death", "the parts to run, comma-separated (the report shows only what ran)")
	fs.StringVar(&o.out, "out", "", "write the results as markdown to this file")
	fs.StringVar(&idle, "idle-partitions", "0", "idle mirrored partitions (topics of 10 partitions, one record in each) the gossip and death phases run with; a comma-separated list runs them once per shape, ascending (e.g. 0,10000)")
	fs.IntVar(&o.members, "members", 3, "members of the fleet")
	fs.Parse(os.Args[1:])
	for _, f := range strings.Split(idle, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n%idleTopicPartitions != 0 || (len(o.idle) > 0 && n <= o.idle[len(o.idle)-1]) {
			fmt.Fprintf(os.Stderr, "fleetbench: -idle-partitions %q: ascending multiples of %d\n", idle, idleTopicPartitions)
			os.Exit(2)
		}
		o.idle = append(o.idle, n)
	}
	n, err := benchutil.ParseBytes(mb)
	if err != nil || n < 1024 {
		fmt.Fprintln(os.Stderr, "fleetbench: -mirror-bytes:", mb, err)
		os.Exit(2)
	}
	o.mirrorBytes = n
	if o.rounds < 1 || o.producers < 1 || o.mirrorRounds < 1 || o.partitions < 3 || o.members < 2 {
		fmt.Fprintln(os.Stderr, "fleetbench: -rounds, -producers and -mirror-rounds must be at least 1, -partitions at least 3, -members at least 2")
		os.Exit(2)
	}
	benchutil.Run("fleetbench", "Ferry and Kafka", func(ctx context.Context) error { return run(ctx, o) })
}

// deathTopic is the topic the death phase produces to.
const deathTopic = "fleetbench-death"

// step logs one line of progress.
var step = benchutil.Step

// bench is one run: the clusters, the fleet, and what it measured.
type bench struct {
	o                options
	primary, standby *kafkatest.Cluster
	fleet            *testbed
	mirror           map[int][]mirrorResult // members → rounds
	shapes           []*shape
	cur              *shape // the shape being measured
	idleTopics       int    // idle topics created so far
	warmup           time.Duration
	deathPartitions  int // partitions of deathTopic, once created
	started          time.Time
	machine          benchutil.Machine
	javaCP           string // class path of FleetProducer; "" without -java
}

func run(ctx context.Context, o options) error {
	b := &bench{o: o, mirror: map[int][]mirrorResult{}, started: time.Now(), machine: benchutil.ReadMachine()}
	step("starting two 1-broker Kafka %s clusters (primary, standby)", kafkatest.Version())
	clusters, err := benchutil.StartClusters("fleetbench-", "primary", "standby")
	if err != nil {
		return err
	}
	defer benchutil.CloseClusters(clusters)
	b.primary, b.standby = clusters["primary"], clusters["standby"]
	dir, err := os.MkdirTemp("", "fleetbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	step("building cmd/ferry")
	bin, err := benchutil.BuildFerry(ctx, dir)
	if err != nil {
		return err
	}
	if o.java && strings.Contains(o.phases, "death") {
		step("compiling the Java producer")
		if b.javaCP, err = compileJava(dir); err != nil {
			return fmt.Errorf("%w (run with -java=false to leave the Java producer out)", err)
		}
	}
	if b.fleet, err = newTestbed(dir, bin, b.primary, b.standby, o.members, o.logLevel); err != nil {
		return err
	}
	defer b.fleet.stopAll()
	step("member logs: %s", strings.Join(func() []string {
		var out []string
		for _, m := range b.fleet.members {
			out = append(out, m.log)
		}
		return out
	}(), ", "))

	all := b.fleet.ids()
	phase := func(name string) bool { return slices.Contains(strings.Split(o.phases, ","), name) }
	if !phase("mirror") {
		for _, m := range b.fleet.members {
			if err := b.fleet.start(m, b.fleet.allSeeds()); err != nil {
				return err
			}
		}
	}
	for r := range o.mirrorRounds {
		if !phase("mirror") {
			break
		}
		for _, ids := range [][]int32{{0}, all} {
			res, err := b.measureMirror(ctx, ids, r)
			if err != nil {
				return fmt.Errorf("mirror with %d member(s): %w", len(ids), err)
			}
			b.mirror[len(ids)] = append(b.mirror[len(ids)], res)
			if r < o.mirrorRounds-1 || len(ids) == 1 {
				b.fleet.stopAll()
			}
		}
	}
	if err := b.fleet.waitAlive(ctx, all...); err != nil {
		return err
	}

	if phase("death") {
		// Before the shapes, so that every shape mirrors it.
		if err := b.createTopic(ctx, b.fleet.members[0], deathTopic, o.partitions); err != nil {
			return err
		}
		b.deathPartitions = o.partitions
	}
	if phase("gossip") {
		// The first switch on fresh clusters creates the routing state
		// topic and waits for its leader (seconds): not measured.
		if _, _, err := b.waitCaughtUp(ctx, 5*time.Minute); err != nil {
			return err
		}
		st, err := b.fleet.status(ctx, b.fleet.members[0])
		if err != nil {
			return err
		}
		to := "standby"
		if st.Routing.Active == "standby" {
			to = "primary"
		}
		took, err := b.switchTo(ctx, b.fleet.members[0], to)
		if err != nil {
			return fmt.Errorf("warm-up switch: %w", err)
		}
		b.warmup = took
		step("warm-up switch → %s (not measured): answer %v", to, ms2(took))
	}
	for _, n := range o.idle {
		b.cur = &shape{idle: n, deaths: map[string][]deathRound{}}
		b.shapes = append(b.shapes, b.cur)
		if err := b.grow(ctx, n); err != nil {
			return fmt.Errorf("%d idle partitions: %w", n, err)
		}
		if phase("gossip") {
			if err := b.measureGossip(ctx); err != nil {
				return fmt.Errorf("gossip: %w", err)
			}
		}
		if phase("death") {
			for _, v := range b.variants() {
				step("member deaths, clients at %s", v.desc)
				if err := b.measureDeath(ctx, v, deathTopic); err != nil {
					return fmt.Errorf("member death: %w", err)
				}
			}
		}
		b.cur.memEnd = b.memory(ctx)
		step("%d idle partitions: members at the end: %s", n, b.cur.memEnd)
	}
	b.fleet.stopAll()
	return b.report()
}
