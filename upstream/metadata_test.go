package upstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// TestAskMetadataFallsBack: AskMetadata asks one broker directly and keeps
// asking the one that answered; when that broker fails (its connection
// closed), the answer comes from the next broker, complete, and
// the next request goes to another broker.
func TestAskMetadataFallsBack(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(4, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := startedCluster(ctx, t, kf)
	ask := func() *kmsg.MetadataResponse {
		t.Helper()
		resp, err := u.AskMetadata(ctx, kmsg.NewPtrMetadataRequest())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 4 || len(resp.Brokers) != 3 {
			t.Fatalf("answer: %d topics, %d brokers", len(resp.Topics), len(resp.Brokers))
		}
		return resp
	}
	ask()
	first := int32(u.metaBroker.Load()) - 1
	if first < 0 {
		t.Fatal("no broker kept after an answer")
	}
	// The kept broker fails every Metadata request from now on.
	var failed atomic.Int32
	kf.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if kf.CurrentNode() == first {
			failed.Add(1)
			return nil, errors.New("down"), true
		}
		return nil, nil, false
	})
	ask()
	if failed.Load() == 0 {
		t.Fatal("the kept broker was not asked first")
	}
	if b := int32(u.metaBroker.Load()) - 1; b == first || b < 0 {
		t.Fatal("the broker that failed is still the one asked first")
	}
	before := failed.Load()
	for range 5 {
		ask()
	}
	if failed.Load() != before {
		t.Fatalf("the failed broker was asked again %d times", failed.Load()-before)
	}
}

// TestAskMetadataSince: an answer with the bytes of the one passed is not
// decoded (nil, and the same body back); any other is decoded, with its
// body to pass next time. Asked of a broker directly, not through the
// client, whose answers carry no body.
func TestAskMetadataSince(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	host, port, err := net.SplitHostPort(kf.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	var epoch atomic.Int32
	kf.ControlKey(int16(kmsg.Metadata), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		resp := kr.ResponseKind().(*kmsg.MetadataResponse)
		resp.Brokers = []kmsg.MetadataResponseBroker{{NodeID: 0, Host: host, Port: int32(p)}}
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic = kmsg.StringPtr("orders")
		rt.Partitions = []kmsg.MetadataResponseTopicPartition{{Partition: 0, Leader: 0, LeaderEpoch: epoch.Load()}}
		resp.Topics = []kmsg.MetadataResponseTopic{rt}
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := startedCluster(ctx, t, kf)
	if len(u.BrokerIDs()) == 0 {
		t.Fatal("no broker known after the start")
	}
	ask := func(since MetadataBody) (*kmsg.MetadataResponse, MetadataBody) {
		t.Helper()
		resp, body, err := u.AskMetadataSince(ctx, kmsg.NewPtrMetadataRequest(), since)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	resp, first := ask(MetadataBody{})
	if resp == nil || len(first.Bytes) == 0 || first.Version < 1 {
		t.Fatalf("first answer: %v, body of %d bytes at v%d", resp, len(first.Bytes), first.Version)
	}
	if got := resp.Topics[0].Partitions[0].LeaderEpoch; got != 0 {
		t.Fatalf("leader epoch %d, want 0", got)
	}
	resp, again := ask(first)
	if resp != nil || !bytes.Equal(again.Bytes, first.Bytes) || again.Version != first.Version {
		t.Fatalf("the same bytes: answer %v, body of %d bytes at v%d", resp, len(again.Bytes), again.Version)
	}
	epoch.Store(1)
	resp, changed := ask(first)
	if resp == nil || bytes.Equal(changed.Bytes, first.Bytes) {
		t.Fatal("a changed answer was taken for the one before")
	}
	if got := resp.Topics[0].Partitions[0].LeaderEpoch; got != 1 {
		t.Fatalf("leader epoch %d, want 1", got)
	}
	// The same bytes at another version are another answer.
	older := changed
	older.Version--
	if resp, _ := ask(older); resp == nil || resp.Topics[0].Partitions[0].LeaderEpoch != 1 {
		t.Fatalf("an answer at another version: %v", resp)
	}
}

// TestMetadataControllerAt: the controller ID is found where kmsg encodes
// it at every version that has one, whatever the brokers and cluster ID
// before it; an answer differing from another only there is the same, and
// one differing anywhere else, or of another length or version, is not.
func TestMetadataControllerAt(t *testing.T) {
	build := func(v int16, controller, leader int32) []byte {
		r := kmsg.NewPtrMetadataResponse()
		r.Version = v
		r.ThrottleMillis = 3
		r.ClusterID = kmsg.StringPtr("cluster-ü")
		r.Brokers = []kmsg.MetadataResponseBroker{
			{NodeID: 1, Host: "broker-1.example", Port: 9092, Rack: kmsg.StringPtr("rack-a")},
			{NodeID: 2, Host: "b2", Port: 9093},
		}
		r.Brokers[1].UnknownTags.Set(7, []byte("tag")) // a broker's tagged field (v9+)
		r.ControllerID = controller
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic = kmsg.StringPtr("orders")
		rt.Partitions = []kmsg.MetadataResponseTopicPartition{{Partition: 0, Leader: leader, Replicas: []int32{1, 2}, ISR: []int32{1}}}
		r.Topics = []kmsg.MetadataResponseTopic{rt}
		return r.AppendTo(nil)
	}
	if _, ok := metadataControllerAt(build(0, 1, 0), 0); ok {
		t.Error("v0 has no controller ID, one was found")
	}
	for v := int16(1); v <= kmsg.NewPtrMetadataResponse().MaxVersion(); v++ {
		a, b := build(v, 1, 1), build(v, 0x0a0b0c0d, 1)
		at, ok := metadataControllerAt(a, v)
		if !ok {
			t.Fatalf("v%d: no controller ID found", v)
		}
		if got := binary.BigEndian.Uint32(b[at:]); got != 0x0a0b0c0d {
			t.Fatalf("v%d: %#x at %d, want the controller ID", v, got, at)
		}
		if !sameMetadataBody(MetadataBody{Version: v, Bytes: a}, v, b, at) {
			t.Errorf("v%d: answers differing only in the controller ID are not the same", v)
		}
		if sameMetadataBody(MetadataBody{Version: v, Bytes: a}, v, build(v, 1, 2), at) {
			t.Errorf("v%d: a moved leader is the same answer", v)
		}
		if sameMetadataBody(MetadataBody{Version: v - 1, Bytes: a}, v, a, at) {
			t.Errorf("v%d: the same bytes at another version are the same answer", v)
		}
		if sameMetadataBody(MetadataBody{Version: v, Bytes: a}, v, append(bytes.Clone(a), 0), at) {
			t.Errorf("v%d: a longer answer is the same", v)
		}
		if _, ok := metadataControllerAt(a[:at+3], v); ok {
			t.Errorf("v%d: a controller ID found in an answer cut inside it", v)
		}
	}
}

// startedCluster is a Cluster of kf, started, closed when the test ends.
func startedCluster(ctx context.Context, t *testing.T, kf *kfake.Cluster) *Cluster {
	t.Helper()
	u, err := New(Options{ClusterID: "c", Log: zap.NewNop(), DialTimeout: 5 * time.Second}, Config{Name: "x", Bootstrap: kf.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Close)
	if err := u.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return u
}
