package upstream

import (
	"context"
	"errors"
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
	u, err := New(Options{ClusterID: "c", Log: zap.NewNop(), DialTimeout: 5 * time.Second}, Config{Name: "x", Bootstrap: kf.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := u.Start(ctx); err != nil {
		t.Fatal(err)
	}
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
