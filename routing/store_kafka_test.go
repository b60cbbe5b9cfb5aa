package routing

// KafkaStore against two real 1-node Apache Kafka clusters, "a" and "b",
// started once for the package (skipped under -short). Each test uses a
// topic of its own.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }

var (
	kafkaOnce     sync.Once
	kafkaA        *kafkatest.Cluster
	kafkaB        *kafkatest.Cluster
	kafkaStartErr error
)

func kafkaClusters(t *testing.T) (a, b *kafkatest.Cluster) {
	t.Helper()
	if testing.Short() {
		t.Skip("real Kafka is not started in -short mode")
	}
	kafkaOnce.Do(func() {
		var wg sync.WaitGroup
		var errA, errB error
		wg.Go(func() { kafkaA, errA = kafkatest.New(kafkatest.Config{Brokers: 1, Name: "routing-a"}) })
		wg.Go(func() { kafkaB, errB = kafkatest.New(kafkatest.Config{Brokers: 1, Name: "routing-b"}) })
		wg.Wait()
		if errA != nil || errB != nil {
			kafkaStartErr = fmt.Errorf("a: %v; b: %v", errA, errB)
		}
	})
	if kafkaStartErr != nil {
		t.Fatal(kafkaStartErr)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("a's log:\n%s\nb's log:\n%s", kafkaA.LogTail(40), kafkaB.LogTail(40))
		}
	})
	return kafkaA, kafkaB
}

// testLogger logs to the test and records every entry at warn and above.
func testLogger(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.WarnLevel)
	tl := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	return zap.New(zapcore.NewTee(tl.Core(), core)), logs
}

func newTestStore(t *testing.T, vc, topic string, clusters map[string]*kafkatest.Cluster, opts ...StoreOption) *KafkaStore {
	t.Helper()
	addrs := map[string][]string{}
	for name, c := range clusters {
		addrs[name] = c.Addrs()
	}
	log, _ := testLogger(t)
	s, err := NewKafkaStore(vc, addrs, append([]StoreOption{StoreTopic(topic), StoreLogger(log)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// fullState sets every field of a State.
func fullState(gen uint32, active, from string) State {
	start := time.Date(2025, 3, 1, 12, 0, int(gen), 123456789, time.UTC)
	return State{
		Generation: gen,
		Active:     active,
		Phase:      PhaseServing,
		Last: &Switch{
			Mode: Forced, From: from, To: active,
			Started: start, Finished: start.Add(1500 * time.Millisecond), Duration: "1.5s",
			Outcome: "switched",
			Lost:    []LostRange{{Topic: "orders", Partition: 2, From: 10, To: 15}},
		},
		Fences: []Fence{
			{Generation: max(gen, 2) - 2, Ends: map[string][]int64{"orders": {7, 8, 9}}},
			{Generation: max(gen, 1) - 1, Ends: map[string][]int64{"orders": {100, -1, 15}, "payments": {0}}},
		},
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustSave(t *testing.T, s *KafkaStore, st State) {
	t.Helper()
	if err := s.Save(ctxFor(t, 60*time.Second), st); err != nil {
		t.Fatalf("Save(%s): %v", st, err)
	}
}

// mustLoad loads and fails unless the state found is want (found == false
// when want is nil).
func mustLoad(t *testing.T, s *KafkaStore, want *State) {
	t.Helper()
	got, found, err := s.Load(ctxFor(t, 60*time.Second))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if want == nil {
		if found {
			t.Fatalf("Load found %s, want no state", got)
		}
		return
	}
	if !found {
		t.Fatalf("Load found no state, want %s", *want)
	}
	if !reflect.DeepEqual(got, *want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(*want)
		t.Fatalf("Load:\n got %s\nwant %s", g, w)
	}
}

// produceRaw writes a record to partition 0 of topic directly.
func produceRaw(t *testing.T, c *kafkatest.Cluster, topic, key, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctxFor(t, 30*time.Second), &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatalf("producing to %s: %v", topic, err)
	}
}

// TestKafkaStoreRoundTrip: before any Save, Load finds no state (the topic
// is missing on both clusters). Save then writes the state to both clusters:
// a fresh store reading both, and stores reading one cluster each, load it
// with every field equal. The topic was created with 1 partition, compacted,
// replication factor 1 and min.insync.replicas 1 (1-node clusters), and its
// record is keyed by the virtual cluster ID with a versioned value. Another
// virtual cluster ID on the same topic sees none of it.
func TestKafkaStoreRoundTrip(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_roundtrip"
	both := map[string]*kafkatest.Cluster{"a": a, "b": b}

	mustLoad(t, newTestStore(t, "vc1", topic, both), nil)

	want := fullState(5, "b", "a")
	mustSave(t, newTestStore(t, "vc1", topic, both), want)
	mustLoad(t, newTestStore(t, "vc1", topic, both), &want)
	// A forced switch's state waits 2 s for the cluster it does not
	// make active, then is written there again in the background: on a
	// busy machine the topic just created on a can take longer.
	onlyA := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"a": a})
	testwait.Until(t, 30*time.Second, "a to hold generation 5", func() bool {
		got, found, err := onlyA.Load(ctxFor(t, 10*time.Second))
		return err == nil && found && got.Generation == want.Generation
	})
	mustLoad(t, onlyA, &want)
	mustLoad(t, newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"b": b}), &want)

	other := newTestStore(t, "vc2", topic, both)
	mustLoad(t, other, nil)
	otherState := State{Generation: 9, Active: "a"}
	mustSave(t, other, otherState)
	mustLoad(t, other, &otherState)
	mustLoad(t, newTestStore(t, "vc1", topic, both), &want)

	for name, c := range both {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		adm := kadm.NewClient(cl)
		ctx := ctxFor(t, 30*time.Second)
		td, err := adm.ListTopics(ctx, topic)
		if err != nil || td[topic].Err != nil {
			t.Fatalf("%s: listing %s: %v %v", name, topic, err, td[topic].Err)
		}
		if n, rf := len(td[topic].Partitions), td[topic].Partitions.NumReplicas(); n != 1 || rf != 1 {
			t.Errorf("%s: %s has %d partitions of %d replicas, want 1 of 1", name, topic, n, rf)
		}
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rcs.On(topic, nil)
		if err != nil || rc.Err != nil {
			t.Fatalf("%s: configs of %s: %v %v", name, topic, err, rc.Err)
		}
		got := map[string]string{}
		for _, c := range rc.Configs {
			got[c.Key] = c.MaybeValue()
		}
		for k, v := range map[string]string{"cleanup.policy": "compact", "min.insync.replicas": "1", "max.message.bytes": strconv.Itoa(maxStateBytes)} {
			if got[k] != v {
				t.Errorf("%s: %s's %s is %q, want %q", name, topic, k, got[k], v)
			}
		}

		// The records as a consumer sees them, up to the end of the log:
		// keyed by virtual cluster ID, the value versioned, each a state
		// saved and the last of each key the one loaded. A save that timed
		// out on this cluster may still have landed before the background
		// write that follows it, so a key can hold the same state twice
		// until compaction. The saves are transactional: the control
		// records are kept so that reading ends at the end of the log.
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		end, _ := ends.Lookup(topic, 0)
		cons, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.KeepControlRecords())
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		want := map[string]string{"vc1": "format 1 generation 5", "vc2": "format 1 generation 9"}
		var recs []string
		last := map[string]string{}
		next := int64(0)
		for next < end.Offset && ctx.Err() == nil {
			cons.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				next = r.Offset + 1
				if r.Attrs.IsControl() {
					return
				}
				var v struct {
					Format int `json:"format"`
					State  struct {
						Generation uint32 `json:"generation"`
					} `json:"state"`
				}
				if err := json.Unmarshal(r.Value, &v); err != nil {
					t.Errorf("%s: record %d's value does not decode: %v", name, r.Offset, err)
				}
				got := fmt.Sprintf("format %d generation %d", v.Format, v.State.Generation)
				recs = append(recs, string(r.Key)+"="+got)
				if want[string(r.Key)] != got {
					t.Errorf("%s: record %d, %s=%s, is not a state saved", name, r.Offset, r.Key, got)
				}
				last[string(r.Key)] = got
			})
		}
		if next < end.Offset {
			t.Errorf("%s: read to offset %d of the log's %d", name, next, end.Offset)
		}
		if !reflect.DeepEqual(last, want) {
			t.Errorf("%s: records %v, the last of each key %v, want %v", name, recs, last, want)
		}
	}
}

// TestKafkaStoreEmptyTopic: a topic that exists but holds no record, or only
// records of another virtual cluster, is no state, and Load says so at once
// rather than waiting for records until its timeout.
func TestKafkaStoreEmptyTopic(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_empty"
	for _, c := range []*kafkatest.Cluster{a, b} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := kadm.NewClient(cl).CreateTopic(ctxFor(t, 30*time.Second), 1, 1, nil, topic)
		cl.Close()
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	s := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"a": a, "b": b}, StoreTimeout(60*time.Second))
	start := time.Now()
	mustLoad(t, s, nil)
	empty := time.Since(start)
	produceRaw(t, a, topic, "someone-else", `{"format":1,"state":{"generation":3,"active":"a"}}`)
	start = time.Now()
	mustLoad(t, s, nil)
	t.Logf("Load of an empty topic took %v; of another cluster's record, %v", empty, time.Since(start))
	if empty > 30*time.Second || time.Since(start) > 30*time.Second {
		t.Errorf("Load waited for records (timeout 60s)")
	}
}

// TestKafkaStoreHighestGeneration: the highest generation wins whichever
// cluster holds it; at an equal generation naming different active clusters
// (never written so) the later switch wins and an error is logged.
func TestKafkaStoreHighestGeneration(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_generations"
	onlyA := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"a": a})
	onlyB := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"b": b})
	both := map[string]*kafkatest.Cluster{"a": a, "b": b}

	st4 := fullState(4, "a", "b")
	mustSave(t, newTestStore(t, "vc1", topic, both), st4)
	st5 := fullState(5, "b", "a")
	mustSave(t, onlyB, st5)
	mustLoad(t, newTestStore(t, "vc1", topic, both), &st5)
	st6 := fullState(6, "a", "b")
	mustSave(t, onlyA, st6)
	mustLoad(t, newTestStore(t, "vc1", topic, both), &st6)

	for i, laterOnA := range []bool{true, false} {
		gen := uint32(7 + i)
		onA, onB := fullState(gen, "a", "b"), fullState(gen, "b", "a")
		later := &onB
		if laterOnA {
			later = &onA
		}
		later.Last.Finished = later.Last.Finished.Add(time.Minute)
		mustSave(t, onlyA, onA)
		mustSave(t, onlyB, onB)
		addrs := map[string][]string{"a": a.Addrs(), "b": b.Addrs()}
		log, logs := testLogger(t)
		s, err := NewKafkaStore("vc1", addrs, StoreTopic(topic), StoreLogger(log))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		mustLoad(t, s, later)
		if n := logs.FilterLevelExact(zap.ErrorLevel).FilterMessageSnippet("same generation").Len(); n != 1 {
			t.Errorf("generation %d on both clusters, differing: %d errors logged, want 1: %v", gen, n, logs.All())
		}
	}

	// A save of generation 10 to b that landed after its switch had
	// rolled back, voiding 10 on a: the state of 10 is passed over and
	// a's is taken, though older.
	late := fullState(10, "b", "a")
	mustSave(t, onlyB, late)
	back := fullState(9, "a", "b")
	back.Voided = []uint32{10}
	mustSave(t, onlyA, back)
	mustLoad(t, newTestStore(t, "vc1", topic, both), &back)
}

// TestKafkaStoreUndecodable: records of this virtual cluster that do not
// decode (not JSON, an unknown format, no active cluster) are skipped, and
// the last one that decodes is loaded; a later Save is read past them.
func TestKafkaStoreUndecodable(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_undecodable"
	both := map[string]*kafkatest.Cluster{"a": a, "b": b}
	s := newTestStore(t, "vc1", topic, both)
	st2 := fullState(2, "a", "b")
	mustSave(t, s, st2)
	for _, c := range []*kafkatest.Cluster{a, b} {
		produceRaw(t, c, topic, "vc1", "not json")
		produceRaw(t, c, topic, "vc1", `{"format":2,"state":{"generation":99,"active":"a"}}`)
		produceRaw(t, c, topic, "vc1", `{"format":1,"state":{"generation":98}}`)
	}
	log, logs := testLogger(t)
	fresh, err := NewKafkaStore("vc1", map[string][]string{"a": a.Addrs(), "b": b.Addrs()}, StoreTopic(topic), StoreLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	mustLoad(t, fresh, &st2)
	if n := logs.FilterMessageSnippet("does not decode").Len(); n != 6 {
		t.Errorf("%d undecodable records logged, want 6 (3 per cluster): %v", n, logs.All())
	}
	st3 := fullState(3, "b", "a")
	mustSave(t, s, st3)
	mustLoad(t, fresh, &st3)
}

// TestKafkaStoreClusterDown: with cluster a stopped, a Save that makes a
// active fails within its context and leaves b's state as it was; one that
// makes b active succeeds, and Load reads it from b alone; a store that
// reaches only a cannot Load. Once a is back it holds neither of the
// generation-2 states (the failed write did not land late), the higher
// generation on b wins over a's older one, and the same store writes to a
// again.
func TestKafkaStoreClusterDown(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_down"
	both := map[string]*kafkatest.Cluster{"a": a, "b": b}
	s := newTestStore(t, "vc1", topic, both, StoreTimeout(3*time.Second))
	onlyB := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"b": b})
	onlyA := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"a": a}, StoreTimeout(3*time.Second))
	st1 := fullState(1, "b", "a")
	mustSave(t, s, st1)

	if err := a.Stop(1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !a.Running(1) {
			if err := a.Restart(1); err != nil {
				t.Errorf("restarting a: %v", err)
			}
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	start := time.Now()
	err := s.Save(ctx, fullState(2, "a", "b"))
	cancel()
	t.Logf("Save with the active cluster down: %v after %v", err, time.Since(start))
	if err == nil {
		t.Fatal("Save succeeded with the cluster it makes active stopped")
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("Save took %v with a 5s context", time.Since(start))
	}
	mustLoad(t, onlyB, &st1)

	st2 := fullState(2, "b", "a")
	start = time.Now()
	mustSave(t, s, st2)
	t.Logf("Save with the other cluster down took %v (per-cluster timeout 3s)", time.Since(start))
	start = time.Now()
	mustLoad(t, s, &st2)
	t.Logf("Load with one cluster down took %v", time.Since(start))
	if _, _, err := onlyA.Load(ctxFor(t, 60*time.Second)); err == nil {
		t.Error("Load from a stopped cluster alone succeeded")
	}

	if err := a.Restart(1); err != nil {
		t.Fatal(err)
	}
	// The failed Save left nothing behind on a either; the one that
	// missed a is written there once a is back (it held generation 1
	// until then).
	failed := fullState(2, "a", "b")
	testwait.Eventually(t, 60*time.Second, "the save that missed a written there after its restart", func() error {
		got, found, err := onlyA.Load(ctxFor(t, 60*time.Second))
		if err != nil || !found {
			t.Fatalf("Load from a: %v, %v", found, err)
		}
		if reflect.DeepEqual(got, failed) {
			t.Fatalf("a holds the state of the Save that failed: %s", got)
		}
		if reflect.DeepEqual(got, st2) {
			return nil
		}
		if !reflect.DeepEqual(got, st1) {
			t.Fatalf("a holds %s, want %s until the missed save is written there, then %s", got, st1, st2)
		}
		return fmt.Errorf("a still holds %s", got)
	})
	mustLoad(t, newTestStore(t, "vc1", topic, both), &st2)
	st3 := fullState(3, "a", "b")
	mustSave(t, s, st3)
	mustLoad(t, onlyA, &st3)
	mustLoad(t, onlyB, &st3)
}

// TestKafkaStoreForcedSaveSkipsUnreachable: a forced switch's save told
// that the old cluster is unreachable (automatic failover found it so,
// WithUnreachable) does not wait to read it, where one not told waits
// (forcedOtherWait; having failed to read it, neither waits to write it);
// the state reaches the old cluster in the background once it is back.
func TestKafkaStoreForcedSaveSkipsUnreachable(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_skip"
	both := map[string]*kafkatest.Cluster{"a": a, "b": b}
	s := newTestStore(t, "vc1", topic, both, StoreTimeout(3*time.Second))
	onlyA := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"a": a}, StoreTimeout(3*time.Second))
	mustSave(t, s, fullState(1, "a", "b"))
	if err := a.Stop(1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !a.Running(1) {
			a.Restart(1)
		}
	})
	start := time.Now()
	mustSave(t, s, fullState(2, "b", "a"))
	waited := time.Since(start)
	st3 := fullState(3, "b", "a")
	start = time.Now()
	if err := s.Save(WithUnreachable(ctxFor(t, 60*time.Second), []string{"a"}), st3); err != nil {
		t.Fatal(err)
	}
	skipped := time.Since(start)
	t.Logf("a forced save with the old cluster down took %v; told it is unreachable, %v", waited, skipped)
	if waited < forcedOtherWait {
		t.Fatalf("the save not told waited %v, less than its wait to read the old cluster (%v): the comparison means nothing", waited, forcedOtherWait)
	}
	if skipped > waited-forcedOtherWait/2 {
		t.Fatalf("told the old cluster is unreachable, the save took %v, against %v not told: it waited for it", skipped, waited)
	}
	if err := a.Restart(1); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 60*time.Second, "the skipped cluster written in the background", func() error {
		got, found, err := onlyA.Load(ctxFor(t, 30*time.Second))
		if err != nil || !found || got.Generation != 3 {
			return fmt.Errorf("a holds %v (found %v, %v)", got, found, err)
		}
		return nil
	})
}

// TestKafkaStoreNeverReplacesNewer: Save writes nothing, and answers
// ErrSuperseded, when a cluster holds a newer generation (a planned
// switch's rollback after a forced switch flipped), the same generation
// made by another switch (two switches at once), or another switch's
// draining state for a serving state (a rollback releasing a running
// switch's hold). Both clusters keep what they held.
func TestKafkaStoreNeverReplacesNewer(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_superseded"
	s := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"a": a, "b": b})
	withID := func(st State, id, outcome string, phase Phase) State {
		st.Last.ID, st.Last.Outcome, st.Phase = id, outcome, phase
		return st
	}
	both := func(want State) {
		t.Helper()
		for _, name := range []string{"a", "b"} {
			got, found, err := s.LoadFrom(ctxFor(t, 60*time.Second), name)
			if err != nil || !found || got.Generation != want.Generation || got.Active != want.Active || got.Phase != want.Phase || got.SwitchID() != want.SwitchID() {
				t.Fatalf("cluster %s holds %s of switch %s (found %v, %v), want %s of switch %s", name, got, got.SwitchID(), found, err, want, want.SwitchID())
			}
		}
	}
	refused := func(st State) {
		t.Helper()
		err := s.Save(ctxFor(t, 60*time.Second), st)
		if !errors.Is(err, ErrSuperseded) {
			t.Fatalf("Save(%s of switch %s): %v, want ErrSuperseded", st, st.SwitchID(), err)
		}
	}

	// A planned switch x from generation 0 saved its draining state; a
	// forced switch f saved generation 1 on b; x's rollback is refused.
	draining := withID(fullState(0, "a", "b"), "x", "", PhaseDraining)
	mustSave(t, s, draining)
	forced := withID(fullState(1, "b", "a"), "f", OutcomeSwitched, PhaseServing)
	mustSave(t, s, forced)
	refused(withID(fullState(0, "a", "b"), "x", "rolled back: drain", PhaseServing))
	both(forced)

	// Two switches at once from generation 1: y made generation 2; z's
	// generation 2 is refused.
	y := withID(fullState(2, "a", "b"), "y", OutcomeSwitched, PhaseServing)
	mustSave(t, s, y)
	refused(withID(fullState(2, "a", "b"), "z", OutcomeSwitched, PhaseServing))
	both(y)

	// u holds writes (its draining state of 2); v's rollback to serving
	// 2 is refused, u's own next steps are not.
	u := withID(fullState(2, "a", "b"), "u", "", PhaseDraining)
	mustSave(t, s, u)
	refused(withID(fullState(2, "a", "b"), "v", "rolled back: drain", PhaseServing))
	both(u)
	uBack := withID(fullState(2, "a", "b"), "u", "rolled back: drain", PhaseServing)
	mustSave(t, s, uBack)
	both(uBack)
}

// TestKafkaStoreRaceBetweenCheckAndWrite: two members save at once, as a
// planned switch's draining state and a forced switch's flip did in
// TestSwitchRaceRealKafka. The planned switch's save read both clusters
// (generation 0, serving) and wrote a; before its write to b commits, the
// forced switch saves generation 1 on b and a. The planned switch's write
// to b must not land after it: both clusters end with generation 1, and
// every member loads it. (Before writes were conditional in one
// transaction, b held the draining state of generation 0, written last,
// and every member's write lease stopped: the active cluster held an older
// state than theirs.)
func TestKafkaStoreRaceBetweenCheckAndWrite(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_race"
	clusters := map[string]*kafkatest.Cluster{"a": a, "b": b}
	plannedStore := newTestStore(t, "vc1", topic, clusters)
	forcedStore := newTestStore(t, "vc1", topic, clusters)
	withID := func(st State, id, outcome string, phase Phase) State {
		st.Last.ID, st.Last.Outcome, st.Phase = id, outcome, phase
		return st
	}
	mustSave(t, forcedStore, withID(fullState(0, "a", "b"), "start", OutcomeSwitched, PhaseServing))

	draining := withID(fullState(0, "a", "b"), "planned", "", PhaseDraining)
	flipped := withID(fullState(1, "b", "a"), "forced", OutcomeSwitched, PhaseServing)
	var raced []string
	plannedStore.beforeCommit = func(cluster string) {
		raced = append(raced, cluster)
		if cluster != "b" || len(raced) > 2 {
			return
		}
		if err := forcedStore.Save(ctxFor(t, 60*time.Second), flipped); err != nil {
			t.Errorf("the forced switch's save: %v", err)
		}
	}
	// a is the draining state's active cluster: written first, before the
	// forced save; b's write is refused, which Save logs.
	if err := plannedStore.Save(ctxFor(t, 60*time.Second), draining); err != nil {
		t.Fatalf("the planned switch's save: %v", err)
	}
	for _, name := range []string{"a", "b"} {
		got, found, err := plannedStore.LoadFrom(ctxFor(t, 60*time.Second), name)
		if err != nil || !found || got.Generation != 1 || got.Active != "b" || got.SwitchID() != "forced" {
			t.Errorf("cluster %s holds %s of switch %s (found %v, %v), want generation 1 active on b of switch forced", name, got, got.SwitchID(), found, err)
		}
	}
	for _, s := range []*KafkaStore{plannedStore, forcedStore} {
		got, found, err := s.Load(ctxFor(t, 60*time.Second))
		if err != nil || !found || got.Generation != 1 || got.Active != "b" {
			t.Errorf("Load: %s (found %v, %v), want generation 1 active on b", got, found, err)
		}
	}
	if want := []string{"a", "b"}; !reflect.DeepEqual(raced, want) {
		t.Errorf("the planned switch's writes got to commit on %v, want %v (once on each; the retry on b finds generation 1)", raced, want)
	}
}

// A Load right after a Save reads the state it wrote: the Save's
// transaction answered committed has its marker written a moment later,
// and a read in between took the state before it (CI, under load: a fresh
// store found nothing; a member restarted right after a switch would route
// by the generation before). Here the newer state's transaction is still
// open when Load starts and commits a second later: Load waits for it.
func TestKafkaStoreLoadWaitsForAStableLog(t *testing.T) {
	a, _ := kafkaClusters(t)
	const topic = "__ferry_routing_stable"
	only := map[string]*kafkatest.Cluster{"a": a}
	mustSave(t, newTestStore(t, "vc1", topic, only), fullState(5, "a", "b"))

	next := fullState(6, "a", "b")
	val, err := json.Marshal(storedState{Format: storeFormat, State: next})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := kgo.NewClient(kgo.SeedBrokers(a.Addrs()...), kgo.TransactionalID("store-stable-test"), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	ctx := ctxFor(t, 60*time.Second)
	if err := tx.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := tx.ProduceSync(ctx, &kgo.Record{Key: []byte("vc1"), Value: val}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	time.AfterFunc(time.Second, func() { committed <- tx.EndTransaction(ctx, kgo.TryCommit) })
	mustLoad(t, newTestStore(t, "vc1", topic, only), &next)
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
}

// requestLog records the requests a store's clients send, by broker port
// and API key (kgo.HookBrokerWrite).
type requestLog struct {
	mu   sync.Mutex
	sent map[int32]map[int16]int // port → key → count
}

func (l *requestLog) OnBrokerWrite(m kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sent == nil {
		l.sent = map[int32]map[int16]int{}
	}
	if l.sent[m.Port] == nil {
		l.sent[m.Port] = map[int16]int{}
	}
	l.sent[m.Port][key]++
}

// take returns what was sent to c's (one) broker since the last take, by
// request name, and forgets it.
func (l *requestLog) take(c *kafkatest.Cluster) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, port, _ := net.SplitHostPort(c.Addrs()[0])
	p, _ := strconv.Atoi(port)
	out := map[string]int{}
	for key, n := range l.sent[int32(p)] {
		out[kmsg.NameForKey(key)] = n
	}
	delete(l.sent, int32(p))
	return out
}

// TestKafkaStoreKeepsItsProducer: a save keeps the transactional producer
// of each write that committed, and where it read the topic, so that the
// next save to a cluster is a Produce, a Fetch and an EndTxn there, and a
// Fetch for the check: no new connections, no InitProducerId, no
// Metadata or ListOffsets (at 50 ms a round trip, 870 ms per save became
// 255 ms). A kept producer another member's write has fenced since is
// replaced at once: the save lands, and the fencing that makes the write
// conditional holds for a kept producer (another member's write while
// its transaction is open fences it; the other's state is read, not
// overwritten).
// A topic deleted and recreated is read again from its new log start,
// not where the last read of the old one started.
func TestKafkaStoreKeepsItsProducer(t *testing.T) {
	a, b := kafkaClusters(t)
	const topic = "__ferry_routing_kept"
	clusters := map[string]*kafkatest.Cluster{"a": a, "b": b}
	sent := &requestLog{}
	s := newTestStore(t, "vc1", topic, clusters, func(c *storeConfig) { c.clientOpts = append(c.clientOpts, kgo.WithHooks(sent)) })
	other := newTestStore(t, "vc1", topic, clusters)

	mustSave(t, s, fullState(1, "a", "b"))
	sent.take(a)
	sent.take(b)
	want := fullState(2, "a", "b")
	mustSave(t, s, want)
	for name, c := range clusters {
		got := sent.take(c)
		for _, api := range []string{"InitProducerID", "FindCoordinator", "ApiVersions", "Metadata", "ListOffsets"} {
			if got[api] != 0 {
				t.Errorf("the second save sent %d %s to %s (sent %v), want none", got[api], api, name, got)
			}
		}
		if got["Produce"] != 1 || got["EndTxn"] != 1 {
			t.Errorf("the second save sent %v to %s, want one Produce and one EndTxn", got, name)
		}
	}
	mustLoad(t, s, &want)

	// Another member saves: its InitProducerId fences s's kept
	// producers. s's next save replaces them, and lands.
	mustSave(t, other, fullState(3, "b", "a"))
	want = fullState(4, "a", "b")
	mustSave(t, s, want)
	if got := sent.take(a); got["InitProducerID"] == 0 {
		t.Errorf("the save after another member's sent %v to a: no InitProducerId, so the fenced producer was used", got)
	}
	mustLoad(t, s, &want)
	mustLoad(t, other, &want)

	// Another member saves while s's kept producer has its record in an
	// open transaction on a: s's write is fenced, reads again, finds the
	// newer generation and is refused; no cluster holds s's state.
	raced := 0
	s.beforeCommit = func(cluster string) {
		if raced++; raced > 1 {
			return
		}
		if err := other.Save(ctxFor(t, 60*time.Second), fullState(6, "b", "a")); err != nil {
			t.Errorf("the other member's save: %v", err)
		}
	}
	if err := s.Save(ctxFor(t, 60*time.Second), fullState(5, "a", "b")); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("a save whose write another member's fenced: %v, want ErrSuperseded", err)
	}
	s.beforeCommit = nil
	if raced != 1 {
		t.Errorf("s's writes got to commit %d times, want once (the retry finds generation 6)", raced)
	}
	want = fullState(6, "b", "a")
	mustLoad(t, s, &want)
	for _, name := range []string{"a", "b"} {
		if got, found, err := s.LoadFrom(ctxFor(t, 60*time.Second), name); err != nil || !found || got.Generation != 6 {
			t.Errorf("cluster %s holds %s (found %v, %v), want generation 6", name, got, found, err)
		}
	}

	// A store that has not written yet, warmed for a (as a planned
	// switch does while it drains): its save to a finds its producer
	// ready.
	warm := newTestStore(t, "vc1", topic, clusters, func(c *storeConfig) { c.clientOpts = append(c.clientOpts, kgo.WithHooks(sent)) })
	warm.Warm(ctxFor(t, 60*time.Second), "a")
	if err := warm.clusters["a"].warmed(ctxFor(t, 60*time.Second)); err != nil {
		t.Fatal(err)
	}
	sent.take(a)
	mustSave(t, warm, fullState(7, "a", "b"))
	if got := sent.take(a); got["InitProducerID"] != 0 || got["FindCoordinator"] != 0 || got["ListOffsets"] != 0 || got["Produce"] != 1 || got["EndTxn"] != 1 {
		t.Errorf("a warmed store's save sent %v to a, want one Produce and one EndTxn, and no InitProducerId, FindCoordinator or ListOffsets", got)
	}

	// The topic deleted and recreated on a, with another state in it:
	// s reads that, not from where it last read.
	cl, err := kgo.NewClient(kgo.SeedBrokers(a.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).DeleteTopic(ctxFor(t, 30*time.Second), topic); err != nil {
		t.Fatal(err)
	}
	fresh := newTestStore(t, "vc1", topic, map[string]*kafkatest.Cluster{"a": a})
	recreated := fullState(1, "a", "b")
	testwait.Eventually(t, 60*time.Second, "the state saved in the recreated topic", func() error { return fresh.Save(ctxFor(t, 10*time.Second), recreated) })
	got, found, err := s.LoadFrom(ctxFor(t, 60*time.Second), "a")
	if err != nil || !found || got.Generation != 1 {
		t.Fatalf("a holds %s (found %v, %v) after its topic was recreated, want generation 1", got, found, err)
	}
}
