package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestFailoverProbeAsksNoTopic: automatic failover's probe, twice a second
// on each cluster, asks for the brokers and no topic: a request listing no
// topics would be answered with every partition of the cluster.
func TestFailoverProbeAsksNoTopic(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(50, "orders", "payments"))
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	var asked, every atomic.Int32
	kf.ControlKey(kmsg.Metadata.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		asked.Add(1)
		if req := kr.(*kmsg.MetadataRequest); req.Topics == nil {
			every.Add(1)
		}
		return nil, nil, false
	})
	fr := &failoverRole{probers: map[string]*kgo.Client{}}
	defer fr.close()
	r := &mirrorRunner{clusters: map[string][]string{"a": kf.ListenAddrs()}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 3 {
		if err := fr.probe(ctx, r, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if asked.Load() < 3 {
		t.Fatalf("%d Metadata requests seen for 3 probes", asked.Load())
	}
	if n := every.Load(); n != 0 {
		t.Fatalf("%d of %d Metadata requests asked for every topic", n, asked.Load())
	}
}
