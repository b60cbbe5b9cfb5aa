package mirror

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestMirrorUncleanElection: a real unclean leader election on a 3-node
// source. The partition lives on nodes 1 and 2; node 2 is stopped, records
// go to node 1 alone (min.insync.replicas=1) and are mirrored; node 1 is
// killed, node 2 comes back and is elected leader uncleanly (ElectLeaders,
// unclean), so the source's log is cut below what the standby holds, and
// then grows past it again with other records. The writer halts the
// partition with ErrSourceTruncated from the source's leader-epoch history,
// the halt is in the metrics, and the standby does not move.
func TestMirrorUncleanElection(t *testing.T) {
	_, s := clusters(t)
	src := kafkatest.Start(t, 3, kafkatest.WithName("mirror-unclean"),
		kafkatest.WithBrokerConfig("broker.session.timeout.ms", "3000"),
		kafkatest.WithBrokerConfig("broker.heartbeat.interval.ms", "500"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const topic = "unclean"
	cl := newClient(t, src, manualPartitioner(), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DisableIdempotentWrite())
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 30000
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic = topic
	ct.NumPartitions, ct.ReplicationFactor = -1, -1
	ra := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
	ra.Partition, ra.Replicas = 0, []int32{1, 2}
	ct.ReplicaAssignment = append(ct.ReplicaAssignment, ra)
	for k, v := range map[string]string{"unclean.leader.election.enable": "true", "min.insync.replicas": "1"} {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = k, kmsg.StringPtr(v)
		ct.Configs = append(ct.Configs, c)
	}
	req.Topics = append(req.Topics, ct)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("creating %s: %v", topic, err)
	}
	testwait.Eventually(t, 30*time.Second, "producing to the new topic", func() error {
		return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("first")}).FirstErr()
	})
	produceN(t, cl, topic, 0, 49, 7, "both")

	reg := prometheus.NewRegistry()
	m, err := New(Source(src.Bootstrap()), Target(s.Bootstrap()), Topics([]string{topic}, nil),
		SyncInterval(500*time.Millisecond), FetchMaxWait(100*time.Millisecond), SyncGroups(false), SyncACLs(false),
		Registerer(reg), Logger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(context.Background()) }()
	t.Cleanup(func() { m.Close(); <-done })
	waitCaughtUp(t, m, topic)

	// The follower goes; records reach the leader alone, and the mirror.
	if err := src.Stop(2); err != nil {
		t.Fatal(err)
	}
	produceN(t, cl, topic, 0, 50, 10, "leader-only")
	waitCaughtUp(t, m, topic)
	_, mirrored := offsetsOf(t, s, topic, 0)
	if mirrored != 100 {
		t.Fatalf("standby ends at %d, want 100", mirrored)
	}

	// The leader dies; the stale follower comes back and is elected.
	if err := src.Kill(1); err != nil {
		t.Fatal(err)
	}
	if err := src.Restart(2); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	testwait.Eventually(t, time.Minute, "unclean election of node 2", func() error {
		res, err := adm.ElectLeaders(ctx, kadm.ElectLiveReplica, kadm.TopicsSet{topic: {0: {}}})
		if err != nil {
			return err
		}
		if r := res[topic][0]; r.Err != nil && !errors.Is(r.Err, kerr.ElectionNotNeeded) {
			return fmt.Errorf("%v %s", r.Err, r.ErrMessage)
		}
		md, err := adm.Metadata(ctx, topic)
		if err != nil {
			return err
		}
		if l := md.Topics[topic].Partitions[0].Leader; l != 2 {
			return fmt.Errorf("leader is %d", l)
		}
		return nil
	})
	// The source grows past the mirrored end again, with other records.
	produceN(t, cl, topic, 0, 70, 10, "after-election")

	testwait.Eventually(t, time.Minute, "partition halted as truncated", func() error {
		st := m.Status()
		if len(st) != 1 || st[0].State != StateHalted {
			return fmt.Errorf("%+v", st)
		}
		if !errors.Is(st[0].Err, ErrSourceTruncated) {
			t.Fatalf("halted with %v, want ErrSourceTruncated", st[0].Err)
		}
		return nil
	})
	t.Logf("halt: %v", m.Status()[0].Err)
	if msg := m.Status()[0].Err.Error(); !strings.Contains(msg, "epoch") {
		t.Errorf("halt error does not name the leader epoch: %s", msg)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "ferry_mirror_partition_halted" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == "source_truncated" && mt.GetGauge().GetValue() == 1 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Error("no ferry_mirror_partition_halted{reason=\"source_truncated\"} = 1")
	}
	if err := m.WaitCaughtUp(ctx, topic); err == nil {
		t.Fatal("WaitCaughtUp succeeded on a halted partition")
	}
	if _, end := offsetsOf(t, s, topic, 0); end != mirrored {
		t.Fatalf("the standby moved from %d to %d after the halt", mirrored, end)
	}
}
