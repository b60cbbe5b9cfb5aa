package proxy

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

// TestLargeFetchesAreSpliced: a consumer reading megabytes through Ferry
// under generation 0 gets every record at its offset, byte for byte, while
// the record bytes move from the broker's socket to the client's with
// splice(2) — at Fetch v18 (topic IDs, flexible), v12 (names, flexible)
// and v11 (not flexible) — and with splicing turned off, the same records
// with nothing spliced.
func TestLargeFetchesAreSpliced(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(2, "big"))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Written directly: the test is about the fetch path.
	prod := newClient(t, kf.ListenAddrs()[0], kgo.DefaultProduceTopic("big"), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 800 // 8 KiB each: 6.4 MB
	values := map[string][]byte{}
	for i := range n {
		v := make([]byte, 8<<10)
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		r := &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: v}
		prod.Produce(ctx, r, func(r *kgo.Record, err error) {
			if err != nil {
				t.Errorf("produce: %v", err)
			}
		})
		values[string(r.Key)] = v
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	direct := readAll(t, ctx, kf.ListenAddrs()[0], n, nil)

	for _, tc := range []struct {
		name   string
		fetch  int16
		splice bool
	}{{"v18", 18, true}, {"v12", 12, true}, {"v11", 11, true}, {"off", 18, false}} {
		t.Run(tc.name, func(t *testing.T) {
			s, addr := startFerry(t, kf.ListenAddrs(), WithSpliceFetches(tc.splice))
			versions := kversion.Stable()
			versions.SetMaxKeyVersion(1, tc.fetch)
			got := readAll(t, ctx, addr, n, versions)
			for k, r := range got {
				d := direct[k]
				if r.Partition != d.Partition || r.Offset != d.Offset || !bytes.Equal(r.Value, values[k]) || !r.Timestamp.Equal(d.Timestamp) {
					t.Fatalf("record %s at %d/%d through Ferry, %d/%d directly, value equal %v", k, r.Partition, r.Offset, d.Partition, d.Offset, bytes.Equal(r.Value, values[k]))
				}
			}
			spliced := testutil.ToFloat64(s.metrics.splicedBytes)
			t.Logf("%.0f record bytes spliced", spliced)
			if tc.splice && spliced < 4<<20 {
				t.Fatalf("%.0f record bytes spliced of about 6.4 MB", spliced)
			}
			if !tc.splice && spliced != 0 {
				t.Fatalf("%.0f bytes spliced with splicing off", spliced)
			}
		})
	}
}

// readAll consumes n records of "big" from the start, by key.
func readAll(t *testing.T, ctx context.Context, addr string, n int, versions *kversion.Versions) map[string]*kgo.Record {
	t.Helper()
	opts := []kgo.Opt{kgo.ConsumeTopics("big"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(4 << 20)}
	if versions != nil {
		opts = append(opts, kgo.MaxVersions(versions))
	}
	cl := newClient(t, addr, opts...)
	got := map[string]*kgo.Record{}
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", len(got), n, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Key)] = r })
	}
	cl.Close()
	return got
}
