package conformance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	ferryadmin "github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/chaos"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/conformance/verifiable"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

var (
	// The suite replays one schedule, so that a run of it judges the
	// change under test rather than the luck of a draw. This seed found a
	// held batch of the Java producer refused for good after the active
	// broker came back (with the six kinds of then; the gossip cut,
	// added since, reshuffles its draw: it now opens with a cut during a
	// switch and kills the active broker next). `make chaos` draws new
	// ones (0).
	chaosSeed     = flag.Uint64("chaos.seed", 1796246214782181586, "TestChaos: the schedule's seed (0: drawn from the clock and printed)")
	chaosDuration = flag.Duration("chaos.duration", 75*time.Second, "TestChaos: how long faults are injected")
	chaosReport   = flag.String("chaos.report", "", "TestChaos: write the run's report (Markdown) to this file")
	chaosCopyLoop = flag.Bool("chaos.copy", true, "TestChaos: run the transactional copy loop too")
	chaosForced   = flag.Bool("chaos.forced", false, "TestChaos: draw forced switches too, with the active cluster stopped")
)

// chaosSwitchTimeout is each planned switch's timeout.
const chaosSwitchTimeout = 30 * time.Second

// chaosWriteLease is the members' write lease (the default): a paused
// member is stopped for up to twice it.
const chaosWriteLease = 1500 * time.Millisecond

// TestChaos runs a seeded, randomized schedule of faults (conformance/chaos)
// against three `ferry serve` members in front of two real Kafka clusters,
// under a workload all through the fleet — Kafka's VerifiableProducer
// (idempotent, acks=all), a VerifiableConsumer in a classic and one in a
// KIP-848 group, and a transactional copy loop (read_committed in, one
// transaction per round out and its offsets; -chaos.copy=false leaves it
// out) — and, beside Ferry, a transactional producer writing
// directly to the primary on a topic Ferry does not mirror (a bystander).
//
// Checked at the end, from the clusters read directly: every acknowledged
// record is on the active cluster at its acknowledged offset, and on the
// standby once the mirror caught up; each group read every acknowledged
// offset and never read below an offset it had committed; duplicates only
// where a member was cut off or killed mid-write, counted; the copy loop's
// output holds each input record once; the bystander
// was never fenced; every switch that answered 200 answered the one
// generation; no member panicked; every member ends on one generation.
//
// A failing run prints its seed; -chaos.seed replays its schedule. `make
// chaos` runs a long one and writes docs/CHAOS.md.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("conformance: real Kafka is not run in -short mode")
	}
	const (
		topic      = "chaos"
		copyTopic  = "chaos-copy"
		bystander  = "bystander"
		partitions = 6
		rate       = 200 // records a second
	)
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	faults := chaos.Draw(chaos.Config{Seed: seed, Duration: *chaosDuration, Members: 3, WriteLease: chaosWriteLease,
		MinGap: 3 * time.Second, MaxGap: 8 * time.Second, Forced: *chaosForced})
	replay := fmt.Sprintf("go test ./conformance -run 'TestChaos$' -v -args -chaos.seed=%d -chaos.duration=%v -chaos.copy=%v -chaos.forced=%v", seed, *chaosDuration, *chaosCopyLoop, *chaosForced)
	// One member's wall clock is off all run long: the switches it runs
	// are stamped by it (cmd/ferry/faults.go), and no decision may rest
	// on two members' clocks agreeing.
	skewed, skew := chaos.DrawSkew(seed, 3)
	t.Logf("chaos seed %d, %d faults, member %d's clock %v off (replay: %s)", seed, len(faults), skewed, skew, replay)
	defer func() {
		if t.Failed() {
			t.Logf("chaos seed %d failed; replay: %s", seed, replay)
		}
	}()

	bin, primary, standby := startPair(t, "chaos-primary", "chaos-standby", "faults")
	fl := &chaosFleet{t: t, bin: bin, clusters: map[string]*kafkatest.Cluster{"primary": primary, "standby": standby}, brokerFaults: map[string]int{}}
	fl.ms = startFerryFleet(t, bin, primary, standby, 3, func(s *fleetSeat) {
		s.unmirrored = bystander
		if s.nodeID == int32(skewed) {
			s.env = []string{"FERRY_FAULT_CLOCK_SKEW=" + skew.String()}
		}
	})
	for _, m := range fl.ms {
		fl.logs = append(fl.logs, m.log)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *chaosDuration+10*time.Minute)
	defer cancel()

	viaCl, err := kgo.NewClient(kgo.SeedBrokers(fl.ms[0].addr))
	if err != nil {
		t.Fatal(err)
	}
	defer viaCl.Close()
	createReadyTopic(ctx, t, kadm.NewClient(viaCl), topic, partitions, 1)
	by := startBystander(ctx, t, primary, bystander)

	bootstrap := strings.Join(fleetAddrs(fl.ms), ",")
	prod := verifiable.StartProducer(ctx, t, verifiable.ProducerConfig{Bootstrap: bootstrap, Topic: topic, Throughput: rate, Max: -1,
		Properties: map[string]string{"enable.idempotence": "true", "retries": "2147483647", "delivery.timeout.ms": "300000"}})
	cons := []*verifiable.Consumer{
		verifiable.StartConsumer(ctx, t, verifiable.ConsumerConfig{Bootstrap: bootstrap, Topic: topic, Group: "chaos-classic", Protocol: "classic"}),
		verifiable.StartConsumer(ctx, t, verifiable.ConsumerConfig{Bootstrap: bootstrap, Topic: topic, Group: "chaos-consumer", Protocol: "consumer"}),
	}
	var cp *chaosCopy
	if *chaosCopyLoop {
		createReadyTopic(ctx, t, kadm.NewClient(viaCl), copyTopic, partitions, 1)
		cp = startCopy(ctx, t, bootstrap, topic, copyTopic)
		fl.copyTopic = copyTopic
	}
	defer func() {
		if t.Failed() {
			t.Logf("VerifiableProducer stderr:\n%s", tail(prod.Stderr(), 3000))
			keepLog(t, "VerifiableProducer.log", prod.Stderr())
			for _, c := range cons {
				t.Logf("%s stderr:\n%s", c.Group, tail(c.Stderr(), 3000))
				keepLog(t, c.Group+".log", c.Stderr())
			}
		}
	}()
	testwait.Eventually(t, time.Minute, fmt.Sprintf("the producer to have %d acknowledged", rate), func() error {
		if n := prod.Acked(); n < rate {
			return fmt.Errorf("%d acknowledged", n)
		}
		return nil
	})

	report := &chaos.Report{Seed: seed, Duration: *chaosDuration, Faults: map[chaos.Kind]int{}, Outcomes: map[string]int{}, Skewed: skewed, Skew: skew}
	var answered []switchResult // every 200 a switch answered
	// The schedule's waits add up to the run's length; the faults take
	// time of their own (a broker's restart, 15 s here): the run stops
	// injecting once its length has passed on the wall.
	faulting := time.Now()
	for i, f := range faults {
		if time.Since(faulting)+f.After > *chaosDuration {
			report.Log = append(report.Log, fmt.Sprintf("(the run's %v passed: %d of the %d faults drawn injected)", *chaosDuration, i, len(faults)))
			break
		}
		select {
		case <-time.After(f.After):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		start := time.Now()
		met := fl.inject(ctx, f, report, &answered)
		report.Faults[f.Kind]++
		line := fmt.Sprintf("%d. after %v: %s — %s (%v)", i+1, f.After.Round(time.Millisecond), f, met, time.Since(start).Round(time.Millisecond))
		report.Log = append(report.Log, line)
		t.Log(line)
		// The next fault meets a whole fleet: every member back and
		// listing the others.
		waitAlive(t, fl.ms, nil, 90*time.Second)
		for _, l := range fl.repairMarkerTwice(ctx) {
			fl.markerRepairs = append(fl.markerRepairs, l)
			report.Log = append(report.Log, "   repaired: "+l)
			t.Log(l)
		}
	}

	// Every member ends on one generation.
	gen, active, agreed := fl.agree(60 * time.Second)
	report.Check("every member ends on one generation", agreed, fmt.Sprintf("generation %d, %s active", gen, active))

	// Every 200 named the one state of its generation: two switches never
	// made one generation twice.
	byGen := map[uint32]string{}
	twice := ""
	for _, a := range answered {
		if prev, ok := byGen[a.Generation]; ok && prev != a.Active {
			twice = fmt.Sprintf("generation %d answered with %s and %s active", a.Generation, prev, a.Active)
		}
		byGen[a.Generation] = a.Active
	}
	report.Check("no two switches made the same generation", twice == "", fmt.Sprintf("%d switches answered 200 %s", len(answered), twice))

	if err := prod.Stop(60 * time.Second); err != nil {
		t.Error(err)
	}
	acks := prod.Acks()
	report.Records = len(acks)
	// The producer retries without end for 5 minutes: a send that failed
	// met something stuck that long.
	sendErrs := prod.Errors()
	report.Check("no send of the producer failed", len(sendErrs) == 0,
		fmt.Sprintf("%d failed, %d acknowledged %s", len(sendErrs), len(acks), strings.Join(head3(sendErrs), "; ")))
	if len(acks) == 0 {
		t.Fatal("no record was acknowledged")
	}

	// Each group reads every acknowledged offset, but for what a forced
	// switch lost (checked below: inside the ranges it reported, or in
	// the residue before the stop).
	// An ack without an offset (-1) answered a batch sent again after
	// the switch that Ferry knew written before it, its answer lost
	// (DUPLICATE_SEQUENCE_NUMBER): it is looked for by value below.
	kept := slices.DeleteFunc(slices.Clone(acks), func(a verifiable.Ack) bool {
		return a.Offset < 0 || len(fl.forced) > 0 && (fl.lostAt(topic, a.Partition, a.Offset) || fl.forcedResidue(a.At))
	})
	unread := func(c *verifiable.Consumer) int { return verifiable.Unread(kept, c.Ranges()) }
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if unread(cons[0])+unread(cons[1]) == 0 {
			break
		}
	}
	// Issue 18's floor: a group reads again no more than the records
	// produced while the switches ran (what a consumer can have read and
	// not yet committed when its group moves), half a second's worth of
	// slack per switch; and while a broker of the active cluster was
	// down, which is Kafka's own (a group reloaded after its coordinator
	// restarts may make its members rejoin).
	var switching time.Duration
	for _, a := range answered {
		switching += a.Took + 500*time.Millisecond
	}
	floor := int((switching + fl.activeDown).Seconds() * rate)
	// A forced switch also takes a group back to the offsets the mirror
	// had copied (a second behind), and its readers past the fence read
	// the new records there: what it lost, and two seconds' worth more.
	var resets []time.Time
	for _, fs := range fl.forced {
		resets = append(resets, fs.oldAnswered)
		floor += int(2 * rate)
		for _, r := range fs.lost {
			switch {
			case r.Topic != topic:
			case r.To == routing.UnknownEnd:
				// As many as were acknowledged there from its start.
				for _, a := range acks {
					if a.Partition == r.Partition && r.Contains(a.Offset) {
						floor++
					}
				}
			default:
				floor += int(r.To - r.From)
			}
		}
	}
	for _, c := range cons {
		if err := c.Stop(60 * time.Second); err != nil {
			t.Error(err)
		}
		n := unread(c)
		_, again := verifiable.Read(c.Ranges())
		failed := 0
		for _, cm := range c.Commits() {
			if !cm.Success {
				failed++
			}
		}
		report.Check(c.Group+" read every acknowledged record", n == 0,
			fmt.Sprintf("%d of %d unread; %d read again; %d of %d commits failed", n, len(kept), again, failed, len(c.Commits())))
		report.Check(c.Group+" read again no more than was produced while switches ran", again <= floor,
			fmt.Sprintf("%d read again; %d produced in the %v the %d switches took and the %v the active cluster's broker was down",
				again, floor, switching.Round(time.Millisecond), len(answered), fl.activeDown.Round(time.Millisecond)))
		rewinds := belowCommitted(c, resets)
		report.Check(c.Group+" never read below an offset it had committed", len(rewinds) == 0, strings.Join(head3(rewinds), "; "))
	}

	// Every acknowledged record is on the active cluster at its offset,
	// and on the standby once the mirror caught up. (Nothing writes the
	// topic any more: each cluster is read once.)
	fl.markerRepairs = append(fl.markerRepairs, fl.repairMarkerTwice(ctx)...)
	st, caught, _ := fl.ms[0].mirrorCaughtUp(ctx, 2*time.Minute)
	var halted []string
	for _, p := range st.Partitions {
		if p.State == "halted" {
			halted = append(halted, fmt.Sprintf("%s[%d]: %s", p.Topic, p.Partition, p.Error))
		}
	}
	report.Check("the mirror catches up with the active cluster", caught,
		fmt.Sprintf("%d partitions halted %s; %d topics copied again after a marker written twice by the standby's coordinator (Kafka, RUNBOOK 5.4) %s",
			len(halted), strings.Join(head3(halted), "; "), len(fl.markerRepairs), strings.Join(fl.markerRepairs, "; ")))
	other := fl.other(active)
	on := map[string]map[partOff]string{}
	for _, name := range []string{active, other} {
		on[name] = readCommitted(t, ctx, fl.clusters[name], []string{topic})[topic]
		bad := []string{}
		listed, residue, unplaced := 0, 0, 0
		held := map[partValue]bool{}
		for po, v := range on[name] {
			held[partValue{po.p, v}] = true
		}
		for _, a := range acks {
			if a.Offset < 0 {
				unplaced++
				if !held[partValue{a.Partition, a.Value}] {
					bad = append(bad, fmt.Sprintf("%q acknowledged (as written before) in partition %d, not there", a.Value, a.Partition))
				}
				continue
			}
			if got := on[name][partOff{a.Partition, a.Offset}]; got != a.Value {
				switch {
				case fl.lostAt(topic, a.Partition, a.Offset):
					listed++
				case fl.forcedResidue(a.At):
					residue++
				default:
					bad = append(bad, fmt.Sprintf("%q acknowledged at %d/%d, %q there", a.Value, a.Partition, a.Offset, got))
				}
			}
		}
		role := "active"
		if name == other {
			role = "standby"
		}
		forced := ""
		if len(fl.forced) > 0 {
			forced = fmt.Sprintf("; lost by %d forced switches: %d inside the ranges reported, %d acknowledged in the second before the stop and not reported", len(fl.forced), listed, residue)
		}
		if unplaced > 0 {
			forced += fmt.Sprintf("; %d acknowledged without an offset (written before a switch, sent again after it), found by value", unplaced)
		}
		report.Check(fmt.Sprintf("every acknowledged record is on the %s cluster (%s) at its offset", role, name), len(bad) == 0,
			fmt.Sprintf("%d of %d not %s%s", len(bad), len(acks), strings.Join(head3(bad), "; "), forced))
	}
	// The idempotent producer's records keep their order in each
	// partition (a record written twice counts where it first landed).
	disorder := outOfOrder(on[active])
	var disorderText []string
	for _, d := range disorder {
		disorderText = append(disorderText, d.String())
	}
	report.Check("each partition holds the producer's records in the order sent", len(disorder) == 0, strings.Join(head3(disorderText), "; "))
	if len(disorder) > 0 {
		// Which producer ID and epoch wrote each, on either cluster
		// (the original write is on the cluster active then; the
		// mirror's copy carries its own writer's), and what the
		// members warned of producers: the trail to the cause.
		for _, d := range disorder[:min(3, len(disorder))] {
			for _, name := range []string{active, other} {
				t.Logf("disorder %s on %s: %s", d.String(), name, batchesAt(ctx, fl.clusters[name], topic, d.p, d.at, d.prevAt))
			}
		}
		warned := fl.logLines(producerWarning)
		for _, l := range warned[:min(40, len(warned))] {
			t.Logf("member warning: %s", l)
		}
	}
	dups := duplicates(on[active])
	cutOff := report.Faults[chaos.KillMember] + report.Faults[chaos.PauseMember] + report.Faults[chaos.CutGossip] + len(fl.forced)
	report.Check("duplicates only where a member was cut off or killed mid-write", dups == 0 || cutOff > 0,
		fmt.Sprintf("%d records written twice; %d member kills, pauses and cuts", dups, cutOff))

	// The copy loop catches up with its input, then each input record is
	// in its output once, read_committed.
	if cp != nil {
		var lack, dup, foreign []string
		var out map[partOff]string
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Second) {
			out = readCommitted(t, ctx, fl.clusters[active], []string{copyTopic})[copyTopic]
			lack, dup, foreign = copiedOnce(on[active], out)
			if len(lack) == 0 || time.Now().After(deadline) {
				break
			}
		}
		// A forced switch loses input and output the mirror had not
		// copied, and the group's offsets back to where the mirror had
		// copied them: input positions it lost were taken by new
		// records (copied again), copies it lost are missing or made
		// again. Those positions are counted, not failed.
		forgiven, recopied := 0, 0
		if len(fl.forced) > 0 {
			forgive := func(k string) bool {
				var p int32
				var o int64
				fmt.Sscanf(k, "%d/%d", &p, &o)
				for _, fs := range fl.forced {
					if fs.lostCopies[strings.Fields(k)[0]] {
						forgiven++
						return true
					}
				}
				if fl.lostAt(topic, p, o) {
					forgiven++
					return true
				}
				return false
			}
			lack = slices.DeleteFunc(lack, forgive)
			dup = slices.DeleteFunc(dup, forgive)
			foreign = slices.DeleteFunc(foreign, forgive)
			// The group's offsets reach the new cluster by the mirror's
			// periodic sync, its output as it is written: copied
			// before the stop and not yet in the synced offsets, an
			// input is copied again after the switch. Such a copy pair
			// straddles the switch's fence on the output.
			before := len(dup)
			at := map[string][]partOff{} // where each value is in out: one pass, not one per duplicate
			for o, v := range out {
				at[v] = append(at[v], o)
			}
			dup = slices.DeleteFunc(dup, func(d string) bool { return fl.recopiedAcrossForced(at[strings.Fields(d)[0]]) })
			recopied = before - len(dup)
		}
		copyErrs, copied := cp.stop()
		report.Check("the transactional copy loop's output holds each input record once", len(lack)+len(dup)+len(foreign) == 0,
			fmt.Sprintf("%s; missing %d %v, twice %d %v, not of the input %d %v (%d positions a forced switch lost, %d copied again across one as the group's offsets went back to the last synced, counted apart); errors met: %d %s",
				copied, len(lack), head3(lack), len(dup), head3(dup), len(foreign), head3(foreign), forgiven, recopied, len(copyErrs), strings.Join(head3(copyErrs), "; ")))
	}

	// The bystander is never fenced by Ferry: no member names its
	// transactional ID (the drain logs every transaction it ends), and it
	// met a fence only if its own broker was paused or killed (its
	// client then bumps its epoch itself, and a request of the old one
	// in flight is fenced).
	byFenced, byTransient, byTxns := by.stop()
	touched := fl.logLines(func(l string) bool { return strings.Contains(l, bystanderTxnID) })
	ownBroker := fl.brokerFaults["primary"]
	report.Check("the bystander's transactions are never fenced", len(touched) == 0 && (len(byFenced) == 0 || ownBroker > 0),
		fmt.Sprintf("%d transactions committed directly on the primary; %d errors met, %d fences, with %d faults of its broker; Ferry's logs name it %d times %s %s",
			byTxns, byTransient, len(byFenced), ownBroker, len(touched), strings.Join(head3(touched), "; "), strings.Join(head3(byFenced), "; ")))
	panics := fl.logLines(isPanic)
	report.Check("no member panics", len(panics) == 0, strings.Join(head3(panics), "; "))

	md := report.Markdown(replay)
	t.Logf("\n%s", md)
	if *chaosReport != "" {
		if err := os.WriteFile(*chaosReport, []byte(md), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, inv := range report.Invariants {
		if !inv.OK {
			t.Errorf("invariant violated: %s: %s", inv.Name, inv.Detail)
		}
	}
}

// chaosFleet is the members under the schedule, the clusters by name, and
// every log any of the members' incarnations wrote.
type chaosFleet struct {
	t            *testing.T
	bin          string
	clusters     map[string]*kafkatest.Cluster
	ms           []*ferryServe
	logs         []string
	brokerFaults map[string]int // brokers paused or killed, by cluster
	activeDown   time.Duration  // how long the active cluster's broker was paused or dead
	forced       []forcedSwitch // the forced switches made, in order
	copyTopic    string         // the copy loop's output ("" without it)
	// markerRepairs: the topics copied again after the standby's
	// coordinator wrote a marker twice (repairMarkerTwice).
	markerRepairs []string
}

// forcedSwitch is a forced switch the schedule made.
type forcedSwitch struct {
	stopped time.Time           // when the old active cluster's broker was stopped
	lost    []routing.LostRange // what the answer reported lost
	// oldAnswered bounds the answers the old cluster gave: a client
	// reports one it got just before the stop a moment after it, and
	// the new cluster answers nothing before the flip, which the
	// answer to the switch came after. (A second after the stop, or
	// the switch's answer if sooner: a forced switch waits up to 3 s
	// for the stopped cluster's end offsets.)
	oldAnswered time.Time
	// lostCopies are the input positions ("partition/offset") whose
	// copies the switch lost: on the old cluster's copy of the output,
	// nowhere on the new one's, read before the repair deleted it.
	lostCopies map[string]bool
	// copyFence is the copy loop's output's end on the new active
	// cluster at the flip, by partition (the fence of the generation
	// that ended): copies below it were made before the switch.
	copyFence []int64
}

// lostAt reports whether the forced switches reported offset o of topic's
// partition p lost.
func (fl *chaosFleet) lostAt(topic string, p int32, o int64) bool {
	for _, fs := range fl.forced {
		for _, r := range fs.lost {
			if r.Topic == topic && r.Partition == p && r.Contains(o) {
				return true
			}
		}
	}
	return false
}

// recopiedAcrossForced reports whether the copies of an input position,
// at copies on the output, straddle a forced switch: one below its fence
// on the output, one at or above it.
func (fl *chaosFleet) recopiedAcrossForced(copies []partOff) bool {
	for _, fs := range fl.forced {
		var below, above bool
		for _, at := range copies {
			if int(at.p) >= len(fs.copyFence) || fs.copyFence[at.p] < 0 {
				continue
			}
			if at.o < fs.copyFence[at.p] {
				below = true
			} else {
				above = true
			}
		}
		if below && above {
			return true
		}
	}
	return false
}

// forcedResidue reports whether a record acknowledged at at falls in the
// residue a forced switch's lost ranges may miss: what the old cluster
// acknowledged in the last listing interval of its end offsets (1 s)
// before it stopped, with a second's slack for the client's report.
func (fl *chaosFleet) forcedResidue(at time.Time) bool {
	for _, fs := range fl.forced {
		if at.After(fs.stopped.Add(-2*time.Second)) && at.Before(fs.stopped.Add(time.Second)) {
			return true
		}
	}
	return false
}

// other is the cluster that is not name.
func (fl *chaosFleet) other(name string) string {
	if name == "primary" {
		return "standby"
	}
	return "primary"
}

// repairAfterForced brings the old active cluster back as a standby the
// way docs/RUNBOOK.md (section 5.4) says: the topics the mirror halted as
// diverged are deleted on it directly, the mirror creates them again and
// its halted partitions are restarted, until every partition is caught
// up. It first notes the copies the switch lost (fs.lostCopies).
func (fl *chaosFleet) repairAfterForced(ctx context.Context, old string, fs *forcedSwitch) string {
	t := fl.t
	c := fl.clusters[old]
	fs.lostCopies = map[string]bool{}
	if fl.copyTopic != "" {
		// What the copy loop wrote on the old cluster (read uncommitted:
		// aborted copies too, which only forgives more) and the new one
		// does not hold committed: a copy the mirror wrote there and
		// aborted (its writer halted mid-transaction) is not held.
		now := map[string]bool{}
		for _, v := range readTopics(t, ctx, fl.clusters[fl.other(old)], []string{fl.copyTopic}, kgo.ReadCommitted())[fl.copyTopic] {
			now[v] = true
		}
		for _, v := range readTopics(t, ctx, c, []string{fl.copyTopic}, kgo.ReadUncommitted())[fl.copyTopic] {
			if !now[v] {
				fs.lostCopies[v] = true
			}
		}
	}
	var deleted []string
	restarts := 0
	// Repaired when every partition reports caught up at a poll 10 s or
	// more after the last restart, none halted meanwhile: a writer of the
	// new direction that has not yet compared the old cluster's tail with
	// the source reports caught up until it does, and halts within those
	// 10 s if they differ. Not 10 s of caught up without a break: the
	// mirror copies decided records only, so under the copy loop's
	// transactions some partition waits at an open transaction at almost
	// every poll.
	quiet := time.Now()
	var last ferryadmin.MirrorStatus
	// Five minutes: the transactional topic is often copied twice. A
	// transaction open on the old cluster when its topic is deleted (the
	// copy loop's, aborted by the coordinator at its timeout once the
	// broker is back, or a writer's) puts its marker, when it ends, into
	// the topic created again, where the copy halts on it; the second
	// copy finds none. The 30-minute runs' repairs took up to 2m23s.
	deadline := time.Now().Add(5 * time.Minute)
	for ; ; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("the old active cluster %s not repaired within 5 minutes of the forced switch (topics deleted: %v, restarts %d); the mirror last said: %s",
				old, deleted, restarts, notCaughtUp(last))
		}
		st, err := fl.ms[0].mirrorStatus(ctx)
		if err != nil {
			continue
		}
		last = st
		if st.Summary.AllCaughtUp && time.Since(quiet) >= 10*time.Second {
			return fmt.Sprintf("repaired: %d topics deleted on %s and copied again %v, %d restarts of the halted", len(deleted), old, deleted, restarts)
		}
		// A topic is deleted only once every partition of it is halted
		// (the runbook's rule): a writer still running would append
		// into the topic created again at its own offset, and what it
		// appended there before halting diverges from the source. The
		// partitions of a topic that still mirror are halted first
		// (ferry mirror halt), as the runbook says.
		halted, parts := map[string]bool{}, map[string]int{}
		for _, p := range st.Partitions {
			parts[p.Topic]++
			if p.State == "halted" {
				halted[p.Topic] = true
			}
		}
		if len(halted) == 0 {
			continue
		}
		topics := slices.Sorted(maps.Keys(halted))
		for _, tp := range topics {
			if err := fl.ms[0].haltTopic(ctx, tp); err != nil {
				t.Fatalf("halting %s to copy it again: %v", tp, err)
			}
		}
		adm := admin(t, c)
		// The runbook's advice: a transaction still open on the old
		// cluster for these topics ends later, and its marker lands in
		// the topic created again, which must then be copied once more.
		// The wait does not count against the repair's 5 minutes.
		waitStart := time.Now()
		if open := waitTxnsEnded(ctx, adm, topics, 3*time.Minute); len(open) > 0 {
			t.Logf("deleting %v on %s with transactions still open for them after 3 minutes: %v", topics, old, open)
		}
		deadline = deadline.Add(time.Since(waitStart))
		if _, err := adm.DeleteTopics(ctx, topics...); err != nil {
			t.Logf("deleting %v on %s: %v", topics, old, err)
			continue
		}
		deleted = append(deleted, topics...)
		waitRecreated(ctx, adm, topics, parts)
		if err := fl.ms[0].restartHalted(ctx); err != nil {
			t.Logf("restarting the halted mirror partitions: %v", err)
		}
		restarts++
		quiet = time.Now()
	}
}

// waitTxnsEnded waits up to bound until the cluster adm reaches has no
// application's transaction open on any of topics (its coordinator aborts
// one whose client went away once the transaction's timeout has passed)
// and returns those still open then, as "transactional ID (state)".
// Ferry's own writers' transactions (ferry-mirror.*) are not waited for:
// their timeout is 15 minutes, and a halted writer may leave one open
// with nothing appended; its marker, if it lands in the topic created
// again, halts the copy, and the repair copies the topic once more
// (docs/RUNBOOK.md 5.4).
func waitTxnsEnded(ctx context.Context, adm *kadm.Client, topics []string, bound time.Duration) []string {
	var open []string
	for deadline := time.Now().Add(bound); ; time.Sleep(time.Second) {
		open = open[:0]
		described, err := adm.DescribeTransactions(ctx)
		for _, d := range described.Sorted() {
			switch d.State {
			case "Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence":
			default:
				continue
			}
			if strings.HasPrefix(d.TxnID, "ferry-mirror.") {
				continue
			}
			if slices.ContainsFunc(topics, func(tp string) bool { _, ok := d.Topics[tp]; return ok }) {
				open = append(open, fmt.Sprintf("%s (%s)", d.TxnID, d.State))
			}
		}
		if err == nil && len(open) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return open
		}
	}
}

// notCaughtUp says which partitions of st are not caught up, and why.
func notCaughtUp(st ferryadmin.MirrorStatus) string {
	var out []string
	for _, p := range st.Partitions {
		if p.State != "caught_up" {
			out = append(out, fmt.Sprintf("%s[%d] %s, lag %d %s", p.Topic, p.Partition, p.State, p.LagRecords, p.Error))
		}
	}
	return fmt.Sprintf("running %v, %d partitions: %s", st.Running, len(st.Partitions), strings.Join(out, "; "))
}

// waitRecreated waits up to a minute until the mirror's sync has created
// topics again on the cluster adm reaches after their deletion: every
// partition there (parts, by topic, from the mirror's status) and empty
// (the deleted topics' ends are not). It reports whether it saw that.
func waitRecreated(ctx context.Context, adm *kadm.Client, topics []string, parts map[string]int) bool {
	for again := time.Now().Add(time.Minute); time.Now().Before(again); time.Sleep(500 * time.Millisecond) {
		ends, err := adm.ListEndOffsets(ctx, topics...)
		if err != nil || ends.Error() != nil {
			continue
		}
		n, want, empty := 0, 0, true
		ends.Each(func(o kadm.ListedOffset) { n, empty = n+1, empty && o.Offset == 0 })
		for _, t := range topics {
			want += parts[t]
		}
		if n == want && empty {
			return true
		}
	}
	return false
}

// repairMarkerTwice copies again, as docs/RUNBOOK.md 5.4 says, each topic
// with a partition halted marker_twice: the standby's broker was killed
// between a mirrored transaction's marker and its coordinator recording
// the transaction complete, and the coordinator wrote the marker again
// (a Kafka residue: nothing lost, the standby one offset ahead). Halted
// as a whole (ferry mirror halt), deleted on the standby, created again
// by the mirror and restarted, then caught up. It returns a line per
// topic repaired.
func (fl *chaosFleet) repairMarkerTwice(ctx context.Context) []string {
	t := fl.t
	st, err := fl.ms[0].mirrorStatus(ctx)
	if err != nil {
		return nil
	}
	twice, parts := map[string][]int32{}, map[string]int{}
	for _, p := range st.Partitions {
		parts[p.Topic]++
		if p.State == "halted" && p.HaltReason == "marker_twice" {
			twice[p.Topic] = append(twice[p.Topic], p.Partition)
		}
	}
	if len(twice) == 0 {
		return nil
	}
	_, active, ok := fl.agree(time.Minute)
	if !ok {
		t.Fatal("the members do not agree on the active cluster: cannot tell the standby to repair")
	}
	standby := fl.other(active)
	adm := admin(t, fl.clusters[standby])
	var lines []string
	for _, topic := range slices.Sorted(maps.Keys(twice)) {
		start := time.Now()
		if err := fl.ms[0].haltTopic(ctx, topic); err != nil {
			t.Fatalf("halting %s to copy it again: %v", topic, err)
		}
		if _, err := adm.DeleteTopics(ctx, topic); err != nil {
			t.Fatalf("deleting %s on %s: %v", topic, standby, err)
		}
		if !waitRecreated(ctx, adm, []string{topic}, parts) {
			t.Fatalf("%s not created again empty on %s within a minute of its deletion", topic, standby)
		}
		if err := fl.ms[0].restartHalted(ctx); err != nil {
			t.Fatalf("restarting the halted mirror partitions: %v", err)
		}
		if _, caught, err := fl.ms[0].mirrorCaughtUp(ctx, 3*time.Minute); !caught {
			t.Fatalf("%s copied again on %s: the mirror not caught up within 3 minutes (%v)", topic, standby, err)
		}
		lines = append(lines, fmt.Sprintf("%s%v held a transaction marker twice on %s (its broker killed): halted, deleted there, copied again and caught up in %v",
			topic, twice[topic], standby, time.Since(start).Round(time.Millisecond)))
	}
	return lines
}

// switchResult is a switch's 200.
type switchResult struct {
	Generation uint32
	Active     string
	Took       time.Duration // asked to answered
}

// inject runs fault f and says what it met.
func (fl *chaosFleet) inject(ctx context.Context, f chaos.Fault, report *chaos.Report, answered *[]switchResult) string {
	t := fl.t
	_, active, _ := fl.agree(0)
	to := fl.other(active)
	note := func(a switchAnswer, code int, took time.Duration) string {
		if code != http.StatusOK {
			out := fmt.Sprintf("refused %d %s", code, a.Error)
			report.Outcomes[out]++
			return out
		}
		*answered = append(*answered, switchResult{a.Generation, a.Active, took})
		report.Outcomes["switched"]++
		return fmt.Sprintf("switched (generation %d, %s active)", a.Generation, a.Active)
	}
	switch f.Kind {
	case chaos.PlannedSwitch:
		start := time.Now()
		a, code, _ := fl.ms[f.Member].askSwitch(ctx, to, chaosSwitchTimeout)
		return note(a, code, time.Since(start))
	case chaos.TwoSwitches:
		var wg sync.WaitGroup
		answers := make([]string, 2)
		var mu sync.Mutex
		for i, m := range []int{f.Member, f.Other} {
			wg.Go(func() {
				start := time.Now()
				a, code, _ := fl.ms[m].askSwitch(ctx, to, chaosSwitchTimeout)
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				answers[i] = fmt.Sprintf("member %d: %s", m, note(a, code, took))
			})
		}
		wg.Wait()
		return strings.Join(answers, "; ")
	case chaos.KillMember:
		m := fl.ms[f.Member]
		m.kill(t)
		time.Sleep(f.Pause)
		fl.ms[f.Member] = startFerryMember(t, fl.bin, fl.clusters["primary"], fl.clusters["standby"], m.seat)
		fl.logs = append(fl.logs, fl.ms[f.Member].log)
		return "killed, restarted"
	case chaos.PauseMember:
		p := fl.ms[f.Member].cmd.Process
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP member %d: %v", f.Member, err)
		}
		time.Sleep(f.Pause)
		if err := p.Signal(syscall.SIGCONT); err != nil {
			t.Fatalf("SIGCONT member %d: %v", f.Member, err)
		}
		return "stopped, continued"
	case chaos.PauseBroker:
		name, c := fl.brokerOf(f, active, to)
		pid := c.Pid(c.NodeIDs()[0])
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %s's broker: %v", name, err)
		}
		start := time.Now()
		time.Sleep(f.Pause)
		if name == active {
			fl.activeDown += time.Since(start)
		}
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatalf("SIGCONT %s's broker: %v", name, err)
		}
		return name + "'s broker stopped, continued"
	case chaos.KillBroker:
		name, c := fl.brokerOf(f, active, to)
		id := c.NodeIDs()[0]
		if err := c.Kill(id); err != nil {
			t.Fatalf("kill -9 %s's broker: %v", name, err)
		}
		start := time.Now()
		time.Sleep(f.Pause)
		if err := c.Restart(id); err != nil {
			t.Fatalf("restarting %s's broker: %v", name, err)
		}
		if name == active {
			fl.activeDown += time.Since(start)
		}
		return name + "'s broker killed, restarted"
	case chaos.ForcedSwitch:
		c := fl.clusters[active]
		pid := c.Pid(c.NodeIDs()[0])
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %s's broker: %v", active, err)
		}
		stopped := time.Now()
		a, code, _ := fl.ms[f.Member].askSwitchMode(ctx, to, "forced", chaosSwitchTimeout)
		took := time.Since(stopped)
		answer := note(a, code, took)
		time.Sleep(f.Pause - time.Since(stopped))
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatalf("SIGCONT %s's broker: %v", active, err)
		}
		fl.activeDown += time.Since(stopped)
		if code != http.StatusOK {
			return fmt.Sprintf("%s's broker stopped; %s", active, answer)
		}
		fs := forcedSwitch{stopped: stopped, oldAnswered: stopped.Add(min(time.Second, took))}
		if a.LastSwitch != nil {
			fs.lost = a.LastSwitch.Lost
		}
		if st, err := fl.ms[f.Member].routingState(ctx); err == nil {
			// The fence of the generation that ended: the latest
			// below the new one (a voided one is numbered past).
			var ended uint32
			for _, fe := range st.Fences {
				if fe.Generation < a.Generation && fe.Generation >= ended {
					ended, fs.copyFence = fe.Generation, fe.Ends[fl.copyTopic]
				}
			}
		}
		repaired := fl.repairAfterForced(ctx, active, &fs)
		fl.forced = append(fl.forced, fs)
		return fmt.Sprintf("%s's broker stopped %v; %s, lost %v; %s", active, time.Since(stopped).Round(time.Millisecond), answer, fs.lost, repaired)
	case chaos.CutGossip:
		// The member built with -tags faults cuts its gossip off on
		// SIGUSR1 and joins up again on SIGUSR2 (cmd/ferry/faults.go).
		p := fl.ms[f.Member].cmd.Process
		if err := p.Signal(syscall.SIGUSR1); err != nil {
			t.Fatalf("cutting member %d's gossip off: %v", f.Member, err)
		}
		cut := time.Now()
		time.Sleep(f.Pause / 2)
		start := time.Now()
		a, code, _ := fl.ms[f.Other].askSwitch(ctx, to, chaosSwitchTimeout)
		answer := note(a, code, time.Since(start))
		time.Sleep(f.Pause - time.Since(cut))
		if err := p.Signal(syscall.SIGUSR2); err != nil {
			t.Fatalf("joining member %d's gossip up again: %v", f.Member, err)
		}
		return fmt.Sprintf("cut off %v, joined up; the switch via member %d: %s", time.Since(cut).Round(time.Millisecond), f.Other, answer)
	}
	t.Fatalf("fault kind %q not known", f.Kind)
	return ""
}

// brokerOf is the cluster whose broker fault f concerns (the active one,
// or the other, to), counted among the broker faults.
func (fl *chaosFleet) brokerOf(f chaos.Fault, active, to string) (string, *kafkatest.Cluster) {
	name := active
	if f.Cluster == 1 {
		name = to
	}
	fl.brokerFaults[name]++
	return name, fl.clusters[name]
}

// agree waits up to timeout for every member to route by one serving
// state, and returns it (with timeout 0: asks once, and returns member 0's
// view if they differ).
func (fl *chaosFleet) agree(timeout time.Duration) (gen uint32, active string, ok bool) {
	for deadline := time.Now().Add(timeout); ; time.Sleep(250 * time.Millisecond) {
		var states []string
		for i, m := range fl.ms {
			st, err := m.status()
			if err != nil {
				states = append(states, err.Error())
				continue
			}
			if i == 0 || active == "" {
				gen, active = st.Routing.Generation, st.Routing.Active
			}
			states = append(states, fmt.Sprintf("%d/%s/%s", st.Routing.Generation, st.Routing.Active, st.Routing.Phase))
		}
		same := true
		for _, s := range states {
			same = same && s == states[0] && strings.HasSuffix(s, "/serving")
		}
		if same {
			return gen, active, true
		}
		if time.Now().After(deadline) {
			fl.t.Logf("members route by %v", states)
			return gen, active, false
		}
	}
}

// logLines lists the lines of every member's logs that match, each after
// its file's path.
func (fl *chaosFleet) logLines(match func(string) bool) []string {
	var out []string
	for _, path := range fl.logs {
		b, _ := os.ReadFile(path)
		for _, l := range strings.Split(string(b), "\n") {
			if match(l) {
				out = append(out, path+": "+head(l, 300))
			}
		}
	}
	return out
}

// isPanic matches a panic or fatal error in a member's log.
func isPanic(l string) bool {
	return strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") || strings.Contains(l, `"level":"panic"`)
}

// belowCommitted lists each read of a consumer that began below an offset
// it had committed before (a commit that succeeded, on the same
// partition): its group went back past its commit.
func belowCommitted(c *verifiable.Consumer, resets []time.Time) []string {
	type ev struct {
		seq    int
		at     time.Time
		commit map[int32]int64
		r      *verifiable.Range
	}
	var evs []ev
	for _, cm := range c.Commits() {
		if cm.Success {
			evs = append(evs, ev{seq: cm.Seq, at: cm.At, commit: cm.Offsets})
		}
	}
	for _, r := range c.Ranges() {
		evs = append(evs, ev{seq: r.Seq, at: r.At, r: &r})
	}
	// In the order the consumer printed them.
	slices.SortFunc(evs, func(a, b ev) int { return a.seq - b.seq })
	type commit struct {
		offset int64
		at     time.Time
	}
	committed := map[int32]commit{}
	var out []string
	for _, e := range evs {
		// A forced switch takes the group back to what the mirror had
		// copied of its offsets: what the old cluster acknowledged of
		// its commits no longer binds it.
		for len(resets) > 0 && e.at.After(resets[0]) {
			committed, resets = map[int32]commit{}, resets[1:]
		}
		if e.r == nil {
			for p, o := range e.commit {
				if o > committed[p].offset {
					committed[p] = commit{o, e.at}
				}
			}
			continue
		}
		if c, ok := committed[e.r.Partition]; ok && e.r.Min < c.offset {
			// When, for the members' logs.
			out = append(out, fmt.Sprintf("partition %d read from %d at %s after committing %d at %s",
				e.r.Partition, e.r.Min, e.at.UTC().Format("15:04:05.000"), c.offset, c.at.UTC().Format("15:04:05.000")))
		}
	}
	return out
}

// duplicates counts the records whose value is on the partition more than
// once.
func duplicates(on map[partOff]string) int {
	type key struct {
		p int32
		v string
	}
	seen := map[key]bool{}
	n := 0
	for at, v := range on {
		k := key{at.p, v}
		if seen[k] {
			n++
		}
		seen[k] = true
	}
	return n
}

func head3(s []string) []string { return s[:min(3, len(s))] }

// chaosBystander is a transactional producer writing directly to a
// cluster, never through Ferry, on a topic Ferry does not mirror. A switch
// must never fence it (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH); anything
// else (its broker paused or killed by the schedule) it aborts and goes on
// from. Fenced, it starts a new producer, as an application would, and
// the fence is counted: the test then tells whether Ferry did it.
type chaosBystander struct {
	cancel    context.CancelFunc
	done      chan struct{}
	mu        sync.Mutex
	fenced    []string
	transient int
	txns      int
}

func startBystander(ctx context.Context, t *testing.T, c *kafkatest.Cluster, topic string) *chaosBystander {
	t.Helper()
	open := func() (*kgo.Client, error) {
		return kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.TransactionalID(bystanderTxnID), kgo.DefaultProduceTopic(topic))
	}
	cl, err := open()
	if err != nil {
		t.Fatal(err)
	}
	createReadyTopic(ctx, t, kadm.NewClient(cl), topic, 1, 1)
	ctx, cancel := context.WithCancel(ctx)
	b := &chaosBystander{cancel: cancel, done: make(chan struct{})}
	var fenced atomic.Bool
	note := func(what string, err error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
			fenced.Store(true)
			b.fenced = append(b.fenced, what+": "+err.Error())
		} else {
			b.transient++
		}
	}
	abort := func() {
		actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer acancel()
		if err := cl.AbortBufferedRecords(actx); err != nil {
			note("aborting buffered records", err)
		}
		if err := cl.EndTransaction(actx, kgo.TryAbort); err != nil {
			note("abort", err)
		}
		if fenced.Swap(false) {
			cl.Close()
			for {
				var err error
				if cl, err = open(); err == nil || ctx.Err() != nil {
					return
				}
				time.Sleep(time.Second)
			}
		}
	}
	go func() {
		defer close(b.done)
		defer func() {
			if cl != nil {
				cl.Close()
			}
		}()
		for n := 0; ctx.Err() == nil; n++ {
			if err := cl.BeginTransaction(); err != nil {
				note("begin", err)
				abort()
				time.Sleep(200 * time.Millisecond)
				continue
			}
			for i := range 3 {
				cl.Produce(context.Background(), &kgo.Record{Value: fmt.Appendf(nil, "by-%d-%d", n, i)}, func(_ *kgo.Record, err error) {
					if err != nil {
						note("produce", err)
					}
				})
			}
			// A transaction stays open a while: a switch's drain meets
			// it open.
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
			ectx, ecancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := cl.Flush(ectx)
			if err == nil {
				err = cl.EndTransaction(ectx, kgo.TryCommit)
			}
			ecancel()
			if err != nil {
				note("commit", err)
				abort()
				continue
			}
			b.mu.Lock()
			b.txns++
			b.mu.Unlock()
		}
	}()
	return b
}

// bystanderTxnID is the bystander's transactional ID.
const bystanderTxnID = "chaos-bystander"

// stop ends the bystander and returns the fences it met, how many other
// errors and how many transactions it committed.
func (b *chaosBystander) stop() (fenced []string, transient, txns int) {
	b.cancel()
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fenced, b.transient, b.txns
}

// chaosCopy is the workload's transactional copy loop, through the fleet:
// it reads a topic read_committed in a consumer group and, in one
// transaction each round, writes to another topic the input position of
// every record read ("partition/offset", to the same partition) and
// commits the group's offsets (franz-go's GroupTransactSession). Its
// output must hold each input record once.
type chaosCopy struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	errs   []string
	rounds int
	// aborted counts the rounds End aborted without an error (the group
	// moved under them); last is when a round last committed; restarts
	// the sessions opened again after an error.
	aborted  int
	last     time.Time
	restarts int
}

func startCopy(ctx context.Context, t *testing.T, bootstrap, in, out string) *chaosCopy {
	t.Helper()
	// franz-go's account of the sessions (groups joined, partitions
	// assigned and revoked, transactions), kept with a failed run's logs.
	logPath := filepath.Join(t.TempDir(), "copy.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				keepLog(t, "copy-loop.log", string(b))
			}
		}
	})
	open := func() (*kgo.GroupTransactSession, error) {
		return kgo.NewGroupTransactSession(
			kgo.WithLogger(copyLogger{kgo.BasicLogger(logf, kgo.LogLevelDebug, func() string { return time.Now().Format("15:04:05.000 ") })}),
			kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
			kgo.TransactionalID("chaos-copy"),
			kgo.ConsumerGroup("chaos-copy"),
			kgo.ConsumeTopics(in),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.DefaultProduceTopic(out),
			kgo.RecordPartitioner(kgo.ManualPartitioner()),
		)
	}
	sess, err := open()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &chaosCopy{cancel: cancel, done: make(chan struct{})}
	note := func(what string, err error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.errs = append(c.errs, head(what+": "+err.Error(), 160))
	}
	go func() {
		defer close(c.done)
		defer func() { sess.Close() }()
		// restart is what franz-go asks of an application after a
		// failed Begin or End ("no returned error is retryable"): a new
		// session, whose InitProducerId fences the old one and whose
		// group member resumes at the group's committed offsets.
		restart := func() bool {
			sess.Close()
			for ctx.Err() == nil {
				var err error
				if sess, err = open(); err == nil {
					c.mu.Lock()
					c.restarts++
					c.mu.Unlock()
					return true
				}
				note("reopening", err)
				time.Sleep(time.Second)
			}
			return false
		}
		for ctx.Err() == nil {
			fs := sess.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			fs.EachError(func(_ string, _ int32, err error) { note("fetch", err) })
			if fs.NumRecords() == 0 {
				continue
			}
			if err := sess.Begin(); err != nil {
				note("begin", err)
				if !restart() {
					return
				}
				continue
			}
			fs.EachRecord(func(r *kgo.Record) {
				sess.Produce(ctx, &kgo.Record{Partition: r.Partition, Value: fmt.Appendf(nil, "%d/%d", r.Partition, r.Offset)}, nil)
			})
			ectx, ecancel := context.WithTimeout(context.Background(), time.Minute)
			committed, err := sess.End(ectx, kgo.TryCommit)
			ecancel()
			if err != nil {
				note("end", err)
				if !restart() {
					return
				}
				continue
			}
			c.mu.Lock()
			if committed {
				c.rounds++
				c.last = time.Now()
			} else {
				c.aborted++
			}
			c.mu.Unlock()
		}
	}()
	return c
}

// copyLogger passes on franz-go's Info lines and the Debug lines that say
// where a partition is fetched from and why it is not (metadata merges,
// leader epochs, offset loads, stripped partitions): what tells a stalled
// partition's story, without the per-request noise.
type copyLogger struct{ kgo.Logger }

func (l copyLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelDebug && !copyDebugKept(msg) {
		return
	}
	l.Logger.Log(level, msg, keyvals...)
}

// copyDebugKept reports whether copyLogger keeps a Debug line of franz-go.
func copyDebugKept(msg string) bool {
	if strings.Contains(msg, "identical") { // a metadata refresh that changed nothing
		return false
	}
	return slices.ContainsFunc([]string{"metadata", "epoch", "offset", "stripped", "cursor", "load"},
		func(w string) bool { return strings.Contains(msg, w) })
}

// stop ends the copy loop and says what it did.
func (c *chaosCopy) stop() (errs []string, summary string) {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errs, fmt.Sprintf("%d transactions committed (the last %v before the end), %d aborted as the group moved, %d sessions opened again after an error",
		c.rounds, time.Since(c.last).Round(time.Millisecond), c.aborted, c.restarts)
}

// copiedOnce checks the copy loop's output against its input, both as the
// cluster holds them read_committed: each input position once, nothing
// else. It returns what is wrong, sorted.
func copiedOnce(in, out map[partOff]string) (missing, twice, extra []string) {
	seen := map[string]int{}
	for _, v := range out {
		seen[v]++
	}
	for at := range in {
		k := fmt.Sprintf("%d/%d", at.p, at.o)
		switch n := seen[k]; {
		case n == 0:
			missing = append(missing, k)
		case n > 1:
			twice = append(twice, fmt.Sprintf("%s ×%d", k, n))
		}
		delete(seen, k)
	}
	for k := range seen {
		extra = append(extra, k)
	}
	slices.Sort(missing)
	slices.Sort(twice)
	slices.Sort(extra)
	return missing, twice, extra
}

// outOfOrder names the records of VerifiableProducer (values counting up
// across partitions) that landed in a partition after a later one, each
// record at its first offset.
func outOfOrder(on map[partOff]string) []disordered {
	ats := make([]partOff, 0, len(on))
	for at := range on {
		ats = append(ats, at)
	}
	sort.Slice(ats, func(i, j int) bool { return ats[i].p < ats[j].p || ats[i].p == ats[j].p && ats[i].o < ats[j].o })
	seen := map[string]bool{}
	type highest struct {
		n  int64
		at int64
	}
	last := map[int32]highest{}
	var bad []disordered
	for _, at := range ats {
		v := on[at]
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || seen[v] {
			continue
		}
		seen[v] = true
		if prev, ok := last[at.p]; ok && n < prev.n {
			bad = append(bad, disordered{p: at.p, at: at.o, value: v, prev: prev.n, prevAt: prev.at})
		}
		if prev, ok := last[at.p]; !ok || n > prev.n {
			last[at.p] = highest{n, at.o}
		}
	}
	return bad
}

// disordered is a record found after a later one in its partition.
type disordered struct {
	p      int32
	at     int64
	value  string
	prev   int64 // the highest value before it, at prevAt
	prevAt int64
}

func (d disordered) String() string {
	return fmt.Sprintf("%d/%d holds %q after %d", d.p, d.at, d.value, d.prev)
}

// batchesAt names the producer ID and epoch of the records at offsets at
// and prevAt of a partition on c, for a failure's report.
func batchesAt(ctx context.Context, c *kafkatest.Cluster, topic string, p int32, at, prevAt int64) string {
	var out []string
	for _, o := range []int64{prevAt, at} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().At(o)}}))
		if err != nil {
			return err.Error()
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		desc := "unread"
		for desc == "unread" && rctx.Err() == nil {
			cl.PollFetches(rctx).EachRecord(func(r *kgo.Record) {
				if desc == "unread" && r.Offset >= o {
					desc = fmt.Sprintf("%d: %q producer %d epoch %d", r.Offset, r.Value, r.ProducerID, r.ProducerEpoch)
				}
			})
		}
		cancel()
		cl.Close()
		out = append(out, desc)
	}
	return strings.Join(out, "; ")
}

// producerWarning matches a member's warning about a producer's batch.
func producerWarning(l string) bool {
	return strings.Contains(l, `"level":"warn"`) && (strings.Contains(l, "producer") || strings.Contains(l, "batch"))
}

// partValue is a record's value in a partition.
type partValue struct {
	p int32
	v string
}
