package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// readPartition reads the records of one partition directly from a
// cluster, as "offset=value", until it has n of them.
func readPartition(t *testing.T, addrs []string, topic string, partition int32, n int) []string {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
		topic: {partition: kgo.NewOffset().AtStart()},
	}), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s[%d] on %v: read %d of %d records: %v", topic, partition, addrs, len(out), n, out)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, fmt.Sprintf("%d=%s", r.Offset, r.Value)) })
	}
	return out
}

// produceTo produces values to one partition directly and returns their
// offsets.
func produceTo(t *testing.T, addrs []string, topic string, partition int32, values ...string) []int64 {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var offsets []int64
	for _, v := range values {
		r := &kgo.Record{Topic: topic, Partition: partition, Value: []byte(v)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce to %s[%d]: %v", topic, partition, err)
		}
		offsets = append(offsets, r.Offset)
	}
	return offsets
}

func kfakeCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// kfakePairConfig is the configuration of clusters a and b, with mirror
// its mirror section ("" for the defaults).
func kfakePairConfig(t *testing.T, a, b *kfake.Cluster, mirror string) *Config {
	t.Helper()
	cfg, err := configFrom(fmt.Sprintf(`
cluster_id: vc
admin_listen: 127.0.0.1:0
clusters:
  - {name: a, bootstrap: [%s]}
  - {name: b, bootstrap: [%s]}
%s
`, strings.Join(a.ListenAddrs(), ","), strings.Join(b.ListenAddrs(), ","), mirror))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// gathered returns the names of the metric families in reg.
func gathered(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	return strings.Join(names, " ")
}

// TestMirrorRunnerFollowsRouting: the runner mirrors the routing state's
// active cluster to the other one, restarts the other way round when the
// active cluster changes (offsets stay equal both ways), re-registers its
// metrics without a clash, and stops cleanly.
func TestMirrorRunnerFollowsRouting(t *testing.T) {
	a, b := kfakeCluster(t), kfakeCluster(t)
	cfg := kfakePairConfig(t, a, b, `mirror: {sync_interval: 1s}`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, kgo.SeedBrokers(a.ListenAddrs()...)))
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, "t"); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("%d=a%d", i, i))
		produceTo(t, a.ListenAddrs(), "t", 0, fmt.Sprintf("a%d", i))
	}

	reg := prometheus.NewRegistry()
	r := newMirrorRunner(cfg, zaptest.NewLogger(t), reg, nil, nil, nil)
	t.Cleanup(r.Close)
	if info := r.Info(); !info.Enabled || info.Running {
		t.Fatalf("before Follow: %+v", info)
	}

	// Generation 0, a active: a → b.
	if err := r.Follow(routing.State{Generation: 0, Active: "a"}); err != nil {
		t.Fatal(err)
	}
	first := r.cur.Load()
	if err := r.WaitCaughtUp(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if got := readPartition(t, b.ListenAddrs(), "t", 0, 10); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("standby b holds %v, want %v", got, want)
	}
	info := r.Info()
	if !info.Running || info.Source != "a" || info.Target != "b" || len(info.Partitions) != 2 {
		t.Fatalf("info %+v", info)
	}
	// The empty partition is caught up once its writer has fetched once.
	testwait.Eventually(t, 10*time.Second, "every partition caught up", func() error {
		for _, p := range r.Info().Partitions {
			if p.State != mirror.StateCaughtUp || p.LagRecords != 0 {
				return fmt.Errorf("partition %+v", p)
			}
		}
		return nil
	})
	if names := gathered(t, reg); !strings.Contains(names, "ferry_mirror_lag_records") || !strings.Contains(names, "ferry_mirror_bytes_total") {
		t.Fatalf("ferry_mirror_* not registered: %s", names)
	}

	// The same state again: the running mirror is kept.
	if err := r.Follow(routing.State{Generation: 0, Active: "a"}); err != nil || r.cur.Load() != first {
		t.Fatalf("Follow of the same state restarted the mirror (%v)", err)
	}

	// Generation 1, b active: the mirror now runs b → a, and a record
	// produced to b lands on a at the offset it has on b.
	if err := r.Follow(routing.State{Generation: 1, Active: "b"}); err != nil {
		t.Fatal(err)
	}
	if info := r.Info(); info.Source != "b" || info.Target != "a" {
		t.Fatalf("after the switch: %+v", info)
	}
	offs := produceTo(t, b.ListenAddrs(), "t", 0, "b10", "b11")
	if offs[0] != 10 || offs[1] != 11 {
		t.Fatalf("produced to b at %v, want 10 and 11", offs)
	}
	if err := r.WaitCaughtUp(ctx, "t"); err != nil {
		t.Fatalf("b → a: %v (status %+v)", err, r.Info().Partitions)
	}
	want = append(want, "10=b10", "11=b11")
	if got := readPartition(t, a.ListenAddrs(), "t", 0, 12); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a after mirroring back holds %v, want %v", got, want)
	}
	if names := gathered(t, reg); !strings.Contains(names, "ferry_mirror_bytes_total") {
		t.Fatalf("ferry_mirror_* not registered after the restart: %s", names)
	}

	// Stop: not running, metrics gone; Close: nothing starts any more.
	r.Stop()
	if info := r.Info(); !info.Enabled || info.Running || info.Partitions != nil {
		t.Fatalf("after Stop: %+v", info)
	}
	if names := gathered(t, reg); strings.Contains(names, "ferry_mirror_") {
		t.Fatalf("ferry_mirror_* still registered after Stop: %s", names)
	}
	if err := r.WaitCaughtUp(ctx); err == nil {
		t.Fatal("WaitCaughtUp with no mirror running succeeded")
	}
	r.Close()
	r.Close()
	if err := r.Follow(routing.State{Generation: 2, Active: "a"}); !errors.Is(err, mirror.ErrClosed) {
		t.Fatalf("Follow after Close: %v", err)
	}
	if err := r.Follow(routing.State{Generation: 2, Active: "c"}); err == nil || !strings.Contains(err.Error(), `"c" is not configured`) {
		t.Fatalf("Follow to an unknown cluster: %v", err)
	}
}

// TestMirrorRunnerSetFilters: new filters (a reload) restart the running
// mirror in the same direction; a topic the new filter selects is copied
// at its source offsets, one it leaves out stops being copied and keeps
// what it had.
func TestMirrorRunnerSetFilters(t *testing.T) {
	a, b := kfakeCluster(t), kfakeCluster(t)
	cfg := kfakePairConfig(t, a, b, `mirror: {sync_interval: 1s, topics: {include: ["orders"]}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, kgo.SeedBrokers(a.ListenAddrs()...)))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "orders"); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "payments"); err != nil {
		t.Fatal(err)
	}
	produceTo(t, a.ListenAddrs(), "orders", 0, "o0", "o1")
	produceTo(t, a.ListenAddrs(), "payments", 0, "p0", "p1", "p2")

	r := newMirrorRunner(cfg, zaptest.NewLogger(t), prometheus.NewRegistry(), nil, nil, nil)
	t.Cleanup(r.Close)
	if err := r.Follow(routing.State{Generation: 0, Active: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readPartition(t, b.ListenAddrs(), "orders", 0, 2); fmt.Sprint(got) != "[0=o0 1=o1]" {
		t.Fatalf("b holds orders %v", got)
	}
	bAdm := kadm.NewClient(newClient(t, kgo.SeedBrokers(b.ListenAddrs()...)))
	if td, err := bAdm.ListTopics(ctx); err != nil || td.Has("payments") {
		t.Fatalf("payments on b before it is selected (%v)", err)
	}

	// payments in, orders out.
	if err := r.SetFilters(Selection{Include: []string{"payments"}}, Selection{}); err != nil {
		t.Fatal(err)
	}
	if info := r.Info(); !info.Running || info.Source != "a" || info.Target != "b" {
		t.Fatalf("after SetFilters: %+v", info)
	}
	if err := r.WaitCaughtUp(ctx, "payments"); err != nil {
		t.Fatalf("payments: %v (status %+v)", err, r.Info().Partitions)
	}
	if got := readPartition(t, b.ListenAddrs(), "payments", 0, 3); fmt.Sprint(got) != "[0=p0 1=p1 2=p2]" {
		t.Fatalf("b holds payments %v", got)
	}
	produceTo(t, a.ListenAddrs(), "orders", 0, "o2")
	produceTo(t, a.ListenAddrs(), "payments", 0, "p3")
	if got := readPartition(t, b.ListenAddrs(), "payments", 0, 4); fmt.Sprint(got) != "[0=p0 1=p1 2=p2 3=p3]" {
		t.Fatalf("b holds payments %v", got)
	}
	for _, p := range r.Info().Partitions {
		if p.Topic == "orders" {
			t.Errorf("orders still mirrored after the filter left it out: %+v", p)
		}
	}
	ends, err := bAdm.ListEndOffsets(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup("orders", 0); o.Offset != 2 {
		t.Errorf("orders on b ends at %d, want 2: what was copied is kept, o2 is not copied", o.Offset)
	}
}

// TestREADMEListsMirrorMetrics: every metric the mirror registers is in
// the README's metrics table.
func TestREADMEListsMirrorMetrics(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	tr := &trackingRegisterer{reg: reg}
	m, err := mirror.New(mirror.Source("127.0.0.1:1"), mirror.Target("127.0.0.1:2"), mirror.Registerer(tr))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var names []string
	for _, c := range tr.cs {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			if sm := fqName.FindStringSubmatch(d.String()); sm != nil {
				names = append(names, sm[1])
			}
		}
	}
	if len(names) < 5 {
		t.Fatalf("found only %v", names)
	}
	for _, name := range names {
		if !strings.Contains(string(readme), "| `"+name) {
			t.Errorf("README.md's metrics table does not list %s", name)
		}
	}
	tr.unregisterAll()
	if names := gathered(t, reg); names != "" {
		t.Fatalf("after unregisterAll: %s", names)
	}
}

// The sync gate of a mirror is open only while its source is the active
// cluster, no switch is flipping and the member's write gate is open:
// between a switch's flip and the mirror's stop, or on a member that was
// paused or restarted through a switch, the old direction's sync would
// copy the old cluster's offsets onto the cluster now active. A draining
// switch leaves it open: the drain may wait for a topic the sync creates
// on the standby (TestSwitchRolledBackWhenTheMirrorCannotDrain: a topic
// the standby was down for).
func TestMirrorSyncGate(t *testing.T) {
	st := routing.State{Generation: 3, Active: "a", Phase: routing.PhaseServing}
	leased := true
	r := &mirrorRunner{routes: func() routing.State { return st }, gate: func() bool { return leased }}
	fromA, fromB := r.syncGate("a"), r.syncGate("b")
	for _, c := range []struct {
		what         string
		active       string
		phase        routing.Phase
		leased       bool
		wantA, wantB bool
	}{
		{"a active, serving, leased", "a", routing.PhaseServing, true, true, false},
		{"a switch draining", "a", routing.PhaseDraining, true, true, false},
		{"a switch flipping", "a", routing.PhaseSwitching, true, false, false},
		{"flipped to b, the mirror from a not stopped yet", "b", routing.PhaseServing, true, false, true},
		{"the write lease lapsed", "a", routing.PhaseServing, false, false, false},
	} {
		st.Active, st.Phase, leased = c.active, c.phase, c.leased
		if got := fromA(); got != c.wantA {
			t.Errorf("%s: the mirror from a may sync: %v, want %v", c.what, got, c.wantA)
		}
		if got := fromB(); got != c.wantB {
			t.Errorf("%s: the mirror from b may sync: %v, want %v", c.what, got, c.wantB)
		}
	}
	groups := r.groupSyncGate()
	for _, c := range []struct {
		phase routing.Phase
		want  bool
	}{{routing.PhaseServing, true}, {routing.PhaseDraining, false}, {routing.PhaseSwitching, false}} {
		st.Active, st.Phase, leased = "a", c.phase, true
		if got := groups(); got != c.want {
			t.Errorf("%s: the periodic group copy may run: %v, want %v", c.phase, got, c.want)
		}
	}
	if !(&mirrorRunner{}).syncGate("a")() {
		t.Error("a runner with no routing state and no write gate (a mirror on its own) must sync")
	}
}
