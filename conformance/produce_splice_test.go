package conformance

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
)

// TestProduceSplicedOnKafka: large batches from an idempotent producer and
// from a transactional one (one transaction committed, one aborted) go
// through Ferry to real Kafka with their bodies moved from socket to
// socket through a pipe (proxy/produce_splice.go), and the cluster holds
// exactly what was acknowledged: every record at its offset, byte for
// byte, the aborted transaction's invisible to a read_committed reader.
// A record corrupted on the way would fail the broker's CRC check
// (CORRUPT_MESSAGE) and the producer's flush. Also under a generation
// after a switch, where each batch's producer ID is mapped to the
// cluster's in its header and its CRC patched from that change alone: the
// cluster holds the records under the physical producer ID.
func TestProduceSplicedOnKafka(t *testing.T) {
	c := sharedCluster(t)
	for _, gen := range []uint32{0, 3} {
		t.Run(fmt.Sprintf("generation %d", gen), func(t *testing.T) { produceSplicedOnKafka(t, c, gen) })
	}
}

func produceSplicedOnKafka(t *testing.T, c *kafkatest.Cluster, gen uint32) {
	adm := admin(t, c)
	topic := createTopic(t, adm, "spliced")
	f := ferrytest.Start(t, c.Bootstrap(), proxy.WithRoutingTable(routing.NewTable(routing.State{Generation: gen, Active: "primary"})))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	value := func(i int) []byte {
		b := make([]byte, 20<<10)
		rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), 9}).Read(b)
		return b
	}
	// Requests under 1 MiB: three partitions of batches up to 256 KiB.
	opts := []kgo.Opt{kgo.SeedBrokers(f.Addr), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerLinger(20 * time.Millisecond), kgo.ProducerBatchMaxBytes(256 << 10)}
	want := map[string]*kgo.Record{}
	produce := func(cl *kgo.Client, from, to int, keep bool) {
		for i := from; i < to; i++ {
			r := &kgo.Record{Key: fmt.Appendf(nil, "%d", i), Value: value(i), Headers: []kgo.RecordHeader{{Key: "i", Value: fmt.Appendf(nil, "%d", i)}}}
			if keep {
				want[string(r.Key)] = r
			}
			cl.Produce(ctx, r, func(r *kgo.Record, err error) {
				if err != nil {
					t.Errorf("record %s: %v", r.Key, err)
				}
			})
		}
		if err := cl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	idem, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer idem.Close()
	produce(idem, 0, 300, true)
	virt, _, err := idem.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	phys := virt // generation 0's IDs are the cluster's
	if gen != 0 {
		var ok bool
		if phys, ok = routing.PhysicalPID(gen, virt); !ok || phys == virt {
			t.Fatalf("producer ID %d is not one of generation %d", virt, gen)
		}
	}

	txn, err := kgo.NewClient(append(opts, kgo.TransactionalID("spliced-"+topic))...)
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	for _, commit := range []bool{true, false} {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		from := 300
		if !commit {
			from = 400
		}
		produce(txn, from, from+100, commit)
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	// Behind the aborted records in every partition (keys spread them),
	// so the reader below passes them.
	produce(idem, 500, 530, true)

	mfs, err := f.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	spliced := counterWith(mfs, "ferry_produce_spliced_bytes_total", "to", "broker")
	readBack := counterWith(mfs, "ferry_produce_spliced_bytes_total", "to", "ferry")
	t.Logf("%.1f MiB spliced to the brokers, %.1f MiB read back, of %.1f MiB produced", spliced/(1<<20), readBack/(1<<20), float64(630*20<<10)/(1<<20))
	if spliced < 2<<20 {
		t.Fatalf("%.0f bytes spliced to the brokers, want most of the 13 MB produced", spliced)
	}

	// Read from the cluster itself, committed records only.
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	for got := 0; got < len(want); {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records from the cluster", got, len(want))
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			w := want[string(r.Key)]
			if w == nil {
				t.Fatalf("record %s at %d/%d: not one committed", r.Key, r.Partition, r.Offset)
			}
			if r.Partition != w.Partition || r.Offset != w.Offset || !bytes.Equal(r.Value, w.Value) || len(r.Headers) != 1 || !bytes.Equal(r.Headers[0].Value, w.Key) {
				t.Fatalf("record %s at %d/%d, acknowledged at %d/%d, value or header changed", r.Key, r.Partition, r.Offset, w.Partition, w.Offset)
			}
			if i, _ := strconv.Atoi(string(r.Key)); (i < 300 || i >= 500) && r.ProducerID != phys {
				t.Fatalf("record %s written by producer ID %d, want the cluster's %d (the client's %d)", r.Key, r.ProducerID, phys, virt)
			}
			got++
		})
	}
}
