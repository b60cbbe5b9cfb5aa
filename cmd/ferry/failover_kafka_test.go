package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

// failoverAfter is the test fleet's failover.after.
const failoverAfter = 5 * time.Second

// TestAutomaticFailoverRealKafka: a fleet of three with automatic failover
// on, in front of real Kafka. Paused, the primary's death makes no switch
// (the verdict says why, blocked); resumed with the primary back, its
// death makes one automatic forced switch, within after and a few seconds,
// that loses nothing the mirror had copied, and producers and consumers
// carry on through the fleet at the same offsets. The standby's death
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
	waitMirrorOwners(t, f.members[0], topic, 3, f.ids())
	waitMirrored(t, f, topic)
	for _, m := range f.members {
		st, err := m.status(t)
		if err != nil || st.Failover == nil || st.Failover.After != failoverAfter.String() {
			t.Fatalf("member %d's /status failover section: %+v (%v)", m.id, st.Failover, err)
		}
	}

	// Paused: the primary's death makes no switch.
	ans := failoverCall(t, f.members[1], "pause", `{"reason": "maintenance window"}`)
	if ans.Paused == nil || ans.Paused.Reason != "maintenance window" {
		t.Fatalf("pause answered %+v", ans)
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
	for _, m := range f.members {
		waitGenerationWithin(t, m, 1, "standby", 2*time.Minute)
	}
	took := time.Since(killed)
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
	t.Logf("primary killed at %s; every member serving the standby %v later (after %s); lost ranges %v", killed.UTC().Format("15:04:05.000"), took.Round(100*time.Millisecond), failoverAfter, last.Lost)
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
	primary, _, yaml := primaryAndStandby(t, "ferry-auto-loss-test")
	n, addr := startNode(t, yaml+fmt.Sprintf("failover: {automatic: true, after: %s, max_loss: {records: 5}}\n", failoverAfter))
	const topic = "lossy"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, topic, 1)
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	produceNumbered(t, ctx, prod, "before", 10)
	if err := n.mirror.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatal(err)
	}
	leaveTxnOpen(t, ctx, addr, topic, "auto-loss-open")
	unmirrored := produceNumbered(t, ctx, prod, "unmirrored", 20)
	waitMirrorHeldAt(t, n, 10, unmirrored[len(unmirrored)-1]+1)
	// The lag as the member last read it, before the primary goes.
	testwait.Eventually(t, 30*time.Second, "the lag read", func() error {
		if v := n.failover.r.View(); !v.LagKnown || v.LagRecords < 20 {
			return fmt.Errorf("view %+v", v)
		}
		return nil
	})
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

// failoverCall posts a pause or resume to m's admin API, or fails.
func failoverCall(t *testing.T, m *fleetMember, verb, body string) admin.FailoverAnswer {
	t.Helper()
	ans, err := failoverTry(m, verb, body)
	if err != nil {
		t.Fatal(err)
	}
	return ans
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
