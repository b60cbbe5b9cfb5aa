package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
)

// TestLargeFetches has every client's consumer read megabytes through
// Ferry, with its default fetch sizes, so that the brokers' answers are
// large enough to be streamed to it with their record bytes spliced between
// sockets — a path the matrix's small topics never take — and checks every
// record at its offset, the committed offsets, and that bytes were spliced.
//
//	TestLargeFetches/<reader>
func TestLargeFetches(t *testing.T) {
	c := sharedCluster(t)
	cls := clients(t)
	adm := admin(t, c)
	f := ferrytest.Start(t, c.Bootstrap())
	via := viaTarget(t, f.Addr)
	topic := createTopic(t, adm, "large")

	// Written directly, uncompressed: 12 MB over the 3 partitions.
	const n, size = 3000, 4 << 10
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(c.Bootstrap(), ",")...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(3, 4))
	produced := make([]record, n)
	var mu sync.Mutex
	for i := range n {
		v := make([]byte, size)
		for j := range v {
			v[j] = 'a' + byte(rng.IntN(26))
		}
		r := &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: v,
			Headers:   []kgo.RecordHeader{{Key: "i", Value: []byte(fmt.Sprint(i))}},
			Timestamp: time.UnixMilli(1_700_000_000_000 + int64(i))}
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			if err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			produced[i] = record{Partition: r.Partition, Offset: r.Offset, Key: string(r.Key), Value: string(r.Value),
				Headers: map[string]string{"i": string(r.Headers[0].Value)}, Timestamp: r.Timestamp.UnixMilli()}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	for _, r := range readers(cls) {
		if !r.primary() {
			continue
		}
		t.Run(r.String(), func(t *testing.T) {
			before := splicedBytes(t, f)
			group := fmt.Sprintf("g-%s-%s", topic, r)
			got := r.consume(t, f.Addr, topic, group, n, r.protocol)
			checkConsumed(t, got, produced)
			checkGroup(t, adm, via, group, r.protocol, topic)
			// Each reader reads all 12 MB; most must have been spliced.
			if spliced := splicedBytes(t, f) - before; spliced < n*size/2 {
				t.Errorf("%.0f record bytes spliced while %s read %d MB", spliced, r, n*size>>20)
			}
		})
	}
}

// splicedBytes reads ferry_fetch_spliced_bytes_total from f's registry.
func splicedBytes(t *testing.T, f *ferrytest.Ferry) float64 {
	t.Helper()
	mfs, err := f.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ferry_fetch_spliced_bytes_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("ferry_fetch_spliced_bytes_total not registered")
	return 0
}
