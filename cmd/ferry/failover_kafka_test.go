package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

// failoverAfter is the test fleet's failover.after.
const failoverAfter = 5 * time.Second

// TestAutomaticFailoverRealKafka: a fleet of three with automatic failover
// on, in front of real Kafka. Paused, the primary's death makes no switch
// (the verdict says why, blocked); resumed with the primary back, its
// death makes one automatic forced switch, within after and a few seconds
// (the member that decides killed and restarted during the countdown),
// that loses nothing the mirror had copied, and a producer and a consumer
// group carry on through the fleet at the same offsets. The standby's death
// after that makes no switch back: the return to the cluster a forced
// switch left is a person's.
func TestAutomaticFailoverRealKafka(t *testing.T) {
	f := startTestFleetWith(t, 3, fmt.Sprintf("failover: {automatic: true, after: %s, max_loss: {records: 100000}, min_interval: 10m}\n", failoverAfter))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const topic = "auto"
	createTopicVia(t, ctx, f.members[0].kafka, topic, 3)
	prod := newClient(t, kgo.SeedBrokers(strings.Split(f.bootstrap(), ",")...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	acked := map[string]string{} // value → partition/offset acknowledged
	produce := func(prefix string, count int) {
		t.Helper()
		for i := range count {
			v := fmt.Sprintf("%s-%03d", prefix, i)
			r, err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).First()
			if err != nil {
				t.Fatalf("produce %s: %v", v, err)
			}
			acked[v] = fmt.Sprintf("%d/%d", r.Partition, r.Offset)
		}
	}
	produce("before", 90)
	// A consumer group through the fleet, committing as it goes: it reads
	// on across the switch, at the offsets the records were acknowledged at.
	var readMu sync.Mutex
	read := map[string]string{} // value → partition/offset read at
	cons := newClient(t, kgo.SeedBrokers(strings.Split(f.bootstrap(), ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumerGroup("auto-readers"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AutoCommitInterval(200*time.Millisecond))
	cctx, stopConsumer := context.WithCancel(ctx)
	var consumer sync.WaitGroup
	consumer.Go(func() {
		for cctx.Err() == nil {
			cons.PollFetches(cctx).EachRecord(func(r *kgo.Record) {
				readMu.Lock()
				read[string(r.Value)] = fmt.Sprintf("%d/%d", r.Partition, r.Offset)
				readMu.Unlock()
			})
		}
	})
	defer func() { stopConsumer(); consumer.Wait() }()
	waitRead := func(what string) {
		t.Helper()
		testwait.Eventually(t, time.Minute, "the group through the fleet reading "+what, func() error {
			readMu.Lock()
			defer readMu.Unlock()
			for v, at := range acked {
				if read[v] != at {
					return fmt.Errorf("%s acknowledged at %s, read at %q", v, at, read[v])
				}
			}
			return nil
		})
	}
	waitRead("everything before the failure")
	waitMirrorOwners(t, f.members[0], topic, 3, f.ids())
	waitMirrored(t, f, topic)
	for _, m := range f.members {
		st, err := m.status(t)
		if err != nil || st.Failover == nil || st.Failover.After != failoverAfter.String() {
			t.Fatalf("member %d's /status failover section: %+v (%v)", m.id, st.Failover, err)
		}
		// Every member runs its runner: none gossips itself starting.
		testwait.Eventually(t, 30*time.Second, fmt.Sprintf("member %d seeing no member starting", m.id), func() error {
			st, err := m.status(t)
			for _, mm := range st.Members {
				if mm.Starting || err != nil {
					return fmt.Errorf("members %+v (%v)", st.Members, err)
				}
			}
			return nil
		})
	}

	// Paused (`ferry failover pause`): the primary's death makes no switch.
	if out := failoverCLI(t, ctx, "pause", "--admin", f.members[1].admin, "--reason", "maintenance window"); !strings.Contains(out, "Automatic failover is paused (since ") ||
		!strings.Contains(out, ": maintenance window), in generation 0, active primary.") {
		t.Fatalf("ferry failover pause printed %q", out)
	}
	for _, m := range f.members {
		testwait.Eventually(t, 30*time.Second, fmt.Sprintf("member %d paused", m.id), func() error {
			st, err := m.status(t)
			if err != nil || st.Routing.FailoverPaused == nil {
				return fmt.Errorf("paused %v (%v)", st.Routing.FailoverPaused, err)
			}
			return nil
		})
	}
	primaryNode := f.primary.NodeIDs()[0]
	if err := f.primary.Kill(primaryNode); err != nil {
		t.Fatal(err)
	}
	blocked := waitVerdict(t, f, func(v *routingVerdict) bool { return v.Blocked && strings.Contains(v.Reason, "paused") })
	t.Logf("paused, the primary dead: %s", blocked)
	// `ferry failover status` of the member deciding says why.
	stA, err := f.members[0].status(t)
	if err != nil || stA.Failover == nil || int(stA.Failover.Actor) >= len(f.members) {
		t.Fatalf("member 0's failover status: %+v (%v)", stA.Failover, err)
	}
	out := failoverCLI(t, ctx, "status", "--admin", f.members[stA.Failover.Actor].admin)
	if !regexp.MustCompile(`verdict +BLOCKED, a person must decide: automatic failover is paused \(since [^)]+: maintenance window\)`).MatchString(out) {
		t.Fatalf("ferry failover status printed %q", out)
	}
	t.Logf("ferry failover status:\n%s", out)
	time.Sleep(2 * time.Second)
	for _, m := range f.members {
		if st := routingState(t, m); st.Generation != 0 {
			t.Fatalf("member %d serves generation %d with automatic failover paused", m.id, st.Generation)
		}
	}

	// The primary back, resumed; then its death switches, by itself.
	if err := f.primary.Restart(primaryNode); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 2*time.Minute, "automatic failover resumed", func() error {
		ans, err := failoverTry(f.members[2], "resume", "")
		if err != nil {
			return err
		}
		if ans.Paused != nil {
			return fmt.Errorf("still paused: %+v", ans.Paused)
		}
		return nil
	})
	produce("resumed", 30)
	waitMirrored(t, f, topic)
	if err := f.primary.Kill(primaryNode); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The member that decides dies during the countdown and comes back:
	// the others decide without it (it counts toward the quorum, unheard),
	// or it does once back. One switch either way.
	st0, err := f.members[0].status(t)
	if err != nil || st0.Failover == nil || int(st0.Failover.Actor) >= len(f.members) {
		t.Fatalf("member 0's failover status: %+v (%v)", st0.Failover, err)
	}
	actor := f.members[st0.Failover.Actor]
	actor.p.kill()
	restarted := time.Now()
	f.start(t, actor)
	t.Logf("member %d, the one deciding, killed %v after the primary and serving again %v later",
		actor.id, restarted.Sub(killed).Round(time.Millisecond), time.Since(restarted).Round(100*time.Millisecond))
	for _, m := range f.members {
		waitGenerationWithin(t, m, 1, "standby", 2*time.Minute)
	}
	serving := time.Since(killed)
	st := routingState(t, f.members[0])
	last := st.Last
	if last == nil || last.Mode != routing.Forced || !last.Automatic || last.From != "primary" || last.To != "standby" || last.Outcome != routing.OutcomeSwitched {
		t.Fatalf("the switch: %+v; want an automatic forced switch primary -> standby", last)
	}
	for _, r := range last.Lost {
		if r.To == routing.UnknownEnd || r.To > r.From {
			t.Fatalf("the switch lost %+v, though the mirror had copied everything", last.Lost)
		}
	}
	took := last.Finished.Sub(killed)
	t.Logf("primary killed at %s; switched %v later, every member serving the standby %v later (after %s); lost ranges %v",
		killed.UTC().Format("15:04:05.000"), took.Round(100*time.Millisecond), serving.Round(100*time.Millisecond), failoverAfter, last.Lost)
	t.Logf("the switch's steps: %+v", last.Steps)
	for _, m := range f.members {
		// Where the time went: each member's detection and the switch's steps.
		for _, l := range strings.Split(m.p.output(), "\n") {
			if strings.Contains(l, "active cluster is unreachable") || strings.Contains(l, "automatic failover") ||
				strings.Contains(l, `"switch starting"`) || strings.Contains(l, `"switched"`) {
				t.Logf("member %d: %s", m.id, l)
			}
		}
	}
	if took > failoverAfter+30*time.Second {
		// Not a floor (the benchmark measures it): the switch waited far
		// longer than its policy says.
		t.Fatalf("switched %v after the primary's death, after %s", took, failoverAfter)
	}
	// Producers carry on through the fleet; everything acknowledged is on
	// the standby where it was acknowledged.
	produce("after", 30)
	onStandby := map[string]string{}
	for _, s := range readAll(t, f.standby.Addrs(), topic) {
		at, v, _ := strings.Cut(s, "=")
		onStandby[v] = at
	}
	for v, at := range acked {
		if onStandby[v] != at {
			t.Fatalf("%s acknowledged at %s, on the standby at %q", v, at, onStandby[v])
		}
	}
	waitRead("what was produced after the switch, at the same offsets")

	// The standby dies in turn: no switch back to the cluster the forced
	// switch left.
	if err := f.primary.Restart(primaryNode); err != nil {
		t.Fatal(err)
	}
	if err := f.standby.Kill(f.standby.NodeIDs()[0]); err != nil {
		t.Fatal(err)
	}
	blocked = waitVerdict(t, f, func(v *routingVerdict) bool { return v.Blocked && strings.Contains(v.Reason, "forced switch left") })
	t.Logf("the standby dead after the automatic switch: %s", blocked)
	for _, m := range f.members {
		if st := routingState(t, m); st.Generation != 1 {
			t.Fatalf("member %d serves generation %d: switched back by itself", m.id, st.Generation)
		}
	}

	// Both clusters down: nobody votes (the standby must answer).
	if err := f.primary.Kill(primaryNode); err != nil {
		t.Fatal(err)
	}
	none := waitVerdict(t, f, func(v *routingVerdict) bool { return !v.Blocked && strings.Contains(v.Reason, "0 of 3 members") })
	t.Logf("both clusters dead: %s", none)
}

// TestAutomaticFailoverLossOverBudgetRealKafka: a member alone (its own
// majority), the mirror held back by a transaction left open on the
// primary with 20 records acknowledged behind it, max_loss 5 records: the
// primary's death makes no switch; the verdict is blocked, naming the
// loss, and ferry_failover_blocked is 1.
func TestAutomaticFailoverLossOverBudgetRealKafka(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hb := startHeldBack(t, ctx, "ferry-auto-loss-test", 5)
	primary, n := hb.primary, hb.n
	if err := primary.Kill(primary.NodeIDs()[0]); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, failoverAfter+time.Minute, "the verdict blocked for the loss", func() error {
		st := n.failover.r.Status()
		if v := st.Verdict; v == nil || !v.Blocked || !strings.Contains(v.Reason, "exceeds max_loss (5 records)") || v.LossRecords < 20 {
			return fmt.Errorf("verdict %+v", st.Verdict)
		}
		return nil
	})
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	blocked := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "ferry_failover_blocked" && len(mf.GetMetric()) == 1 {
			blocked = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if blocked != 1 {
		t.Fatalf("ferry_failover_blocked = %v, want 1", blocked)
	}
	time.Sleep(2 * time.Second)
	if st := n.routes.Current(); st.Generation != 0 || st.Active != "primary" {
		t.Fatalf("routing %s: switched with the loss over max_loss", st)
	}
}

// TestAutomaticFailoverMemberCutOffRealKafka: a fleet of three with
// automatic failover on, one member cut off from the primary (its dials
// refused and its connections closed: a -tags faults build) while the
// others reach it: the member that decides, the worst placed. It counts
// the primary unreachable, but its vote alone is no quorum: no switch,
// well past after. Its write lease
// lapses (ferry_write_lease_remaining_seconds 0): it stops writing, and a
// produce to a partition it leads is not acknowledged and not written.
// Joined up again, it renews its lease and the same produce is written, at
// the offset after the last acknowledged.
func TestAutomaticFailoverMemberCutOffRealKafka(t *testing.T) {
	f := startTestFleetCuttable(t, 3, fmt.Sprintf("failover: {automatic: true, after: %s, max_loss: {records: 100000}}\n", failoverAfter))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const topic = "cutoff"
	const partitions = 12 // enough that every member leads some
	createTopicVia(t, ctx, f.members[0].kafka, topic, partitions)
	// The victim is the member that decides: cut off, it gathers the
	// others' views and finds its own vote alone. (Another member cut off
	// would not decide at all: the one deciding reaches the cluster.)
	st0, err := f.members[0].status(t)
	if err != nil || st0.Failover == nil || int(st0.Failover.Actor) >= len(f.members) {
		t.Fatalf("member 0's failover status: %+v (%v)", st0.Failover, err)
	}
	victim := f.members[st0.Failover.Actor]
	// The victim's brokers, as clients see them (its lanes), and a
	// partition one of them leads.
	adm := kadm.NewClient(newClient(t, kgo.SeedBrokers(strings.Split(f.bootstrap(), ",")...)))
	var md kadm.Metadata
	testwait.Eventually(t, time.Minute, "the topic's metadata through the fleet", func() error {
		var err error
		md, err = adm.Metadata(ctx, topic)
		if err == nil && len(md.Topics[topic].Partitions) != partitions {
			err = fmt.Errorf("partitions %+v", md.Topics[topic].Partitions)
		}
		return err
	})
	lanes := map[int32]bool{}
	for _, b := range md.Brokers {
		if net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))) == victim.kafka {
			lanes[b.NodeID] = true
		}
	}
	part := int32(-1)
	for _, p := range md.Topics[topic].Partitions.Sorted() {
		if lanes[p.Leader] {
			part = p.Partition
			break
		}
	}
	if part < 0 {
		t.Fatalf("member %d at %s (brokers %v of %+v) leads none of %s's partitions: %+v", victim.id, victim.kafka, lanes, md.Brokers, topic, md.Topics[topic].Partitions)
	}
	prod := newClient(t, kgo.SeedBrokers(strings.Split(f.bootstrap(), ",")...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(15*time.Second))
	send := func(v string) (int64, error) {
		r, err := prod.ProduceSync(ctx, &kgo.Record{Partition: part, Value: []byte(v)}).First()
		if err != nil {
			return -1, err
		}
		return r.Offset, nil
	}
	last, err := send("before")
	if err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, f, topic)
	leaseLeft := func() float64 {
		_, body := httpGet(t, "http://"+victim.admin+"/metrics")
		return metricValue(body, "ferry_write_lease_remaining_seconds")
	}
	if l := leaseLeft(); l <= 0 {
		t.Fatalf("member %d's write lease before the cut: %v s", victim.id, l)
	}
	// Every member's lag reading, gathered by the one deciding (kept for
	// a member that restarts after a failure).
	testwait.Eventually(t, 30*time.Second, "the readings of all three in `ferry failover status`", func() error {
		out := failoverCLI(t, ctx, "status", "--admin", victim.admin)
		if !regexp.MustCompile(`readings +member 0 \d+ records, [0-9.]+ s; member 1 \d+ records, [0-9.]+ s; member 2 \d+ records`).MatchString(out) {
			return fmt.Errorf("printed %q", out)
		}
		return nil
	})

	f.cut(t, victim, f.primary.Addrs())
	testwait.Eventually(t, failoverAfter+time.Minute, fmt.Sprintf("member %d counting the primary unreachable past after", victim.id), func() error {
		st, err := victim.status(t)
		if err != nil || st.Failover == nil || st.Failover.View.Down() < failoverAfter+3*time.Second || !st.Failover.View.StandbyUp {
			return fmt.Errorf("view %+v (%v)", st.Failover, err)
		}
		return nil
	})
	verdict := waitVerdict(t, f, func(v *routingVerdict) bool {
		return !v.Blocked && strings.Contains(v.Reason, "1 of 3 members see primary unreachable")
	})
	t.Logf("one member cut off from the primary: %s", verdict)
	for _, m := range f.members {
		if st := routingState(t, m); st.Generation != 0 || st.Active != "primary" {
			t.Fatalf("member %d serves generation %d on %s: one member's view switched the fleet", m.id, st.Generation, st.Active)
		}
	}
	testwait.Eventually(t, time.Minute, fmt.Sprintf("member %d's write lease lapsed", victim.id), func() error {
		if l := leaseLeft(); l != 0 {
			return fmt.Errorf("ferry_write_lease_remaining_seconds %v", l)
		}
		return nil
	})
	if off, err := send("while-cut"); err == nil {
		t.Fatalf("a produce to partition %d, led by the member cut off, was acknowledged at %d", part, off)
	} else {
		t.Logf("a produce to partition %d, led by the member cut off: %v", part, err)
	}

	f.cut(t, victim, nil)
	testwait.Eventually(t, time.Minute, fmt.Sprintf("member %d's write lease renewed", victim.id), func() error {
		if l := leaseLeft(); l <= 0 {
			return fmt.Errorf("ferry_write_lease_remaining_seconds %v", l)
		}
		return nil
	})
	off, err := send("after-cut")
	if err != nil {
		t.Fatalf("produce after the member joined up again: %v", err)
	}
	if off != last+1 {
		t.Fatalf("after-cut acknowledged at %d; want %d, after before at %d", off, last+1, last)
	}
	got := map[string]bool{}
	for _, s := range readAll(t, f.primary.Addrs(), topic) {
		got[s] = true
	}
	for _, want := range []string{fmt.Sprintf("%d/%d=before", part, last), fmt.Sprintf("%d/%d=after-cut", part, off)} {
		if !got[want] {
			t.Fatalf("the primary lacks %s: %v", want, got)
		}
	}
	for s := range got {
		if strings.HasSuffix(s, "=while-cut") {
			t.Fatalf("the primary holds %s, refused to its producer", s)
		}
	}
	for _, m := range f.members {
		if st := routingState(t, m); st.Generation != 0 {
			t.Fatalf("member %d serves generation %d", m.id, st.Generation)
		}
	}
}

// TestAutomaticFailoverMinIntervalRealKafka: a lone member (its own
// majority) with automatic failover on. The primary's death switches it to
// the standby by itself; with the primary back, a person switches back
// (planned); the primary's death again, within min_interval, makes no
// second switch: the verdict is blocked naming min_interval, and the member
// stays on the primary.
func TestAutomaticFailoverMinIntervalRealKafka(t *testing.T) {
	primary, _, yaml := primaryAndStandby(t, "ferry-auto-interval-test")
	n, addr := startNode(t, yaml+fmt.Sprintf("failover: {automatic: true, after: %s, max_loss: {records: 100000}, min_interval: 10m}\n", failoverAfter))
	const topic = "flap"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, topic, 1)
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	produceNumbered(t, ctx, prod, "before", 10)
	if err := n.mirror.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatal(err)
	}
	node := primary.NodeIDs()[0]
	if err := primary.Kill(node); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, failoverAfter+time.Minute, "the automatic switch to the standby", func() error {
		if st := n.routes.Current(); st.Generation != 1 || st.Active != "standby" || st.Phase != routing.PhaseServing {
			return fmt.Errorf("routing %s", st)
		}
		return nil
	})
	if l := n.routes.Current().Last; l == nil || !l.Automatic || l.Mode != routing.Forced {
		t.Fatalf("the first switch: %+v; want automatic, forced", l)
	}
	if offs := produceNumbered(t, ctx, prod, "on-standby", 5); offs[0] != 10 {
		t.Fatalf("first record on the standby at %d, want 10", offs[0])
	}

	// The primary back and mirrored: a person plans the return.
	if err := primary.Restart(node); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 2*time.Minute, "the planned return to the primary", func() error {
		_, err := n.switchover(ctx, routing.Request{To: "primary"})
		return err
	})
	if st := n.routes.Current(); st.Generation != 2 || st.Active != "primary" || st.Last == nil || st.Last.Automatic || st.Last.Mode != routing.Planned {
		t.Fatalf("after the return: %s, last %+v", st, st.Last)
	}
	if offs := produceNumbered(t, ctx, prod, "back", 5); offs[0] != 15 {
		t.Fatalf("first record back on the primary at %d, want 15", offs[0])
	}
	testwait.Eventually(t, 30*time.Second, "the lag read since the return", func() error {
		if v := n.failover.r.View(); v.Generation != 2 || !v.LagKnown {
			return fmt.Errorf("view %+v", v)
		}
		return nil
	})

	// Down again within min_interval: no second switch.
	if err := primary.Kill(node); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, failoverAfter+time.Minute, "the verdict blocked for min_interval", func() error {
		st := n.failover.r.Status()
		if v := st.Verdict; v == nil || !v.Blocked || !strings.Contains(v.Reason, "within min_interval 10m0s") {
			return fmt.Errorf("verdict %+v", st.Verdict)
		}
		return nil
	})
	t.Logf("the primary down again: %s", n.failover.r.Status().Verdict.Reason)
	time.Sleep(2 * time.Second)
	if st := n.routes.Current(); st.Generation != 2 || st.Active != "primary" {
		t.Fatalf("routing %s: switched again within min_interval", st)
	}
}

// TestAutomaticFailoverLossWithinBudgetRealKafka: a lone member, the
// mirror held back by a transaction left open on the primary with 20
// records acknowledged behind it, max_loss 100 records: the primary's death
// makes one automatic forced switch, whose lost range is exactly what the
// standby lacks of what the primary acknowledged, and producers carry on
// on the standby at its end.
func TestAutomaticFailoverLossWithinBudgetRealKafka(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hb := startHeldBack(t, ctx, "ferry-auto-lossy-test", 100)
	primary, standby, n, prod, unmirrored, end := hb.primary, hb.standby, hb.n, hb.prod, hb.unmirrored, hb.end
	const topic = heldBackTopic
	if err := primary.Kill(primary.NodeIDs()[0]); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, failoverAfter+time.Minute, "the automatic switch", func() error {
		if st := n.routes.Current(); st.Generation != 1 || st.Phase != routing.PhaseServing {
			return fmt.Errorf("routing %s", st)
		}
		return nil
	})
	st := n.routes.Current()
	want := []routing.LostRange{{Topic: topic, Partition: 0, From: 10, To: end}}
	if st.Active != "standby" || st.Last == nil || !st.Last.Automatic || fmt.Sprint(st.Last.Lost) != fmt.Sprint(want) {
		t.Fatalf("after the switch: %s, last %+v; want an automatic switch to the standby that lost %v", st, st.Last, want)
	}
	// Every record the primary acknowledged is on the standby or in the
	// lost range.
	onStandby := map[string]bool{}
	for _, r := range readAll(t, standby.Addrs(), topic) {
		onStandby[r] = true
	}
	for i := range 10 {
		if r := fmt.Sprintf("0/%d=before-%03d", i, i); !onStandby[r] {
			t.Fatalf("the standby lacks %s", r)
		}
	}
	for i, off := range unmirrored {
		if off < want[0].From || off >= want[0].To {
			t.Fatalf("unmirrored-%03d acknowledged at %d, outside the lost range %v", i, off, want)
		}
	}
	if offs := produceNumbered(t, ctx, prod, "after", 3); offs[0] != 10 {
		t.Fatalf("first record after the switch at %d, want 10 (the standby's end)", offs[0])
	}
}

// heldBack is a lone member with automatic failover on whose mirror a
// transaction left open on the primary holds back: 10 records copied, then
// the open transaction's and 20 more acknowledged behind it (unmirrored,
// the offsets; end, the primary's end).
type heldBack struct {
	primary, standby *kafkatest.Cluster
	n                *node
	prod             *kgo.Client
	unmirrored       []int64
	end              int64
}

const heldBackTopic = "lossy"

// startHeldBack starts a heldBack with max_loss maxLoss records, and waits
// until the member's view reads the lag (end - 10) from the primary.
func startHeldBack(t *testing.T, ctx context.Context, clusterID string, maxLoss int) heldBack {
	t.Helper()
	var hb heldBack
	var yaml, addr string
	hb.primary, hb.standby, yaml = primaryAndStandby(t, clusterID)
	hb.n, addr = startNode(t, yaml+fmt.Sprintf("failover: {automatic: true, after: %s, max_loss: {records: %d}}\n", failoverAfter, maxLoss))
	createTopicVia(t, ctx, addr, heldBackTopic, 1)
	hb.prod = newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(heldBackTopic))
	produceNumbered(t, ctx, hb.prod, "before", 10)
	if err := hb.n.mirror.WaitCaughtUp(ctx, heldBackTopic); err != nil {
		t.Fatal(err)
	}
	leaveTxnOpen(t, ctx, addr, heldBackTopic, clusterID+"-open")
	hb.unmirrored = produceNumbered(t, ctx, hb.prod, "unmirrored", 20)
	hb.end = hb.unmirrored[len(hb.unmirrored)-1] + 1
	waitMirrorHeldAt(t, hb.n, 10, hb.end)
	// The lag as the member last read it, before the primary goes.
	testwait.Eventually(t, 30*time.Second, "the lag read", func() error {
		if v := hb.n.failover.r.View(); !v.LagKnown || v.LagRecords != hb.end-10 {
			return fmt.Errorf("view %+v; want a lag of %d records", v, hb.end-10)
		}
		return nil
	})
	return hb
}

type routingVerdict struct {
	Blocked bool
	Reason  string
}

// waitVerdict waits until the member that decides reports a verdict that
// ok accepts, and returns its reason.
func waitVerdict(t *testing.T, f *testFleet, ok func(*routingVerdict) bool) string {
	t.Helper()
	var got string
	testwait.Eventually(t, failoverAfter+time.Minute, "the deciding member's verdict", func() error {
		for _, m := range f.members {
			st, err := m.status(t)
			if err != nil || st.Failover == nil || st.Failover.Verdict == nil {
				continue
			}
			v := &routingVerdict{Blocked: st.Failover.Verdict.Blocked, Reason: st.Failover.Verdict.Reason}
			got = fmt.Sprintf("member %d: %+v", m.id, *v)
			if ok(v) {
				return nil
			}
		}
		return fmt.Errorf("last verdict seen: %s", got)
	})
	return got
}

// waitGenerationWithin is waitGeneration with its own bound.
func waitGenerationWithin(t *testing.T, m *fleetMember, gen uint32, active string, within time.Duration) {
	t.Helper()
	testwait.Eventually(t, within, fmt.Sprintf("member %d serving generation %d on %q", m.id, gen, active), func() error {
		st, err := m.status(t)
		if err != nil || st.Routing.Generation != gen || st.Routing.Active != active {
			return fmt.Errorf("member %d serves generation %d on %q (%v)", m.id, st.Routing.Generation, st.Routing.Active, err)
		}
		return nil
	})
}

// failoverCLI runs `ferry failover` with args and returns what it
// printed, or fails.
func failoverCLI(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := failoverCmd(ctx, args, &out, &errOut); err != nil {
		t.Fatalf("ferry failover %v: %v\n%s", args, err, errOut.String())
	}
	return out.String()
}

func failoverTry(m *fleetMember, verb, body string) (admin.FailoverAnswer, error) {
	var ans admin.FailoverAnswer
	resp, err := (&http.Client{Timeout: time.Minute}).Post("http://"+m.admin+"/failover/"+verb, "application/json", bytes.NewBufferString(body))
	if err != nil {
		return ans, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ans, fmt.Errorf("POST /failover/%s: %s: %s", verb, resp.Status, buf.String())
	}
	err = json.Unmarshal(buf.Bytes(), &ans)
	return ans, err
}
