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

// numbers spells small counts in the report's prose.
var numbers = []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}

func number(n int) string {
	if n < len(numbers) {
		return numbers[n]
	}
	return fmt.Sprint(n)
}

func title(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

// label names a shape in the report.
func (sh *shape) label() string {
	if sh.idle == 0 {
		return fmt.Sprintf("no idle partitions (%d mirrored)", sh.mirrored)
	}
	return fmt.Sprintf("%d idle partitions (%d mirrored)", sh.idle, sh.mirrored)
}

// shapeFigures is a shape's rounds gathered per measure.
type shapeFigures struct {
	def, low                                                                        deathFigures // the deaths at the clients' defaults, with the max age lowered
	mirrorAfter                                                                     []time.Duration
	answer, serving, servingAfter, gossiped, gossipedAfter, caughtUp, waited, polls []time.Duration
}

// deathFigures are the member deaths of one client setting.
type deathFigures struct{ recovered, gone, java []time.Duration }

func (sh *shape) figures() shapeFigures {
	var f shapeFigures
	for _, set := range []struct {
		name string
		to   *deathFigures
	}{{"default", &f.def}, {"lowered", &f.low}} {
		for _, d := range sh.deaths[set.name] {
			set.to.recovered = append(set.to.recovered, d.recovered)
			set.to.gone = append(set.to.gone, d.gone)
			if d.java >= 0 {
				set.to.java = append(set.to.java, d.java)
			}
			f.mirrorAfter = append(f.mirrorAfter, d.mirrorAfter)
		}
	}
	for _, s := range sh.switches {
		f.answer = append(f.answer, s.answer)
		f.serving = append(f.serving, s.serving)
		f.servingAfter = append(f.servingAfter, s.serving-s.answer)
		f.gossiped = append(f.gossiped, s.gossiped)
		f.gossipedAfter = append(f.gossipedAfter, s.gossiped-s.answer)
		f.caughtUp = append(f.caughtUp, s.caughtUp)
		f.waited = append(f.waited, s.waited)
		f.polls = append(f.polls, s.polls...)
	}
	return f
}

// judged is dur with the floor's verdict.
func judged(xs []time.Duration, floor time.Duration) string {
	if len(xs) == 0 {
		return "—"
	}
	return dur(xs) + ", " + verdictRounds(xs, floor)
}

func (b *bench) report() error {
	m := b.machine
	n := b.o.members
	var sb strings.Builder
	ml := memberlist.DefaultLANConfig()
	ml.PushPullInterval = membership.DefaultPushPullInterval
	fmt.Fprintf(&sb, "# Fleet benchmark\n\n")
	fmt.Fprintf(&sb, "`%s` on %d CPUs (%s), %.0f GiB, Linux %s, load %s at the start, Go %s, Kafka %s (two 1-broker KRaft clusters, primary and standby, on this machine), %s, franz-go clients; the run took %v.\n\n",
		benchutil.Command("./conformance/fleetbench", os.Args[1:]), m.CPUs, m.Model, m.MemGiB, m.Kernel, m.Load, m.GoVersion, kafkatest.Version(),
		time.Now().Format("2006-01-02"), time.Since(b.started).Round(time.Second))
	fmt.Fprintf(&sb, "%s `ferry serve` members (`fleet` section: gossip on loopback, a key file, seeded with each other; one lane each; the mirror on, `mirror.sync_interval: 1s`) in front of both clusters. "+
		"Settings that shape the numbers, all defaults: `fleet.write_lease` 1.5s; memberlist's LAN profile (Ferry sets only the push-pull interval): probe interval %v, probe timeout %v (a member whose heartbeats, sent each quarter probe interval, stop for the two together is suspect to the others), suspicion multiplier %d (memberlist's dead after %d × probe interval × max(1, log10(members)) of its own suspicion, shortened by other members' confirmations), gossip interval %v, push-pull %v. "+
		"Every process (two brokers, %s members, the load and the pollers) shares the machine's %d cores.\n\n",
		title(number(n)), ml.ProbeInterval, ml.ProbeTimeout, ml.SuspicionMult, ml.SuspicionMult, ml.GossipInterval, ml.PushPullInterval, number(n), m.CPUs)
	if len(b.shapes) > 1 || (len(b.shapes) == 1 && b.shapes[0].idle > 0) {
		fmt.Fprintf(&sb, "**Shapes.** The gossip and death phases ran once per column: before each, idle topics of %d partitions (RF 1) were created on the active cluster directly, 100 at a time with one record in each partition acknowledged before the next 100, until there were that many idle partitions, and the fleet's mirror (each member's writers, merged in `/status`) was waited for until it listed every one caught up; \"mirrored\" is every partition it listed then (the idle ones, the death phase's topic, the mirror phase's). "+
			"Idle partitions' writers park after ~15 s. A planned switch restarts every writer the other way, and the next switch's drain needs the standby caught up, so after each switch the bench waits until the fleet's mirror lists every partition caught up again (none starting), timed from the switch's call; likewise after each killed member's restart (its share of the writers handed back). "+
			"`/status` carries the whole fleet's mirror listing, gathered from every member at each request, so at thousands of partitions it is megabytes: its answer time, below, is the resolution of the switch figures.\n\n", idleTopicPartitions)
	}

	var mb1, mbn []float64
	for _, r := range b.mirror[1] {
		mb1 = append(mb1, r.mbps())
	}
	for _, r := range b.mirror[n] {
		mbn = append(mbn, r.mbps())
	}
	variants := b.variants()
	figs := make([]shapeFigures, len(b.shapes))
	for i, sh := range b.shapes {
		figs[i] = sh.figures()
	}
	row := func(measure string, cell func(f shapeFigures, sh *shape) string, floor string) {
		fmt.Fprintf(&sb, "| %s |", measure)
		for i, sh := range b.shapes {
			fmt.Fprintf(&sb, " %s |", cell(figs[i], sh))
		}
		fmt.Fprintf(&sb, " %s |\n", floor)
	}
	has := func(get func(f shapeFigures) []time.Duration) bool {
		for _, f := range figs {
			if len(get(f)) > 0 {
				return true
			}
		}
		return false
	}

	mirrorRows := ""
	if len(mb1)+len(mbn) > 0 {
		mirrorRows = fmt.Sprintf(" (the mirror rows: of %d)", b.o.mirrorRounds)
	}
	fmt.Fprintf(&sb, "Medians of %d%s, with the lowest and highest in brackets; the floors are judged on the medians, and a round over a floor is counted beside the verdict.\n\n", b.o.rounds, mirrorRows)
	fmt.Fprintf(&sb, "| measure |")
	for _, sh := range b.shapes {
		fmt.Fprintf(&sb, " %s |", sh.label())
	}
	fmt.Fprintf(&sb, " floor |\n|---|%s---|\n", strings.Repeat("---|", len(b.shapes)))
	if has(func(f shapeFigures) []time.Duration { return f.def.recovered }) {
		row("kill -9 of a member → every franz-go producer acknowledged again, clients at their defaults (metadata max age 5m)", func(f shapeFigures, _ *shape) string { return judged(f.def.recovered, deathFloor) }, "≤ 10 s")
		row(fmt.Sprintf("the same, metadata max age lowered to %v", b.o.maxAge), func(f shapeFigures, _ *shape) string { return dur(f.low.recovered) }, "")
		if has(func(f shapeFigures) []time.Duration { return f.def.java }) {
			row("kill -9 of a member → the Java kafka-clients producer acknowledged again, at its defaults (metadata.max.age.ms 5 min)", func(f shapeFigures, _ *shape) string { return judged(f.def.java, deathFloor) }, "≤ 10 s")
			row(fmt.Sprintf("the same, metadata.max.age.ms lowered to %d", b.o.maxAge.Milliseconds()), func(f shapeFigures, _ *shape) string { return dur(f.low.java) }, "")
		}
		row("kill -9 → every survivor's gossip no longer lists the member alive (default / lowered rounds)", func(f shapeFigures, _ *shape) string { return dur(f.def.gone) + " / " + dur(f.low.gone) }, "")
		row("the killed member's restart → the fleet's mirror caught up (its writers handed back), all rounds", func(f shapeFigures, _ *shape) string { return dur(f.mirrorAfter) }, "")
	}
	if has(func(f shapeFigures) []time.Duration { return f.answer }) {
		row("planned switch: call → answer", func(f shapeFigures, _ *shape) string { return dur(f.answer) }, "")
		row("planned switch: answer (the flip) → every member serving the new generation (`/status` `routing.generation`)", func(f shapeFigures, _ *shape) string { return judged(f.servingAfter, genFloor) }, "≤ 1 s")
		row("planned switch: call → every member serving the new generation", func(f shapeFigures, _ *shape) string { return dur(f.serving) }, "")
		row("planned switch: answer → every member's `/status` listing every member at the new generation by gossip (`members[].gossip_generation`)", func(f shapeFigures, _ *shape) string { return judged(f.gossipedAfter, genFloor) }, "≤ 1 s")
		row("planned switch: call → the same", func(f shapeFigures, _ *shape) string { return dur(f.gossiped) }, "")
		row("planned switch: call → the fleet's mirror caught up the other way (every writer restarted; the next switch waits for it)", func(f shapeFigures, _ *shape) string { return dur(f.caughtUp) }, "")
		row("`/status` answered in, while polled during the switches (median of every answer)", func(f shapeFigures, _ *shape) string {
			if len(f.polls) == 0 {
				return "—"
			}
			pm, _, _ := benchutil.Spread(f.polls)
			return ms2(pm)
		}, "")
	}
	row("growth: creating the idle partitions → the fleet's mirror listing them all caught up", func(_ shapeFigures, sh *shape) string {
		if sh.idle == 0 {
			return "—"
		}
		return ms2(sh.grow)
	}, "")
	row("largest member RSS after the growth / at the end", func(_ shapeFigures, sh *shape) string {
		return fmt.Sprintf("%d MiB / %d MiB", sh.memStart.maxRSS(), sh.memEnd.maxRSS())
	}, "")
	if len(mb1)+len(mbn) > 0 {
		m1, m1lo, m1hi := benchutil.Spread(mb1)
		mn, mnlo, mnhi := benchutil.Spread(mbn)
		blank := strings.Repeat(" |", len(b.shapes)-1)
		fmt.Fprintf(&sb, "| mirror, one member, MB/s (before the shapes) | %.1f (%.1f – %.1f) |%s |\n", m1, m1lo, m1hi, blank)
		fmt.Fprintf(&sb, "| mirror, %s members, MB/s | %.1f (%.1f – %.1f) |%s |\n", number(n), mn, mnlo, mnhi, blank)
		fmt.Fprintf(&sb, "| %s / one | %.2f× |%s |\n", number(n), mn/m1, blank)
	}
	fmt.Fprintf(&sb, "\n")
	fmt.Fprintf(&sb, "Members' resident set (VmRSS) and open descriptors:\n\n")
	for _, sh := range b.shapes {
		fmt.Fprintf(&sb, "- %s: after the growth %s; at the end %s\n", sh.label(), sh.memStart, sh.memEnd)
	}
	fmt.Fprintf(&sb, "\n")

	var switches []switchRound
	for _, sh := range b.shapes {
		switches = append(switches, sh.switches...)
	}
	slowGossip := 0
	var gossipedAfter []time.Duration
	for _, s := range switches {
		gossipedAfter = append(gossipedAfter, s.gossiped-s.answer)
		if s.gossiped-s.answer > genFloor {
			slowGossip++
		}
	}
	if len(switches) > 0 {
		fmt.Fprintf(&sb, "**The gossiped generation can be much later than the routing.** In %d of %d switches of this run some member's gossip (`/status` `members[].gossip_generation`) still had another member at the old generation more than 1 s after the answer (the slowest: %s). "+
			"When it happens, the member's gossiped metadata (memberlist's alive message carrying its new generation) never goes out, and the next push-pull (every %v, with one member at a time) carries it: hashicorp/memberlist %s's TransmitLimitedQueue drops a queued broadcast when a member's update invalidates its previous alive message and that was the only one queued (the queue's id counter is reset while the new message keeps its id, and the next broadcast of the same length, which every member's metadata has, takes the same key in the B-tree and replaces it; open upstream: hashicorp/memberlist#263, #322). "+
			"Whether it strikes depends on the order of broadcasts within a gossip interval, so runs differ. Routing does not depend on it — the switch installs the generation on every member by acknowledged calls before it answers, which is the \"serving\" figure — and `/status`'s `members[].generation` is what each member answers of itself; the generation in its gossiped metadata (`members[].gossip_generation`), and any other metadata a member gossips, can be up to a push-pull interval late.\n\n",
			slowGossip, len(switches), ms2(slices.Max(gossipedAfter)), ml.PushPullInterval, memberlistVersion())
	}

	heading := func(sh *shape) {
		if len(b.shapes) > 1 || sh.idle > 0 {
			fmt.Fprintf(&sb, "### %s\n\n", title(sh.label()))
		}
	}
	deaths := 0
	for _, sh := range b.shapes {
		deaths += len(sh.deaths["default"]) + len(sh.deaths["lowered"])
	}
	if deaths > 0 {
		// Member deaths.
		fmt.Fprintf(&sb, "## Member death\n\n")
		second, rounds := 0, 0
		for _, sh := range b.shapes {
			for _, d := range sh.deaths["default"] {
				rounds++
				if d.gone >= 0 && d.recovered-d.gone > 4*time.Second {
					second++
				}
			}
		}
		fmt.Fprintf(&sb, "What shapes it: the survivors stop naming the dead member once it is suspect (its heartbeats silent for a probe interval and the probe timeout); a franz-go producer refreshes its metadata when its connection to the dead member fails, but at most once per metadata min age (5 s by default), and a refresh answered before the survivors have dropped the member still names it as a leader, so the producer waits for the next refresh. "+
			"At default settings, %d of %d rounds were acknowledged again more than 4 s after the survivors dropped the member (a second refresh). With the max age lowered, franz-go also needs the min age lowered (it refuses a max age below the min age), and the refreshes come every %v. kafka-clients asks for new metadata after a failed connection with a backoff of 100 ms growing to 1 s (`retry.backoff.ms`, `retry.backoff.max.ms`), not once per 5 s, which is why the Java producer comes back sooner.\n\n",
			second, rounds, b.o.maxAge)
		fmt.Fprintf(&sb, "%d franz-go producers, each its own client with all %s members as bootstrap, idempotent, acks=all, one keyed record (~40 bytes, 257 keys per producer) every %v, asynchronously, into a topic of %d partitions (RF 1) on the active cluster through the fleet; the mirror copies it to the other cluster meanwhile. "+
			"Each round starts fresh producers, waits until every producer has been acknowledged on every partition and none has a record outstanding for over a second, then 2 s more, notes which partitions the victim leads in each producer's metadata, and kills member r mod %d with SIGKILL. "+
			"**A producer is acknowledged again** when every record it produced before the kill has been acknowledged (those the victim held included) and a record it produced after the kill to a partition the victim led has been acknowledged: from then on what it sends through the dead member's share of the partitions is answered again, which is when an application would stop seeing stalled sends. The round's figure is the slowest producer's. "+
			"Then the member is restarted, and every member must list all %s alive, a Metadata request through every member must name all %s, and the fleet's mirror must list every partition caught up (the restarted member's writers handed back) before the next round. Client settings: %s; then %s.\n\n",
			b.o.producers, number(n), b.o.interval, b.o.partitions, n, number(n), number(n), variants[0].desc, variants[1].desc)
		if b.javaCP != "" {
			fmt.Fprintf(&sb, "A Java producer (Apache kafka-clients %s, `conformance/fleetbench/FleetProducer.java`: its own JVM, all %s members as bootstrap, one keyed record every %v, `send` with a callback) runs alongside in every round and is measured the same way, reported apart: %s; then %s (acks=all and idempotence are kafka-clients' defaults).\n\n",
				kafkatest.Version(), number(n), b.o.interval, variants[0].javaDesc, variants[1].javaDesc)
		}
		fmt.Fprintf(&sb, "\"Leaders at the kill\" is how many partitions each member led in the producers' metadata (one entry per distinct view). \"Restart\" is, after the victim was started again, when every member's `/status` listed all alive, when a Metadata request through every member named all of them, and when the fleet's mirror was caught up again (the next round waits for all three): a survivor that had the dead member only suspect sees it come back with no memberlist event, so its broker list follows at its next half-probe-interval check.\n\n")
		for _, sh := range b.shapes {
			if len(sh.deaths["default"])+len(sh.deaths["lowered"]) == 0 {
				continue
			}
			heading(sh)
			fmt.Fprintf(&sb, "| client settings | round | member killed | partitions it led | leaders at the kill | every franz-go producer acknowledged again | each franz-go producer | Java producer | survivors' gossip dropped it | longest wait of a record sent around the kill | records failed | restart: `/status` / Metadata / mirror caught up |\n|---|--:|--:|--:|---|--:|---|--:|--:|--:|--:|--:|\n")
			for _, v := range variants {
				for i, d := range sh.deaths[v.name] {
					gone := ms2(d.gone)
					if d.gone < 0 {
						gone = "not within a minute"
					}
					java := "—"
					if d.java >= 0 {
						java = ms2(d.java)
					}
					fmt.Fprintf(&sb, "| %s | %d | %d | %d | %s | %s | %s | %s | %s | %s | %d | %s / %s / %s |\n", v.name, i+1, d.victim, d.led, d.distinctViews, ms2(d.recovered), strings.Join(strings.Fields(strings.Trim(durs(d.each), "[]")), ", "), java, gone, ms2(d.worst), d.errs, ms2(d.aliveAfter), ms2(d.metadataAfter), ms2(d.mirrorAfter))
				}
			}
			fmt.Fprintf(&sb, "\n")
		}
	}
	if len(switches) > 0 {
		// Switches.
		var polls []time.Duration
		for _, s := range switches {
			polls = append(polls, s.polls...)
		}
		pm, _, _ := benchutil.Spread(polls)
		fmt.Fprintf(&sb, "## The new generation across the fleet\n\n")
		fmt.Fprintf(&sb, "%d planned switches per shape, alternating the direction, each asked of member r mod %d (`POST /switchover`, `{\"mode\": \"planned\"}`) with the mirror caught up and no client traffic; before the first shape, one switch that is not measured (it answered in %s: the first switch on fresh clusters creates the routing state topic and waits for its leader). "+
			"Every member's `/status` is polled back to back (2 ms between an answer and the next request; a `/status` answered in %s, median over the run, so that is the resolution); a member counts from the first answer that shows it. "+
			"\"Serving\" is the member's own `routing.generation`; \"gossip\" is its `members` list showing every member alive with the new generation in its gossiped metadata (`gossip_generation`). "+
			"A negative time after the answer means every member already served the new generation when the switch answered (the switch installs it on every member it reaches before answering). "+
			"\"Mirror caught up\" is from the call until the fleet's mirror listed every partition caught up the other way; \"waited before\" is the wait for it before the call (after the growth, the previous switch or the death rounds).\n\n",
			b.o.rounds, n, ms2(b.warmup), ms2(pm))
		for _, sh := range b.shapes {
			if len(sh.switches) == 0 {
				continue
			}
			heading(sh)
			fmt.Fprintf(&sb, "| round | to | asked of | waited before | call → answer | call → every member serving | answer → every member serving | call → every member's gossip | answer → every member's gossip | call → mirror caught up | `/status` answered in (median) |\n|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
			for i, s := range sh.switches {
				sp, _, _ := benchutil.Spread(s.polls)
				fmt.Fprintf(&sb, "| %d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", i+1, s.to, s.via, ms2(s.waited), ms2(s.answer), ms2(s.serving), ms2(s.serving-s.answer), ms2(s.gossiped), ms2(s.gossiped-s.answer), ms2(s.caughtUp), ms2(sp))
			}
			fmt.Fprintf(&sb, "\n")
		}
	}
	if len(b.mirror[1])+len(b.mirror[n]) > 0 {
		// Mirror.
		fmt.Fprintf(&sb, "## The mirror with one member and with %s\n\n", number(n))
		fmt.Fprintf(&sb, "Each round writes %s of 1 KiB records (franz-go, round-robin over %d partitions, defaults otherwise: snappy batches, which the mirror copies as they are) straight into a fresh topic on the primary while no member runs, creates the same topic on the standby (so that the copy does not wait for a new topic's leaders), then starts one member alone or all %s together (seeded with each other) and polls the standby's high watermarks every 20 ms. "+
			"**MB/s** is record value bytes (10^6) over the copy: from the last poll that saw none of the records on the standby to the first that saw all of them. \"Start → all\" adds the members' start-up (process start, joining, the first write lease, the writers' first fetch). "+
			"With %s members the partitions' writers are spread over them by rendezvous hashing; \"handed over\" counts partitions whose writer moved from one member to another during the round (e.g. taken by a member that was alone for a moment, then given up as the others joined). "+
			"All %d processes share %d cores, so %s members cannot be expected to beat one here: the figure shows what spreading the writers costs or gains on one machine, not what %s machines would do. One round is one copy; %d rounds each, alternating.\n\n",
			benchutil.HumanBytes(b.o.mirrorBytes), b.o.mirrorPartitions, number(n), number(n), n+2, m.CPUs, number(n), number(n), b.o.mirrorRounds)
		fmt.Fprintf(&sb, "| round | members | MB/s | copy | start → first records on the standby | start → all | partitions per member at the end | handed over |\n|--:|--:|--:|--:|--:|--:|---|--:|\n")
		for r := range b.o.mirrorRounds {
			for _, k := range []int{1, n} {
				if r >= len(b.mirror[k]) {
					continue
				}
				res := b.mirror[k][r]
				fmt.Fprintf(&sb, "| %d | %d | %.1f | %s | %s | %s | %v | %.0f |\n", r+1, k, res.mbps(), ms2(res.window), ms2(res.startup), ms2(res.total), owners(res.owners, n), res.handovers)
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

func owners(o map[int32]int, members int) string {
	var parts []string
	for id := range int32(members) {
		if n, ok := o[id]; ok {
			parts = append(parts, fmt.Sprintf("member %d: %d", id, n))
		}
	}
	return strings.Join(parts, ", ")
}
