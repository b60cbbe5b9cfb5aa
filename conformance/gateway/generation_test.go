package gateway

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
)

// TestVirtualIdentityUnderLaterGeneration runs Ferry as if it had switched
// clusters three times: every epoch and producer ID a client sees is
// generation-shifted, the brokers only ever see physical ones (they verify
// the CRC Ferry recomputes after mapping producer IDs back in each batch),
// and clients notice nothing.
func TestVirtualIdentityUnderLaterGeneration(t *testing.T) {
	c := cluster(t)
	const gen = 3
	table := routing.NewTable(routing.State{Generation: gen, Active: "primary"})
	f := ferrytest.Start(t, c.Bootstrap(), proxy.WithRoutingTable(table))
	adm := kadm.NewClient(client(t, f.Addr))
	direct := kadm.NewClient(client(t, c.Bootstrap()))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const topic = "generation"
	createTopic(t, adm, topic, 3, nil)

	// Epochs in metadata are generation-shifted.
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range md.Topics[topic].Partitions {
		if routing.EpochGeneration(p.LeaderEpoch) != gen {
			t.Fatalf("partition %d leader epoch %d is not of generation %d", p.Partition, p.LeaderEpoch, gen)
		}
	}

	// Idempotent and transactional producers work; records land once.
	idem := client(t, f.Addr, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	want := produceN(t, ctx, idem, topic, 600)
	txn := client(t, f.Addr, kgo.DefaultProduceTopic(topic), kgo.TransactionalID("gen-txn"))
	for i := 0; i < 3; i++ {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("txn-%d", i)
		r := &kgo.Record{Key: []byte(key), Value: []byte(key), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(key)}}}
		if err := txn.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
		want[key] = r
	}
	cons := client(t, f.Addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	consumeAll(t, ctx, cons, want, len(want))

	// The producer IDs clients see are virtual; the brokers hold physical ones.
	// UNKNOWN_TOPIC_OR_PARTITION is retriable: a broker restarted by an
	// earlier test may still be loading the topic's replicas.
	describe := func(adm *kadm.Client) kadm.DescribedProducersTopics {
		for {
			d, err := adm.DescribeProducers(ctx, kadm.TopicsSet{topic: {0: {}, 1: {}, 2: {}}})
			if err == nil {
				return d
			}
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	viaFerry, directly := describe(adm), describe(direct)
	seen := 0
	viaFerry.EachProducer(func(p kadm.DescribedProducer) {
		phys, ok := routing.PhysicalPID(gen, p.ProducerID)
		if !ok {
			t.Fatalf("producer ID %d seen through Ferry is not of generation %d", p.ProducerID, gen)
		}
		found := false
		directly.EachProducer(func(d kadm.DescribedProducer) { found = found || d.ProducerID == phys })
		if !found {
			t.Fatalf("virtual producer ID %d maps to %d, which the brokers do not know", p.ProducerID, phys)
		}
		seen++
	})
	if seen == 0 {
		t.Fatal("no producers described")
	}

	// A fetch naming an epoch of an older generation is fenced, so the
	// client refreshes its metadata instead of reading the wrong cluster.
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.CurrentLeaderEpoch, rp.Timestamp = 0, routing.VirtualEpoch(gen-1, 0), -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, client(t, f.Addr))
	if err != nil {
		t.Fatal(err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != kerr.FencedLeaderEpoch.Code {
		t.Fatalf("ListOffsets with a generation-%d epoch: error %d, want FENCED_LEADER_EPOCH", gen-1, code)
	}
}
