package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/upstream"
)

// TestClientClosedWhileRequestWaitsUpstream: a client that closes its
// connection while its JoinGroup is parked upstream (a rebalance) is
// logged and counted as the client's close, not as an upstream failure or
// a failed request.
func TestClientClosedWhileRequestWaitsUpstream(t *testing.T) {
	kf := newKfake(t, 1)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	kf.ControlKey(int16(kmsg.JoinGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		select {
		case entered <- struct{}{}:
		default:
		}
		kf.SleepControl(func() { <-release }) // parked, as in a rebalance
		return nil, nil, false
	})
	core, logs := observer.New(zap.DebugLevel)
	s, addr := startFerry(t, kf.ListenAddrs(), WithLogger(zap.New(core)))
	t.Cleanup(func() { close(release) })

	conn := dialRaw(t, addr)
	join := kmsg.NewPtrJoinGroupRequest()
	join.Version = 9
	join.Group, join.SessionTimeoutMillis, join.RebalanceTimeoutMillis, join.ProtocolType = "g", 30000, 30000, "consumer"
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{}}}
	writeReq(t, conn, join, 1)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the JoinGroup never reached the broker")
	}
	conn.Close()

	km := &s.metrics.byKey[kmsg.JoinGroup]
	if got := waitCounter(t, km.abandoned, 1, 10*time.Second, "ferry_requests_abandoned_total{api=JoinGroup}"); got != 1 {
		t.Fatalf("ferry_requests_abandoned_total{api=JoinGroup} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(km.errors); got != 0 {
		t.Errorf("ferry_request_failures_total{api=JoinGroup} = %v, want 0: the client closed, nothing failed", got)
	}
	if got := testutil.ToFloat64(km.upFailed); got != 0 {
		t.Errorf("ferry_upstream_failures_total{api=JoinGroup} = %v, want 0: the broker did nothing wrong", got)
	}
	if got := waitCounter(t, s.connMetrics.closes("client_closed"), 1, 10*time.Second, `ferry_client_connections_closed_total{reason="client_closed"}`); got != 1 {
		t.Errorf(`ferry_client_connections_closed_total{reason="client_closed"} = %v, want 1 (other: %v)`, got, testutil.ToFloat64(s.connMetrics.closes("other")))
	}
	var closed []observer.LoggedEntry
	testwait.Until(t, 10*time.Second, `"client connection closed" logged`, func() bool {
		closed = logs.FilterMessage("client connection closed").All()
		return len(closed) > 0
	})
	if len(closed) != 1 || !strings.Contains(toString(closed[0].ContextMap()["error"]), upstream.ErrClientClosed.Error()) {
		t.Errorf("client close logged as %+v; want one entry saying %q", closed, upstream.ErrClientClosed)
	}
	for _, e := range logs.All() {
		if strings.Contains(e.Message+" "+toString(e.ContextMap()["error"]), upstream.ErrClosed.Error()) {
			t.Errorf("logged an upstream failure for the client's close: %s %v", e.Message, e.ContextMap())
		}
	}
}

func toString(v any) string {
	s, _ := v.(string)
	return s
}

// TestClientClosedWhileFetchLongPolls: a consumer that closes its
// connection while its Fetch waits upstream for records (the usual way a
// consumer stops) is the client's close too, on every fetch path: one
// broker, read whole or streamed, and several brokers.
func TestClientClosedWhileFetchLongPolls(t *testing.T) {
	kf := newKfake(t, 2, kfake.SeedTopics(4, "quiet"))
	core, logs := observer.New(zap.DebugLevel)
	s, addr := startFerry(t, kf.ListenAddrs(), WithLogger(zap.New(core)))
	km := &s.metrics.byKey[kmsg.Fetch]
	for i, parts := range [][]int32{{0}, {0, 1, 2, 3}} {
		conn := dialRaw(t, addr)
		req := kmsg.NewPtrFetchRequest()
		req.Version, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 12, 5000, 1, 1<<20
		ft := kmsg.FetchRequestTopic{Topic: "quiet"}
		for _, p := range parts {
			ft.Partitions = append(ft.Partitions, kmsg.FetchRequestTopicPartition{Partition: p, CurrentLeaderEpoch: -1, LastFetchedEpoch: -1, LogStartOffset: -1, PartitionMaxBytes: 1 << 20})
		}
		req.Topics = []kmsg.FetchRequestTopic{ft}
		writeReq(t, conn, req, 1)
		time.Sleep(300 * time.Millisecond) // parked upstream
		conn.Close()
		if got := waitCounter(t, km.abandoned, float64(i+1), 10*time.Second, fmt.Sprintf("fetch of partitions %v: ferry_requests_abandoned_total{api=Fetch}", parts)); got != float64(i+1) {
			t.Fatalf("fetch of partitions %v: ferry_requests_abandoned_total{api=Fetch} = %v, want %d", parts, got, i+1)
		}
	}
	if got := testutil.ToFloat64(km.errors); got != 0 {
		t.Errorf("ferry_request_failures_total{api=Fetch} = %v, want 0", got)
	}
	if got := testutil.ToFloat64(km.requests); got != 0 {
		t.Errorf("ferry_requests_total{api=Fetch} = %v, want 0: nothing was answered", got)
	}
	if got := testutil.ToFloat64(km.upFailed); got != 0 {
		t.Errorf("ferry_upstream_failures_total{api=Fetch} = %v, want 0", got)
	}
	for _, e := range logs.All() {
		if e.Level > zap.DebugLevel {
			t.Errorf("logged above debug for a client's close: %s %v", e.Message, e.ContextMap())
		}
	}
}
