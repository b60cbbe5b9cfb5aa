package benchutil

import (
	"context"
	"maps"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestEndOffsets(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for _, p := range []int32{1, 1, 1} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := EndOffsets(ctx, kadm.NewClient(cl), "t")
	if want := map[int32]int64{0: 0, 1: 3}; err != nil || !maps.Equal(got, want) {
		t.Fatalf("EndOffsets = %v, %v; want %v", got, err, want)
	}
	if got, err := EndOffsets(ctx, kadm.NewClient(cl), "missing"); err == nil {
		t.Fatalf("EndOffsets of a missing topic = %v; want an error", got)
	}
}
