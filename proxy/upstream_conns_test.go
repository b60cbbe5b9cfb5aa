package proxy

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestManyClientsFewUpstreamConnections: 300 clients, each producing once,
// through a Ferry allowed 4 connections to its one broker: every record is
// acknowledged at its own offset, and once they are done the clients, still
// connected, hold no upstream connection, so a newcomer gets a producer ID
// and produces at once.
func TestManyClientsFewUpstreamConnections(t *testing.T) {
	c := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	s, addr := startFerry(t, c.ListenAddrs(), WithMaxConnsPerBroker(4))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 300
	var wg sync.WaitGroup
	offsets := make(chan int64, n)
	errs := make(chan error, n)
	for i := range n {
		cl := newClient(t, addr, kgo.DefaultProduceTopic("t"))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &kgo.Record{Value: fmt.Appendf(nil, "client-%d", i)}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				errs <- err
				return
			}
			offsets <- r.Offset
		}()
	}
	wg.Wait()
	close(errs)
	close(offsets)
	for err := range errs {
		t.Fatalf("a client's record failed: %v", err)
	}
	seen := map[int64]bool{}
	for o := range offsets {
		if seen[o] {
			t.Fatalf("two records acknowledged at offset %d", o)
		}
		seen[o] = true
	}
	if len(seen) != n {
		t.Fatalf("%d records acknowledged, want %d", len(seen), n)
	}
	inUse := s.metrics.upConns.WithLabelValues("a", "in_use")
	testwait.Eventually(t, 20*time.Second, fmt.Sprintf("no upstream connection checked out by %d quiet clients", n), func() error {
		if v := testutil.ToFloat64(inUse); v != 0 {
			return fmt.Errorf("%v upstream connections still checked out", v)
		}
		return nil
	})
	if open := testutil.ToFloat64(s.metrics.upConns.WithLabelValues("a", "idle")); open > 4 {
		t.Fatalf("%v idle upstream connections, want at most the 4 allowed", open)
	}
	late := newClient(t, addr, kgo.DefaultProduceTopic("t"))
	start := time.Now()
	if err := late.ProduceSync(ctx, &kgo.Record{Value: []byte("late")}).FirstErr(); err != nil {
		t.Fatalf("a new client among %d quiet ones: %v", n, err)
	}
	t.Logf("a new client produced in %v among %d connected clients", time.Since(start), n)
}

// TestPoolAtBoundAnswersRetriable: with the one allowed upstream
// connection held by a long-polling fetch, another client's produce waits
// for it briefly, then is answered NOT_LEADER_OR_FOLLOWER on a connection
// that stays open; once the fetch is answered, clients produce again.
func TestPoolAtBoundAnswersRetriable(t *testing.T) {
	c := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	s, addr := startFerry(t, c.ListenAddrs(), WithMaxConnsPerBroker(1), WithIdleConnsPerBroker(1))
	holder := dialRaw(t, addr)
	holder.SetDeadline(time.Now().Add(60 * time.Second))
	f := kmsg.NewPtrFetchRequest()
	f.Version = 11
	f.MaxWaitMillis = 8000
	f.MinBytes = 1
	f.MaxBytes = 1 << 20
	f.SessionEpoch = -1
	f.Topics = []kmsg.FetchRequestTopic{{Topic: "t", Partitions: []kmsg.FetchRequestTopicPartition{{Partition: 0, FetchOffset: 0, PartitionMaxBytes: 1 << 20, CurrentLeaderEpoch: -1, LogStartOffset: -1}}}}
	writeReq(t, holder, f, 1)
	// The fetch is upstream, parked.
	testwait.Eventually(t, 20*time.Second, "the fetch checking out the upstream connection", func() error {
		if inUse, idle := s.cluster("a").ReapIdle(time.Time{}); inUse != 1 {
			return fmt.Errorf("%d in use, %d idle", inUse, idle)
		}
		return nil
	})

	conn := dialRaw(t, addr)
	p := kmsg.NewPtrProduceRequest()
	p.Version = 9
	p.Acks = -1
	p.TimeoutMillis = 5000
	p.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0}}}}
	r := rawCall(t, conn, p, 1).(*kmsg.ProduceResponse)
	if got := r.Topics[0].Partitions[0].ErrorCode; got != kerr.NotLeaderForPartition.Code {
		t.Fatalf("produce with the pool held: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(got))
	}
	// The fetch answers (empty, after its wait); the connection is free.
	readResp(t, holder)
	av := kmsg.NewPtrApiVersionsRequest()
	av.Version = 3
	av.ClientSoftwareName, av.ClientSoftwareVersion = "raw", "1"
	if r := rawCall(t, conn, av, 2).(*kmsg.ApiVersionsResponse); r.ErrorCode != 0 {
		t.Fatalf("ApiVersions on the same connection: %v", kerr.ErrorForCode(r.ErrorCode))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr, kgo.DefaultProduceTopic("t"))
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("after")}).FirstErr(); err != nil {
		t.Fatalf("produce once the connection is free: %v", err)
	}
}
