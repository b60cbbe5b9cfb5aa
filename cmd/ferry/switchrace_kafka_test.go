package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

// TestSwitchRaceRealKafka: a planned switch asked of member 0 and a forced
// one asked of member 1 at the same moment, under traffic through both.
// One of them switches and the other changes nothing; both
// members and both clusters end on the winner's generation, a probe
// produce through each member is acknowledged, and every record the
// traffic had acknowledged that the new active cluster lacks (or holds
// another record at) is inside the lost ranges the winning switch
// reported: none for a planned switch.
func TestSwitchRaceRealKafka(t *testing.T) {
	f := startTestFleet(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const topic, parts = "switch-race", int32(3)
	createTopicVia(t, ctx, f.members[0].kafka, topic, parts)
	tr := startTraffic(t, f.bootstrap(), topic, parts, "switch-race")
	tr.waitMore(300, time.Minute)
	// The mirror copies every partition: a forced switch then loses only
	// what it had not copied yet, which it reports.
	standby := strings.Split(f.standby.Bootstrap(), ",")
	adm := kadm.NewClient(newClient(t, kgo.SeedBrokers(standby...)))
	testwait.Eventually(t, time.Minute, fmt.Sprintf("the mirror copying every partition of %s to the standby", topic), func() error {
		ends, err := adm.ListEndOffsets(ctx, topic)
		copied := 0
		if err == nil {
			ends.Each(func(o kadm.ListedOffset) {
				if o.Err == nil && o.Offset > 0 {
					copied++
				}
			})
		}
		if copied != int(parts) {
			return fmt.Errorf("%d copied (%v)", copied, err)
		}
		return nil
	})

	var wg sync.WaitGroup
	outs, errs := make([][]byte, 2), make([]error, 2)
	args := [][]string{
		{"switchover", "--admin", f.members[0].admin, "--to", "standby"},
		{"switchover", "--admin", f.members[1].admin, "--to", "standby", "--forced"},
	}
	for i := range args {
		wg.Go(func() { outs[i], errs[i] = ferryCmd(t, args[i]...).CombinedOutput() })
	}
	wg.Wait()
	t.Logf("planned on member 0: %v\n%s\nforced on member 1: %v\n%s", errs[0], outs[0], errs[1], outs[1])
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("planned: %v, forced: %v: want exactly one switch to succeed", errs[0], errs[1])
	}
	loser := 0
	if errs[1] != nil {
		loser = 1
	}
	// The loser is refused (409: the other runs, or flipped first), or,
	// planned, rolls back when the forced switch stops the mirror under
	// its drain (504): either way it changed nothing.
	refusals := []string{"409 switch_running", "409 superseded", "409 already_active", "504 drain_timeout"}
	if out := string(outs[loser]); !slices.ContainsFunc(refusals, func(r string) bool { return strings.Contains(out, r) }) {
		t.Errorf("the switch that lost answered %q, want one of %v", out, refusals)
	}
	for _, m := range f.members {
		waitGeneration(t, m, 1, "standby")
	}
	won := routingState(t, f.members[1-loser])
	if won.Generation != 1 || won.Last == nil || won.Last.Outcome != routing.OutcomeSwitched {
		t.Fatalf("the winner's member routes by %s, last %+v", won, won.Last)
	}

	// Both clusters hold the winner's state: a member restarted later
	// reads the same.
	store, err := routing.NewKafkaStore("ferry-fleet-test", map[string][]string{
		"primary": strings.Split(f.primary.Bootstrap(), ","), "standby": strings.Split(f.standby.Bootstrap(), ",")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, name := range store.Clusters() {
		st, found, err := store.LoadFrom(ctx, name)
		if err != nil || !found || st.Generation != 1 || st.Active != "standby" || st.SwitchID() != won.SwitchID() {
			t.Errorf("cluster %s holds %s of switch %s (found %v, %v), want generation 1 on standby of switch %s", name, st, st.SwitchID(), found, err, won.SwitchID())
		}
	}

	// Writes go through again, through either member.
	tr.waitMore(300, 2*time.Minute)
	for _, m := range f.members {
		probe := newClient(t, kgo.SeedBrokers(m.kafka), kgo.DefaultProduceTopic(topic))
		pctx, pcancel := context.WithTimeout(ctx, time.Minute)
		err := probe.ProduceSync(pctx, &kgo.Record{Value: []byte("probe")}).FirstErr()
		pcancel()
		if err != nil {
			t.Errorf("a probe produce through member %d: %v", m.id, err)
		}
	}
	tr.stop()

	// Every acknowledged record is on the standby at its offset, or
	// inside a lost range the winner reported.
	held := readOffsets(t, ctx, standby, topic)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var unreported []string
	for p, offs := range tr.acked {
		for off, v := range offs {
			if held[p][off] == v {
				continue
			}
			if !inLost(won.Last.Lost, topic, p, off) {
				unreported = append(unreported, fmt.Sprintf("%s[%d]@%d %s (standby: %q)", topic, p, off, v, held[p][off]))
			}
		}
	}
	for p, vs := range tr.unplaced {
		// Acknowledged at -1 (written before, its answer lost): the
		// offset is unknown, so it can only be held, not reported lost.
		onStandby := valuesOf(held[p])
		for _, v := range vs {
			if !onStandby[v] {
				unreported = append(unreported, fmt.Sprintf("%s[%d]@? %s (acknowledged at -1)", topic, p, v))
			}
		}
	}
	sort.Strings(unreported)
	if len(unreported) > 0 {
		last, _ := json.Marshal(won.Last)
		t.Logf("the winner's last switch: %s", last)
		for p := range held {
			t.Logf("%s[%d]: %d records on the standby, %d acknowledged", topic, p, len(held[p]), len(tr.acked[p]))
		}
		t.Fatalf("%d acknowledged records missing from the standby outside the %s switch's lost ranges %v; first: %v",
			len(unreported), won.Last.Mode, won.Last.Lost, unreported[:min(10, len(unreported))])
	}
}

func inLost(lost []routing.LostRange, topic string, p int32, off int64) bool {
	for _, l := range lost {
		if l.Topic == topic && l.Partition == p && off >= l.From && off < l.To {
			return true
		}
	}
	return false
}

// readOffsets reads every record of topic on the cluster at addrs, directly:
// partition → offset → value.
func readOffsets(t *testing.T, ctx context.Context, addrs []string, topic string) map[int32]map[int64]string {
	t.Helper()
	ends, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addrs...))).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	out := map[int32]map[int64]string{}
	left := 0
	ends.Each(func(o kadm.ListedOffset) {
		out[o.Partition] = map[int64]string{}
		if o.Offset > 0 {
			left++
		}
	})
	cons := newClient(t, kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for left > 0 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v", topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			out[r.Partition][r.Offset] = string(r.Value)
			if end, ok := ends.Lookup(topic, r.Partition); ok && r.Offset == end.Offset-1 {
				left--
			}
		})
	}
	return out
}
