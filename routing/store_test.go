package routing

import (
	"context"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"
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
