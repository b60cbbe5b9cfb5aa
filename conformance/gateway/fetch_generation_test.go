package gateway

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// TestConsumeStreamedAtGenerations consumes a few megabytes from real
// Kafka through Ferry as it runs before any switch (generation 0) and
// after three (generation 3), from a cluster marked as a mirror target
// (its batches checked for fillers): every record at its partition and
// offset with its value, the leader epochs of the generation, and the
// answers streamed in both.
func TestConsumeStreamedAtGenerations(t *testing.T) {
	c := cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	const topic = "fetch-generations"
	createTopic(t, kadm.NewClient(client(t, c.Bootstrap())), topic, 3, nil)
	prod := client(t, c.Bootstrap(), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerBatchMaxBytes(512<<10))
	const n = 1200 // 4 KiB each: 4.8 MB
	want := map[string]*kgo.Record{}
	for i := range n {
		v := bytes.Repeat([]byte(fmt.Sprintf("%06d", i)), 4<<10/6)
		r := &kgo.Record{Key: []byte(fmt.Sprintf("k-%d", i)), Value: v}
		prod.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Errorf("produce: %v", err)
			}
		})
		want[string(r.Key)] = r
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	for _, gen := range []uint32{0, 3} {
		t.Run(fmt.Sprint("generation-", gen), func(t *testing.T) {
			f := ferrytest.Start(t, c.Bootstrap(),
				proxy.WithClusters(upstream.Config{Name: "primary", Bootstrap: c.Addrs(), MirrorTarget: true}),
				proxy.WithRoutingTable(routing.NewTable(routing.State{Generation: gen, Active: "primary"})))
			cons := client(t, f.Addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(2<<20))
			seen := 0
			for seen < n {
				fs := cons.PollFetches(ctx)
				if ctx.Err() != nil {
					t.Fatalf("consumed %d of %d records", seen, n)
				}
				fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
				fs.EachRecord(func(r *kgo.Record) {
					w := want[string(r.Key)]
					switch {
					case w == nil:
						t.Fatalf("consumed %q, never produced", r.Key)
					case r.Partition != w.Partition || r.Offset != w.Offset || !bytes.Equal(r.Value, w.Value):
						t.Fatalf("record %s: produced at %d/%d, consumed at %d/%d (value equal %v)", r.Key, w.Partition, w.Offset, r.Partition, r.Offset, bytes.Equal(r.Value, w.Value))
					case routing.EpochGeneration(r.LeaderEpoch) != gen:
						t.Fatalf("record %s: leader epoch %d not of generation %d", r.Key, r.LeaderEpoch, gen)
					}
					seen++
				})
			}
			if streamed := counter(t, f.Registry, "ferry_fetch_streamed_total"); streamed == 0 {
				t.Fatal("no answer was streamed")
			}
		})
	}
}

// counter reads a counter from reg by name.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}
