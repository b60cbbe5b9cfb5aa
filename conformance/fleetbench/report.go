package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/membership"
)

// The floors of issue 9 §6.
const (
	deathFloor = 10 * time.Second // every producer acknowledged again, default client settings
	genFloor   = time.Second      // the new generation on every member after the flip
)

func dur(xs []time.Duration) string {
	if len(xs) == 0 {
		return "—"
	}
	m, lo, hi := benchutil.Spread(xs)
	return fmt.Sprintf("%s (%s – %s)", ms2(m), ms2(lo), ms2(hi))
}

// verdictRounds judges a floor on the median and says how many rounds
// were over it.
func verdictRounds(xs []time.Duration, floor time.Duration) string {
	m, _, _ := benchutil.Spread(xs)
	over := 0
	for _, x := range xs {
		if x > floor {
			over++
		}
	}
	switch {
	case m > floor:
		return fmt.Sprintf("**NOT met** (%d of %d rounds over)", over, len(xs))
	case over > 0:
		return fmt.Sprintf("met on the median; **%d of %d rounds over**", over, len(xs))
	}
	return "met"
}

func (b *bench) report() error {
	m := b.machine
	var sb strings.Builder
	ml := memberlist.DefaultLANConfig()
	ml.PushPullInterval = membership.DefaultPushPullInterval
	fmt.Fprintf(&sb, "# Fleet benchmark\n\n")
	fmt.Fprintf(&sb, "`%s` on %d CPUs (%s), %.0f GiB, Linux %s, load %s at the start, Go %s, Kafka %s (two 1-broker KRaft clusters, primary and standby, on this machine), %s, franz-go clients; the run took %v.\n\n",
		benchutil.Command("./conformance/fleetbench", os.Args[1:]), m.CPUs, m.Model, m.MemGiB, m.Kernel, m.Load, m.GoVersion, kafkatest.Version(),
		time.Now().Format("2006-01-02"), time.Since(b.started).Round(time.Second))
	fmt.Fprintf(&sb, "Three `ferry serve` members (`fleet` section: gossip on loopback, a key file, seeded with each other; one lane each; the mirror on, `mirror.sync_interval: 1s`) in front of both clusters. "+
		"Settings that shape the numbers, all defaults: `fleet.write_lease` 1.5s; memberlist's LAN profile (Ferry sets only the push-pull interval): probe interval %v, probe timeout %v (a member whose heartbeats, sent each quarter probe interval, stop for the two together is suspect to the others), suspicion multiplier %d (memberlist's dead after %d × probe interval × max(1, log10(members)) of its own suspicion, shortened by other members' confirmations), gossip interval %v, push-pull %v. "+
		"Every process (two brokers, three members, the load and the pollers) shares the machine's %d cores.\n\n",
		ml.ProbeInterval, ml.ProbeTimeout, ml.SuspicionMult, ml.SuspicionMult, ml.GossipInterval, ml.PushPullInterval, m.CPUs)

	// Summary.
	var deathDef, deathLow, goneDef, goneLow, javaDef, javaLow []time.Duration
	for _, d := range b.deaths["default"] {
		deathDef = append(deathDef, d.recovered)
		goneDef = append(goneDef, d.gone)
		if d.java >= 0 {
			javaDef = append(javaDef, d.java)
		}
	}
	for _, d := range b.deaths["lowered"] {
		deathLow = append(deathLow, d.recovered)
		goneLow = append(goneLow, d.gone)
		if d.java >= 0 {
			javaLow = append(javaLow, d.java)
		}
	}
	var answer, serving, servingAfter, gossiped, gossipedAfter, polls []time.Duration
	for _, s := range b.switches {
		answer = append(answer, s.answer)
		serving = append(serving, s.serving)
		servingAfter = append(servingAfter, s.serving-s.answer)
		gossiped = append(gossiped, s.gossiped)
		gossipedAfter = append(gossipedAfter, s.gossiped-s.answer)
		polls = append(polls, s.polls...)
	}
	var mb1, mb3 []float64
	for _, r := range b.mirror[1] {
		mb1 = append(mb1, r.mbps())
	}
	for _, r := range b.mirror[3] {
		mb3 = append(mb3, r.mbps())
	}
	m1, m1lo, m1hi := benchutil.Spread(mb1)
	m3, m3lo, m3hi := benchutil.Spread(mb3)
	pm, _, _ := benchutil.Spread(polls)
	variants := b.variants()

	fmt.Fprintf(&sb, "Medians of %d (the mirror rows: of %d), with the lowest and highest in brackets.\n\n", b.o.rounds, b.o.mirrorRounds)
	fmt.Fprintf(&sb, "| measure | result | floor | |\n|---|---|---|---|\n")
	fmt.Fprintf(&sb, "| kill -9 of a member → every franz-go producer acknowledged again, clients at their defaults (metadata max age 5m) | %s | ≤ 10 s | %s |\n", dur(deathDef), verdictRounds(deathDef, deathFloor))
	fmt.Fprintf(&sb, "| the same, metadata max age lowered to %v | %s | | |\n", b.o.maxAge, dur(deathLow))
	if len(javaDef) > 0 {
		fmt.Fprintf(&sb, "| kill -9 of a member → the Java kafka-clients producer acknowledged again, at its defaults (metadata.max.age.ms 5 min) | %s | ≤ 10 s | %s |\n", dur(javaDef), verdictRounds(javaDef, deathFloor))
		fmt.Fprintf(&sb, "| the same, metadata.max.age.ms lowered to %d | %s | | |\n", b.o.maxAge.Milliseconds(), dur(javaLow))
	}
	fmt.Fprintf(&sb, "| kill -9 → both survivors' gossip no longer lists the member alive (default / lowered rounds) | %s / %s | | |\n", dur(goneDef), dur(goneLow))
	fmt.Fprintf(&sb, "| planned switch: call → answer | %s | | |\n", dur(answer))
	fmt.Fprintf(&sb, "| planned switch: answer (the flip) → every member serving the new generation (`/status` `routing.generation`) | %s | ≤ 1 s | %s |\n", dur(servingAfter), verdictRounds(servingAfter, genFloor))
	fmt.Fprintf(&sb, "| planned switch: call → every member serving the new generation | %s | | |\n", dur(serving))
	fmt.Fprintf(&sb, "| planned switch: answer → every member's `/status` listing every member at the new generation by gossip (`members[].gossip_generation`) | %s | ≤ 1 s | %s |\n", dur(gossipedAfter), verdictRounds(gossipedAfter, genFloor))
	fmt.Fprintf(&sb, "| planned switch: call → the same | %s | | |\n", dur(gossiped))
	fmt.Fprintf(&sb, "| mirror, one member, MB/s | %.1f (%.1f – %.1f) | | |\n", m1, m1lo, m1hi)
	fmt.Fprintf(&sb, "| mirror, three members, MB/s | %.1f (%.1f – %.1f) | | |\n", m3, m3lo, m3hi)
	fmt.Fprintf(&sb, "| three / one | %.2f× | | |\n", m3/m1)
	fmt.Fprintf(&sb, "\n")
	fmt.Fprintf(&sb, "The floors are judged on the medians; a round over a floor is counted beside the verdict.\n\n")
	slowGossip := 0
	for _, s := range b.switches {
		if s.gossiped-s.answer > genFloor {
			slowGossip++
		}
	}
	if len(b.switches) > 0 {
		fmt.Fprintf(&sb, "**The gossiped generation can be much later than the routing.** In %d of %d switches of this run some member's gossip (`/status` `members[].gossip_generation`) still had another member at the old generation more than 1 s after the answer (the slowest: %s). "+
			"When it happens, the member's gossiped metadata (memberlist's alive message carrying its new generation) never goes out, and the next push-pull (every %v, with one member at a time) carries it: hashicorp/memberlist %s's TransmitLimitedQueue drops a queued broadcast when a member's update invalidates its previous alive message and that was the only one queued (the queue's id counter is reset while the new message keeps its id, and the next broadcast of the same length, which every member's metadata has, takes the same key in the B-tree and replaces it; open upstream: hashicorp/memberlist#263, #322). "+
			"Whether it strikes depends on the order of broadcasts within a gossip interval, so runs differ. Routing does not depend on it — the switch installs the generation on every member by acknowledged calls before it answers, which is the \"serving\" figure — and `/status`'s `members[].generation` is what each member answers of itself; the generation in its gossiped metadata (`members[].gossip_generation`), and any other metadata a member gossips, can be up to a push-pull interval late.\n\n",
			slowGossip, len(b.switches), ms2(slices.Max(gossipedAfter)), ml.PushPullInterval, memberlistVersion())
	}

	if len(b.deaths["default"])+len(b.deaths["lowered"]) > 0 {
		// Member deaths.
		fmt.Fprintf(&sb, "## Member death\n\n")
		second := 0
		for _, d := range b.deaths["default"] {
			if d.gone >= 0 && d.recovered-d.gone > 4*time.Second {
				second++
			}
		}
		fmt.Fprintf(&sb, "What shapes it: the survivors stop naming the dead member once it is suspect (its heartbeats silent for a probe interval and the probe timeout); a franz-go producer refreshes its metadata when its connection to the dead member fails, but at most once per metadata min age (5 s by default), and a refresh answered before the survivors have dropped the member still names it as a leader, so the producer waits for the next refresh. "+
			"At default settings, %d of %d rounds were acknowledged again more than 4 s after the survivors dropped the member (a second refresh). With the max age lowered, franz-go also needs the min age lowered (it refuses a max age below the min age), and the refreshes come every %v. kafka-clients asks for new metadata after a failed connection with a backoff of 100 ms growing to 1 s (`retry.backoff.ms`, `retry.backoff.max.ms`), not once per 5 s, which is why the Java producer comes back sooner.\n\n",
			second, len(b.deaths["default"]), b.o.maxAge)
		fmt.Fprintf(&sb, "%d franz-go producers, each its own client with all three members as bootstrap, idempotent, acks=all, one keyed record (~40 bytes, 257 keys per producer) every %v, asynchronously, into a topic of %d partitions (RF 1) on the active cluster through the fleet; the mirror copies it to the other cluster meanwhile. "+
			"Each round starts fresh producers, waits until every producer has been acknowledged on every partition and none has a record outstanding for over a second, then 2 s more, notes which partitions the victim leads in each producer's metadata, and kills member r mod 3 with SIGKILL. "+
			"**A producer is acknowledged again** when every record it produced before the kill has been acknowledged (those the victim held included) and a record it produced after the kill to a partition the victim led has been acknowledged: from then on what it sends through the dead member's share of the partitions is answered again, which is when an application would stop seeing stalled sends. The round's figure is the slowest producer's. "+
			"Then the member is restarted, and every member must list three alive and a Metadata request through every member must name all three before the next round. Client settings: %s; then %s.\n\n",
			b.o.producers, b.o.interval, b.o.partitions, variants[0].desc, variants[1].desc)
		if b.javaCP != "" {
			fmt.Fprintf(&sb, "A Java producer (Apache kafka-clients %s, `conformance/fleetbench/FleetProducer.java`: its own JVM, all three members as bootstrap, one keyed record every %v, `send` with a callback) runs alongside in every round and is measured the same way, reported apart: %s; then %s (acks=all and idempotence are kafka-clients' defaults).\n\n",
				kafkatest.Version(), b.o.interval, variants[0].javaDesc, variants[1].javaDesc)
		}
		fmt.Fprintf(&sb, "\"Leaders at the kill\" is how many partitions each member led in the producers' metadata (one entry per distinct view). \"Restart\" is, after the victim was started again, when every member's `/status` listed three alive and when a Metadata request through every member named all three (the next round waits for both): a survivor that had the dead member only suspect sees it come back with no memberlist event, so its broker list follows at its next half-probe-interval check.\n\n")
		fmt.Fprintf(&sb, "| client settings | round | member killed | partitions it led | leaders at the kill | every franz-go producer acknowledged again | each franz-go producer | Java producer | survivors' gossip dropped it | longest wait of a record sent around the kill | records failed | restart: `/status` / Metadata |\n|---|--:|--:|--:|---|--:|---|--:|--:|--:|--:|--:|\n")
		for _, v := range variants {
			for i, d := range b.deaths[v.name] {
				gone := ms2(d.gone)
				if d.gone < 0 {
					gone = "not within a minute"
				}
				java := "—"
				if d.java >= 0 {
					java = ms2(d.java)
				}
				fmt.Fprintf(&sb, "| %s | %d | %d | %d | %s | %s | %s | %s | %s | %s | %d | %s / %s |\n", v.name, i+1, d.victim, d.led, d.distinctViews, ms2(d.recovered), strings.Join(strings.Fields(strings.Trim(durs(d.each), "[]")), ", "), java, gone, ms2(d.worst), d.errs, ms2(d.aliveAfter), ms2(d.metadataAfter))
			}
		}
		fmt.Fprintf(&sb, "\n")

	}
	if len(b.switches) > 0 {
		// Switches.
		fmt.Fprintf(&sb, "## The new generation across the fleet\n\n")
		fmt.Fprintf(&sb, "%d planned switches, alternating the direction, each asked of member r mod 3 (`POST /switchover`, `{\"mode\": \"planned\"}`) with the mirror caught up and no client traffic. "+
			"Every member's `/status` is polled back to back (2 ms between an answer and the next request; a `/status` answered in %s, median, so that is the resolution); a member counts from the first answer that shows it. "+
			"\"Serving\" is the member's own `routing.generation`; \"gossip\" is its `members` list showing every member alive with the new generation in its gossiped metadata (`gossip_generation`). "+
			"A negative time after the answer means every member already served the new generation when the switch answered (the switch installs it on every member it reaches before answering).\n\n",
			len(b.switches), ms2(pm))
		fmt.Fprintf(&sb, "| round | to | asked of | call → answer | call → every member serving | answer → every member serving | call → every member's gossip | answer → every member's gossip |\n|--:|---|--:|--:|--:|--:|--:|--:|\n")
		for i, s := range b.switches {
			fmt.Fprintf(&sb, "| %d | %s | %d | %s | %s | %s | %s | %s |\n", i+1, s.to, s.via, ms2(s.answer), ms2(s.serving), ms2(s.serving-s.answer), ms2(s.gossiped), ms2(s.gossiped-s.answer))
		}
		fmt.Fprintf(&sb, "\n")

	}
	if len(b.mirror[1])+len(b.mirror[3]) > 0 {
		// Mirror.
		fmt.Fprintf(&sb, "## The mirror with one member and with three\n\n")
		fmt.Fprintf(&sb, "Each round writes %s of 1 KiB records (franz-go, round-robin over %d partitions, defaults otherwise: snappy batches, which the mirror copies as they are) straight into a fresh topic on the primary while no member runs, creates the same topic on the standby (so that the copy does not wait for a new topic's leaders), then starts one member alone or all three together (seeded with each other) and polls the standby's high watermarks every 20 ms. "+
			"**MB/s** is record value bytes (10^6) over the copy: from the last poll that saw none of the records on the standby to the first that saw all of them. \"Start → all\" adds the members' start-up (process start, joining, the first write lease, the writers' first fetch). "+
			"With three members the partitions' writers are spread over them by rendezvous hashing; \"handed over\" counts partitions whose writer moved from one member to another during the round (e.g. taken by a member that was alone for a moment, then given up as the others joined). "+
			"All five processes share %d cores, so three members cannot be expected to beat one here: the figure shows what spreading the writers costs or gains on one machine, not what three machines would do. One round is one copy; %d rounds each, alternating.\n\n",
			benchutil.HumanBytes(b.o.mirrorBytes), b.o.mirrorPartitions, m.CPUs, b.o.mirrorRounds)
		fmt.Fprintf(&sb, "| round | members | MB/s | copy | start → first records on the standby | start → all | partitions per member at the end | handed over |\n|--:|--:|--:|--:|--:|--:|---|--:|\n")
		for r := range b.o.mirrorRounds {
			for _, n := range []int{1, 3} {
				if r >= len(b.mirror[n]) {
					continue
				}
				res := b.mirror[n][r]
				fmt.Fprintf(&sb, "| %d | %d | %.1f | %s | %s | %s | %v | %.0f |\n", r+1, n, res.mbps(), ms2(res.window), ms2(res.startup), ms2(res.total), owners(res.owners), res.handovers)
			}
		}
	}
	fmt.Print(sb.String())
	if b.o.out != "" {
		return os.WriteFile(b.o.out, []byte(sb.String()), 0o644)
	}
	return nil
}

// memberlistVersion is the hashicorp/memberlist module this binary was
// built with.
func memberlistVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/hashicorp/memberlist" {
				return d.Version
			}
		}
	}
	return "(unknown version)"
}

func owners(o map[int32]int) string {
	var parts []string
	for id := int32(0); id < 3; id++ {
		if n, ok := o[id]; ok {
			parts = append(parts, fmt.Sprintf("member %d: %d", id, n))
		}
	}
	return strings.Join(parts, ", ")
}
