package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

// TestSwitchThreeBrokerClusters: Ferry in front of two three-broker
// clusters (replication factor 3, min.insync.replicas 2), partition
// leadership spread unevenly (one broker leads four of six partitions), an
// idempotent producer and a consumer group running through Ferry the whole
// time. In turn:
//
//  1. Leadership moves on the standby while it is mirrored to (every
//     partition's replicas reordered by a reassignment, then a preferred
//     election): the writers follow the leaders, and the mirror keeps up.
//  2. A planned switch while the broker leading most partitions of the
//     active cluster is being shut down (a rolling restart's step): it
//     switches, and the producer and the group carry on on the new active
//     cluster.
//  3. A planned switch back while a partition of the switch's target has
//     no leader (its one replica's broker down): refused after its timeout,
//     rolled back, the partition named with the reason; the writes it held
//     go on to the cluster still active. With the broker back, the same
//     switch succeeds.
//
// At the end every acknowledged record is, once, at its acknowledged offset
// on both clusters, no produce failed, and the group saw every record.
func TestSwitchThreeBrokerClusters(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka")
	}
	primary, standby := startThreeBrokerPair(t)
	yaml := fmt.Sprintf(`
cluster_id: ferry-three-brokers
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - {name: primary, bootstrap: [%s]}
  - {name: standby, bootstrap: [%s]}
mirror: {sync_interval: 1s}
`, primary.Bootstrap(), standby.Bootstrap())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	ids := primary.NodeIDs()
	busy, second, third := ids[0], ids[1], ids[2]
	const topic, parts, group = "three", 6, "three-group"
	// Uneven leadership: busy leads partitions 0-3.
	assign := [][]int32{{busy, second, third}, {busy, third, second}, {busy, second, third}, {busy, third, second}, {second, third, busy}, {third, busy, second}}
	createAssigned(t, ctx, primary.Addrs(), topic, assign, map[string]*string{"min.insync.replicas": kmsg.StringPtr("2")})
	// One partition with a single replica, on third: offline while third
	// is down (step 3).
	const single = "three-single"
	createAssigned(t, ctx, primary.Addrs(), single, [][]int32{{third}}, nil)
	seed := newClient(t, kgo.SeedBrokers(primary.Addrs()...), kgo.DefaultProduceTopic(single))
	if err := seed.ProduceSync(ctx, &kgo.Record{Value: []byte("single")}).FirstErr(); err != nil {
		t.Fatalf("producing to %s: %v", single, err)
	}

	n, addr := startNode(t, yaml)
	tr := startTraffic(t, addr, topic, parts, group)
	tr.waitMore(300, 2*time.Minute)

	// 1. Leadership moves on the standby while mirroring.
	if err := n.mirror.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatal(err)
	}
	before := leadersOf(t, ctx, standby.Addrs(), topic)
	sadm := kadm.NewClient(newClient(t, kgo.SeedBrokers(standby.Addrs()...)))
	sids := standby.NodeIDs()
	want := map[int32]int32{}
	var req kadm.AlterPartitionAssignmentsReq
	for p := range int32(parts) {
		// Each partition's preferred leader becomes the broker after its
		// leader now.
		i := slices.Index(sids, before[p])
		rs := []int32{sids[(i+1)%3], sids[(i+2)%3], sids[i]}
		want[p] = rs[0]
		req.Assign(topic, p, rs)
	}
	resps, err := sadm.AlterPartitionAssignments(ctx, req)
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		t.Fatalf("reassigning %s on the standby: %v", topic, err)
	}
	testwait.Eventually(t, time.Minute, "every partition of "+topic+" led by its new preferred replica on the standby", func() error {
		var set kadm.TopicsSet
		for p := range want {
			set.Add(topic, p)
		}
		res, err := sadm.ElectLeaders(ctx, kadm.ElectPreferredReplica, set)
		if err != nil {
			return err
		}
		now := leadersOf(t, ctx, standby.Addrs(), topic)
		for p, l := range want {
			if now[p] != l {
				md := metadataOf(t, ctx, standby.Addrs(), topic)
				return fmt.Errorf("partition %d led by %d, want %d (was %d); election %+v; metadata %+v", p, now[p], l, before[p], res[topic][p], md[p])
			}
		}
		return nil
	})
	tr.waitMore(300, 2*time.Minute)
	waitReached(t, topic, primary.Addrs(), standby.Addrs())
	t.Logf("standby leaders moved %v → %v; the mirror followed", before, leadersOf(t, ctx, standby.Addrs(), topic))

	// 2. A planned switch while the busiest broker of the active cluster
	// shuts down (its leaderships moving to the others).
	stopped := make(chan error, 1)
	go func() { stopped <- primary.Stop(busy) }()
	time.Sleep(300 * time.Millisecond) // the controlled shutdown under way
	start := time.Now()
	st, err := n.switchover(ctx, routing.Request{To: "standby", Timeout: 2 * time.Minute})
	if err != nil || st.Generation != 1 || st.Active != "standby" {
		t.Fatalf("switch to the standby while broker %d of the primary shuts down: %+v, %v", busy, st, err)
	}
	t.Logf("switched to the standby in %v while broker %d of the primary shut down (steps %v)", time.Since(start), busy, st.Last.Steps)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	tr.waitMore(300, 2*time.Minute)
	if err := primary.Restart(busy); err != nil {
		t.Fatal(err)
	}

	// 3. The switch back while the primary's single-replica partition has
	// no leader: refused, rolled back, the partition named.
	if err := n.mirror.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if err := primary.Stop(third); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, time.Minute, single+" without a leader on the primary", func() error {
		if l := leadersOf(t, ctx, []string{primary.Addr(busy)}, single)[0]; l >= 0 {
			return fmt.Errorf("led by %d", l)
		}
		return nil
	})
	_, err = n.switchover(ctx, routing.Request{To: "primary", Timeout: 5 * time.Second})
	var se *routing.Error
	if !errors.As(err, &se) || se.Reason != routing.ReasonDrainTimeout || !slices.ContainsFunc(se.Partitions, func(s string) bool {
		return strings.HasPrefix(s, single+"[0]: the standby does not give its end")
	}) {
		t.Fatalf("switch to the primary with %s[0] offline there: %v (%+v); want a drain timeout naming %s[0] and why", single, err, se, single)
	}
	t.Logf("refused as expected: %v", err)
	if st := n.routes.Current(); st.Generation != 1 || st.Active != "standby" || st.Phase != routing.PhaseServing || st.Last == nil || !strings.HasPrefix(st.Last.Outcome, "rolled back") {
		t.Fatalf("state after the refused switch: %+v, last %+v", st, st.Last)
	}
	tr.waitMore(300, 2*time.Minute) // the held writes went on to the standby
	if err := primary.Restart(third); err != nil {
		t.Fatal(err)
	}
	st, err = n.switchover(ctx, routing.Request{To: "primary", Timeout: 2 * time.Minute})
	if err != nil || st.Generation != 2 || st.Active != "primary" {
		t.Fatalf("switch to the primary with broker %d back: %+v, %v", third, st, err)
	}
	tr.waitMore(300, 2*time.Minute)

	tr.stopProducing()
	tr.waitConsumed(2 * time.Minute)
	tr.stop()
	total := tr.verifyOn(ctx, primary.Addrs())
	t.Logf("%d records acknowledged and consumed; %d re-read", total, tr.rereads())
	// And mirrored, at the same offsets, to the standby.
	waitReached(t, topic, primary.Addrs(), standby.Addrs())
	tr.verifyOn(ctx, standby.Addrs())
}

// startThreeBrokerPair starts a primary and a standby of three brokers
// each, side by side.
func startThreeBrokerPair(t *testing.T) (primary, standby *kafkatest.Cluster) {
	t.Helper()
	var wg sync.WaitGroup
	var errP, errS error
	wg.Go(func() { primary, errP = kafkatest.New(kafkatest.Config{Brokers: 3, Name: "primary3"}) })
	wg.Go(func() { standby, errS = kafkatest.New(kafkatest.Config{Brokers: 3, Name: "standby3"}) })
	wg.Wait()
	for _, c := range []*kafkatest.Cluster{primary, standby} {
		if c != nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	if errP != nil || errS != nil {
		t.Fatalf("starting two 3-broker clusters: primary: %v; standby: %v", errP, errS)
	}
	return primary, standby
}

// createAssigned creates topic on the cluster at addrs with the replicas of
// each partition given (the first, the preferred leader).
func createAssigned(t *testing.T, ctx context.Context, addrs []string, topic string, assign [][]int32, configs map[string]*string) {
	t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 30000
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, -1, -1
	for p, rs := range assign {
		a := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
		a.Partition, a.Replicas = int32(p), rs
		rt.ReplicaAssignment = append(rt.ReplicaAssignment, a)
	}
	for _, k := range slices.Sorted(maps.Keys(configs)) {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = k, configs[k]
		rt.Configs = append(rt.Configs, c)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, newClient(t, kgo.SeedBrokers(addrs...)))
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("creating %s with replicas %v: %v", topic, assign, err)
	}
	testwait.Eventually(t, 30*time.Second, topic+" led on every partition", func() error {
		ls := leadersOf(t, ctx, addrs, topic)
		for p := range assign {
			if l, ok := ls[int32(p)]; !ok || l < 0 {
				return fmt.Errorf("partition %d has no leader yet", p)
			}
		}
		return nil
	})
}

// metadataOf is topic's partitions in a fresh Metadata answer of the
// cluster at addrs.
func metadataOf(t *testing.T, ctx context.Context, addrs []string, topic string) []kmsg.MetadataResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close() // called in loops: not kept until the test ends
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	if len(resp.Topics) != 1 {
		t.Fatalf("metadata of %s: %d topics", topic, len(resp.Topics))
	}
	return resp.Topics[0].Partitions
}

// leadersOf is each partition's leader (-1: none).
func leadersOf(t *testing.T, ctx context.Context, addrs []string, topic string) map[int32]int32 {
	t.Helper()
	out := map[int32]int32{}
	for _, p := range metadataOf(t, ctx, addrs, topic) {
		out[p.Partition] = p.Leader
	}
	return out
}

// waitReached waits until the standby's end of every partition of topic
// is at least where the primary's was when first read. Just after a leader
// moved, its high watermark may not be known yet (OFFSET_NOT_AVAILABLE):
// read again.
func waitReached(t *testing.T, topic string, src, dst []string) {
	t.Helper()
	var want map[int32]int64
	testwait.Eventually(t, time.Minute, "the standby reaching the primary's ends of "+topic, func() error {
		var err error
		if want == nil {
			if want, err = tryEndOffsets(t, src, topic); err != nil {
				want = nil
				return fmt.Errorf("primary: %w", err)
			}
		}
		got, err := tryEndOffsets(t, dst, topic)
		if err != nil {
			return fmt.Errorf("standby: %w", err)
		}
		for p, o := range want {
			if got[p] < o {
				return fmt.Errorf("partition %d: standby %d, primary %d", p, got[p], o)
			}
		}
		return nil
	})
}

// tryEndOffsets is endOffsets, returning its error.
func tryEndOffsets(t *testing.T, addrs []string, topic string) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	return benchutil.EndOffsets(ctx, kadm.NewClient(cl), topic)
}
