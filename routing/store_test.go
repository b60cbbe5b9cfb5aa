package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestKafkaStoreTopicSettings: the topic Ferry creates has three replicas
// where the cluster has three brokers or more, and min.insync.replicas 2;
// fewer brokers, as many replicas as brokers and at most that many in sync.
// (In-process kfake clusters; the other settings are checked on real Kafka.)
func TestKafkaStoreTopicSettings(t *testing.T) {
	for _, tc := range []struct{ brokers, rf, minISR int }{{1, 1, 1}, {2, 2, 2}, {4, 3, 2}} {
		c, err := kfake.NewCluster(kfake.NumBrokers(tc.brokers))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := NewKafkaStore("vc", map[string][]string{"x": c.ListenAddrs()}, StoreLogger(zaptest.NewLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st := State{Generation: 1, Active: "x", Phase: PhaseServing}
		if err := s.Save(ctx, st); err != nil {
			t.Fatalf("%d brokers: Save: %v", tc.brokers, err)
		}
		got, found, err := s.Load(ctx)
		if err != nil || !found || !reflect.DeepEqual(got, st) {
			t.Fatalf("%d brokers: Load = %v, %v, %v; want %v", tc.brokers, got, found, err, st)
		}

		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		adm := kadm.NewClient(cl)
		td, err := adm.ListTopics(ctx, DefaultStoreTopic)
		if err != nil || td[DefaultStoreTopic].Err != nil {
			t.Fatalf("%d brokers: %v %v", tc.brokers, err, td[DefaultStoreTopic].Err)
		}
		if n, rf := len(td[DefaultStoreTopic].Partitions), td[DefaultStoreTopic].Partitions.NumReplicas(); n != 1 || rf != tc.rf {
			t.Errorf("%d brokers: %d partitions of %d replicas, want 1 of %d", tc.brokers, n, rf, tc.rf)
		}
		rcs, err := adm.DescribeTopicConfigs(ctx, DefaultStoreTopic)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rcs.On(DefaultStoreTopic, nil)
		if err != nil {
			t.Fatal(err)
		}
		configs := map[string]string{}
		for _, cfg := range rc.Configs {
			configs[cfg.Key] = cfg.MaybeValue()
		}
		if configs["min.insync.replicas"] != strconv.Itoa(tc.minISR) || configs["cleanup.policy"] != "compact" {
			t.Errorf("%d brokers: min.insync.replicas %q, cleanup.policy %q; want %d, compact", tc.brokers, configs["min.insync.replicas"], configs["cleanup.policy"], tc.minISR)
		}
	}
}

// TestNewKafkaStoreRefuses: a topic the mirror would copy, no clusters, no
// cluster ID.
func TestNewKafkaStoreRefuses(t *testing.T) {
	addrs := map[string][]string{"a": {"127.0.0.1:1"}}
	for name, f := range map[string]func() error{
		"mirrored topic": func() error { _, err := NewKafkaStore("vc", addrs, StoreTopic("ferry_routing")); return err },
		"no clusters":    func() error { _, err := NewKafkaStore("vc", nil); return err },
		"no cluster ID":  func() error { _, err := NewKafkaStore("", addrs); return err },
		"no addresses":   func() error { _, err := NewKafkaStore("vc", map[string][]string{"a": nil}); return err },
	} {
		if f() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	s, err := NewKafkaStore("vc", addrs)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
}

// TestKafkaStoreSaveRewritesMissedCluster: a save whose write to a cluster
// it does not make active fails (the old cluster of a planned switch, its
// produces refused for a while) still succeeds, as the new active cluster
// holds the state, and the state is written to the old cluster once it
// takes writes again: a member that reads only the old cluster then finds
// the new generation there, not the old one draining. A cluster that
// already holds a newer generation is left as it is.
func TestKafkaStoreSaveRewritesMissedCluster(t *testing.T) {
	clusters := map[string]*kfake.Cluster{}
	addrs := map[string][]string{}
	for _, name := range []string{"a", "b"} {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clusters[name], addrs[name] = c, c.ListenAddrs()
	}
	var aDown, refuseGen6 atomic.Bool
	clusters["a"].ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		clusters["a"].KeepControl()
		if aDown.Load() || refuseGen6.Load() && producesGeneration(t, req, 6) {
			return nil, errors.New("refusing produces"), true
		}
		return nil, nil, false
	})
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	s, err := NewKafkaStore("vc", addrs, StoreLogger(log), StoreTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	draining := State{Generation: 3, Active: "a", Phase: PhaseDraining}
	if err := s.Save(ctx, draining); err != nil {
		t.Fatal(err)
	}
	aDown.Store(true)
	next := State{Generation: 4, Active: "b", Phase: PhaseServing}
	if err := s.Save(ctx, next); err != nil {
		t.Fatalf("the new active cluster took the state, but Save failed: %v", err)
	}
	if got, _, err := s.LoadFrom(ctx, "a"); err != nil || got.Generation != 3 {
		t.Fatalf("a, refusing produces, holds %s (%v)", got, err)
	}
	aDown.Store(false)
	testwait.Eventually(t, 60*time.Second, "a to hold generation 4 with b active", func() error {
		st, found, err := s.LoadFrom(ctx, "a")
		if err != nil {
			return err
		}
		if !found || st.Generation != 4 || st.Active != "b" {
			return fmt.Errorf("a holds %s (found %v)", st, found)
		}
		return nil
	})

	// A cluster that comes to hold a newer generation than the one it
	// missed (another member's later save) is left as it is. (A save
	// while a cluster already holds a newer generation is refused
	// outright: TestKafkaStoreNeverReplacesNewer.)
	other, err := NewKafkaStore("vc", map[string][]string{"a": addrs["a"]}, StoreLogger(zaptest.NewLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	refuseGen6.Store(true)
	if err := s.Save(ctx, State{Generation: 6, Active: "b", Phase: PhaseServing}); err != nil {
		t.Fatal(err)
	}
	if err := other.Save(ctx, State{Generation: 7, Active: "a", Phase: PhaseServing}); err != nil {
		t.Fatal(err)
	}
	refuseGen6.Store(false)
	testwait.Until(t, 10*time.Second, "the background write to a reported no longer needed", func() bool {
		return logs.FilterMessageSnippet("no longer needed").FilterField(zap.String("cluster", "a")).Len() > 0
	})
	if got, _, err := other.LoadFrom(ctx, "a"); err != nil || got.Generation != 7 {
		t.Fatalf("a holds %s (%v), want generation 7", got, err)
	}
}

// TestKafkaStoreSaveReadsEachClusterTwice: a save reads every cluster
// twice, no more: once for its check, before anything is written, and once
// in the write's transaction, where what the cluster holds cannot change
// before the write commits (writeIf).
func TestKafkaStoreSaveReadsEachClusterTwice(t *testing.T) {
	addrs := map[string][]string{}
	reads := map[string]*atomic.Int32{}
	for _, name := range []string{"a", "b"} {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		n := new(atomic.Int32)
		c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			n.Add(1) // one a read (readOnce: the topic holds two small records)
			return nil, nil, false
		})
		addrs[name], reads[name] = c.ListenAddrs(), n
	}
	s, err := NewKafkaStore("vc", addrs, StoreLogger(zaptest.NewLogger(t)), StoreTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The first save creates the topics: nothing to read before it.
	if err := s.Save(ctx, State{Generation: 1, Active: "a", Phase: PhaseServing}); err != nil {
		t.Fatal(err)
	}
	for _, n := range reads {
		n.Store(0)
	}
	if err := s.Save(ctx, State{Generation: 2, Active: "a", Phase: PhaseServing}); err != nil {
		t.Fatal(err)
	}
	for name, n := range reads {
		if got := n.Load(); got != 2 {
			t.Errorf("the save read cluster %s %d times, want twice", name, got)
		}
	}
	for _, name := range []string{"a", "b"} {
		if got, found, err := s.LoadFrom(ctx, name); err != nil || !found || got.Generation != 2 || got.Active != "a" {
			t.Errorf("cluster %s holds %s (found %v, %v), want generation 2 active on a", name, got, found, err)
		}
	}
}

// producesGeneration reports whether a produce request writes a routing
// state of generation gen.
func producesGeneration(t *testing.T, req kmsg.Request, gen uint32) bool {
	want := []byte(fmt.Sprintf(`"generation":%d,`, gen))
	for _, tp := range req.(*kmsg.ProduceRequest).Topics {
		for _, p := range tp.Partitions {
			var b kmsg.RecordBatch
			if err := b.ReadFrom(p.Records); err != nil {
				t.Errorf("decoding a produced batch: %v", err)
				return false
			}
			recs := b.Records
			if codec := kgo.CompressionCodecType(b.Attributes & 0x07); codec != kgo.CodecNone {
				var err error
				if recs, err = kgo.DefaultDecompressor().Decompress(recs, codec); err != nil {
					t.Errorf("decompressing a produced batch: %v", err)
					return false
				}
			}
			if bytes.Contains(recs, want) {
				return true
			}
		}
	}
	return false
}

// TestKafkaStoreWarmOfDeadClusterHoldsNoSave: a warm of a cluster that
// accepts connections and answers nothing (a frozen host) holds a save's
// write there no longer than the write's own time, so the save lands on
// the active cluster as it did without the warm, and Close ends the warm.
func TestKafkaStoreWarmOfDeadClusterHoldsNoSave(t *testing.T) {
	a, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	frozen, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{})
	defer func() {
		frozen.Close()
		<-accepted
	}()
	go func() {
		defer close(accepted)
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := frozen.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	}()
	s, err := NewKafkaStore("vc", map[string][]string{"a": a.ListenAddrs(), "b": {frozen.Addr().String()}},
		StoreLogger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))), StoreTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.Warm(ctx, "a")
	s.Warm(ctx, "b") // stuck until ctx's end, a minute
	start := time.Now()
	if err := s.Save(ctx, State{Generation: 1, Active: "a", Phase: PhaseServing}); err != nil {
		t.Fatalf("save with b frozen: %v", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("the save took %v: it waited for b's warm", took)
	}
	if got, found, err := s.LoadFrom(ctx, "a"); err != nil || !found || got.Generation != 1 {
		t.Fatalf("a holds %s (found %v, %v), want generation 1", got, found, err)
	}
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for b's warm")
	}
}

// TestKafkaStoreRetire: a retired cluster is neither read nor written; the
// last cluster cannot be retired.
func TestKafkaStoreRetire(t *testing.T) {
	x, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	y, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	s, err := NewKafkaStore("vc", map[string][]string{"x": x.ListenAddrs(), "y": y.ListenAddrs()}, StoreLogger(zaptest.NewLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := State{Generation: 1, Active: "x", Phase: PhaseServing}
	if err := s.Save(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := s.Retire("y"); err != nil {
		t.Fatal(err)
	}
	if got := s.Clusters(); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("clusters %v after retiring y", got)
	}
	if err := s.Save(ctx, State{Generation: 2, Active: "y", Phase: PhaseServing}); err == nil {
		t.Fatal("saved a state making the retired cluster active")
	}
	second := State{Generation: 2, Active: "x", Phase: PhaseServing}
	if err := s.Save(ctx, second); err != nil {
		t.Fatal(err)
	}
	if got, found, err := s.Load(ctx); err != nil || !found || !reflect.DeepEqual(got, second) {
		t.Fatalf("Load = %v, %v, %v; want %v", got, found, err, second)
	}
	if _, _, err := s.LoadFrom(ctx, "y"); err == nil {
		t.Fatal("read the retired cluster")
	}
	// What y held is left there, as it was.
	other, err := NewKafkaStore("vc", map[string][]string{"y": y.ListenAddrs()}, StoreLogger(zaptest.NewLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if got, found, err := other.Load(ctx); err != nil || !found || got.Generation != 1 {
		t.Fatalf("y holds %v, %v, %v; want generation 1, written before the retire", got, found, err)
	}
	if err := s.Retire("x"); err == nil {
		t.Fatal("retired the last cluster")
	}
}
