// Package gateway runs franz-go through Ferry against a real 3-broker
// Apache Kafka cluster: what a client sees of the virtual cluster, record for
// record, and what it sees when a physical broker dies.
package gateway

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/proxy"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }

var (
	sharedOnce    sync.Once
	sharedCluster *kafkatest.Cluster
	sharedErr     error
)

// cluster is the 3-broker cluster every test in this package shares.
func cluster(t *testing.T) *kafkatest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("real Kafka is not started in -short mode")
	}
	sharedOnce.Do(func() {
		sharedCluster, sharedErr = kafkatest.New(kafkatest.Config{Brokers: 3, Name: "gateway"})
	})
	if sharedErr != nil {
		t.Fatalf("starting a 3-broker Kafka cluster: %v", sharedErr)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("broker logs:\n%s", sharedCluster.LogTail(60))
		}
	})
	return sharedCluster
}

func client(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(addr, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func createTopic(t *testing.T, adm *kadm.Client, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	createTopicRF(t, adm, topic, partitions, 3, configs)
}

// createTopicRF is createTopic with rf replicas (-1: the broker's default).
func createTopicRF(t *testing.T, adm *kadm.Client, topic string, partitions int32, rf int16, configs map[string]*string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, rf, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	// Brokers learn a new topic from the controller's log a moment after
	// CreateTopics answers: wait until adm's Metadata shows it.
	for {
		td, err := adm.ListTopics(ctx, topic)
		if err == nil && td[topic].Err == nil && len(td[topic].Partitions) == int(partitions) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s created but not in metadata: %v %v", topic, err, td[topic].Err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// produced is a record as acknowledged, keyed by its key.
type produced map[string]*kgo.Record

func produceN(t *testing.T, ctx context.Context, cl *kgo.Client, topic string, n int) produced {
	t.Helper()
	out := produced{}
	var mu sync.Mutex
	var firstErr error
	for i := 0; i < n; i++ {
		r := &kgo.Record{
			Topic:     topic,
			Key:       []byte(fmt.Sprintf("k-%05d", i)),
			Value:     []byte(fmt.Sprintf("v-%d-%s", i, strings.Repeat("x", i%200))),
			Headers:   []kgo.RecordHeader{{Key: "h", Value: []byte(strconv.Itoa(i))}},
			Timestamp: time.UnixMilli(1_700_000_000_000 + int64(i)),
		}
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
		out[string(r.Key)] = r
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if firstErr != nil {
		t.Fatalf("produce: %v", firstErr)
	}
	return out
}

// consumeAll reads n records and checks each against what was produced:
// same partition, offset, key, value, headers and timestamp.
func consumeAll(t *testing.T, ctx context.Context, cl *kgo.Client, want produced, n int) {
	t.Helper()
	seen := map[string]bool{}
	perPartition := map[int32]int{}
	for len(seen) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records (by partition: %v): %v", len(seen), n, perPartition, ctx.Err())
		}
		fs.EachError(func(topic string, p int32, err error) {
			t.Fatalf("fetch %s/%d: %v", topic, p, err)
		})
		fs.EachRecord(func(r *kgo.Record) {
			w := want[string(r.Key)]
			if w == nil {
				t.Fatalf("consumed a record never produced: %s at %d/%d", r.Key, r.Partition, r.Offset)
			}
			if seen[string(r.Key)] {
				t.Fatalf("record %s consumed twice", r.Key)
			}
			seen[string(r.Key)] = true
			perPartition[r.Partition]++
			if err := sameRecord(w, r); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func sameRecord(w, r *kgo.Record) error {
	switch {
	case w.Partition != r.Partition || w.Offset != r.Offset:
		return fmt.Errorf("record %s: produced at %d/%d, consumed at %d/%d", w.Key, w.Partition, w.Offset, r.Partition, r.Offset)
	case string(w.Value) != string(r.Value):
		return fmt.Errorf("record %s: value differs", w.Key)
	case !w.Timestamp.Equal(r.Timestamp):
		return fmt.Errorf("record %s: timestamp %v, want %v", w.Key, r.Timestamp, w.Timestamp)
	case len(r.Headers) != 1 || r.Headers[0].Key != "h" || string(r.Headers[0].Value) != string(w.Headers[0].Value):
		return fmt.Errorf("record %s: headers %v, want %v", w.Key, r.Headers, w.Headers)
	}
	return nil
}

// committedEqualsEnd asserts the group's committed offsets, read through
// Ferry and read directly from the brokers, both equal the end offsets.
func committedEqualsEnd(t *testing.T, ctx context.Context, viaFerry, direct *kadm.Client, group, topic string) {
	t.Helper()
	ends, err := direct.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	fo, err := viaFerry.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	do, err := direct.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		f, _ := fo.Lookup(topic, e.Partition)
		d, _ := do.Lookup(topic, e.Partition)
		if f.At != e.Offset || d.At != e.Offset {
			t.Errorf("%s/%d: committed %d through Ferry, %d directly; end offset %d", topic, e.Partition, f.At, d.At, e.Offset)
		}
	})
}

func TestCodecsIdempotentProduceGroupConsume(t *testing.T) {
	c := cluster(t)
	f := ferrytest.Start(t, c.Bootstrap())
	direct := kadm.NewClient(client(t, c.Bootstrap()))
	viaFerry := kadm.NewClient(client(t, f.Addr))
	for _, codec := range []struct {
		name  string
		codec kgo.CompressionCodec
	}{
		{"none", kgo.NoCompression()},
		{"gzip", kgo.GzipCompression()},
		{"snappy", kgo.SnappyCompression()},
		{"lz4", kgo.Lz4Compression()},
		{"zstd", kgo.ZstdCompression()},
	} {
		t.Run(codec.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			topic := "codec-" + codec.name
			createTopic(t, viaFerry, topic, 6, nil)
			prod := client(t, f.Addr, kgo.ProducerBatchCompression(codec.codec), kgo.ProducerLinger(5*time.Millisecond))
			const n = 1000
			want := produceN(t, ctx, prod, topic, n)
			group := "g-" + codec.name
			cons := client(t, f.Addr, kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group),
				kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.DisableAutoCommit())
			consumeAll(t, ctx, cons, want, n)
			if err := cons.CommitUncommittedOffsets(ctx); err != nil {
				t.Fatal(err)
			}
			committedEqualsEnd(t, ctx, viaFerry, direct, group, topic)
		})
	}
}

func TestTransactionsReadCommitted(t *testing.T) {
	c := cluster(t)
	f := ferrytest.Start(t, c.Bootstrap())
	adm := kadm.NewClient(client(t, f.Addr))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const topic = "txn"
	createTopic(t, adm, topic, 3, nil)

	prod := client(t, f.Addr, kgo.TransactionalID("ferry-txn-1"), kgo.DefaultProduceTopic(topic))
	committed := produced{}
	aborted := map[string]bool{}
	for round := 0; round < 6; round++ {
		if err := prod.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		commit := round%2 == 0
		for i := 0; i < 50; i++ {
			key := fmt.Sprintf("r%d-%02d", round, i)
			r := &kgo.Record{Key: []byte(key), Value: []byte("v-" + key), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(key)}}}
			if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if commit {
				committed[key] = r
			} else {
				aborted[key] = true
			}
		}
		if err := prod.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatalf("end transaction (commit=%v): %v", commit, err)
		}
	}
	// Ferry states the broker's transaction.version 2
	// (TestApiVersionsFeaturesThroughFerry), so the producer took KIP-890's
	// path: the brokers add partitions to the transaction on Produce, and
	// it never asks; every EndTxn reached the broker.
	if n := requestsAnswered(t, f.Registry, "AddPartitionsToTxn"); n != 0 {
		t.Errorf("%v AddPartitionsToTxn requests through Ferry; under transaction.version 2 the producer sends none", n)
	}
	if n := requestsAnswered(t, f.Registry, "EndTxn"); n < 6 {
		t.Errorf("%v EndTxn requests through Ferry, want 6", n)
	}

	cons := client(t, f.Addr, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	seen := map[string]bool{}
	for len(seen) < len(committed) {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d committed records", len(seen), len(committed))
		}
		fs.EachRecord(func(r *kgo.Record) {
			k := string(r.Key)
			if aborted[k] {
				t.Fatalf("read_committed consumer saw aborted record %s", k)
			}
			w := committed[k]
			if w == nil || w.Offset != r.Offset || w.Partition != r.Partition || string(w.Value) != string(r.Value) {
				t.Fatalf("record %s differs from what was committed", k)
			}
			seen[k] = true
		})
	}
	// A read_uncommitted consumer through Ferry sees the aborted records
	// too, at the offsets they were written at.
	all := len(committed) + len(aborted)
	unc := client(t, f.Addr, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	seenAll := map[string]bool{}
	for len(seenAll) < all {
		fs := unc.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read_uncommitted read %d of %d records", len(seenAll), all)
		}
		fs.EachRecord(func(r *kgo.Record) {
			k := string(r.Key)
			if !aborted[k] && committed[k] == nil {
				t.Fatalf("unknown record %s", k)
			}
			if w := committed[k]; w != nil && w.Offset != r.Offset {
				t.Fatalf("record %s at offset %d, committed at %d", k, r.Offset, w.Offset)
			}
			seenAll[k] = true
		})
	}
}

func TestAdminThroughFerry(t *testing.T) {
	c := cluster(t)
	// It changes a topic's config and deletes the topic: opted in.
	f := ferrytest.Start(t, c.Bootstrap(), proxy.WithRequestPolicy([]string{"topic_config", "topic_delete"}, nil))
	adm := kadm.NewClient(client(t, f.Addr))
	direct := kadm.NewClient(client(t, c.Bootstrap()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	retention := "3600000"
	createTopic(t, adm, "admin-topic", 3, map[string]*string{"retention.ms": &retention})
	td, err := adm.ListTopics(ctx, "admin-topic")
	if err != nil {
		t.Fatal(err)
	}
	d := td["admin-topic"]
	if d.Err != nil || len(d.Partitions) != 3 {
		t.Fatalf("describe: %+v", d)
	}
	directTD, err := direct.ListTopics(ctx, "admin-topic")
	if err != nil {
		t.Fatal(err)
	}
	if d.ID == directTD["admin-topic"].ID {
		t.Fatal("the physical topic ID reached the client; want Ferry's virtual ID")
	}

	value := "7200000"
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.ms", Value: &value}}, "admin-topic"); err != nil {
		t.Fatal(err)
	}
	// Brokers apply a config change from the controller's log a moment
	// later; a client reading it back polls, through Ferry as directly.
	got := ""
	testwait.Eventually(t, 15*time.Second, fmt.Sprintf("retention.ms = %q after alter", value), func() error {
		rcs, err := adm.DescribeTopicConfigs(ctx, "admin-topic")
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rcs.On("admin-topic", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, cfg := range rc.Configs {
			if cfg.Key == "retention.ms" {
				got = cfg.MaybeValue()
			}
		}
		if got != value {
			return fmt.Errorf("retention.ms = %q", got)
		}
		return nil
	})
	if _, err := adm.CreatePartitions(ctx, 2, "admin-topic"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 15*time.Second, "5 partitions after CreatePartitions", func() error {
		td, _ = direct.ListTopics(ctx, "admin-topic")
		if n := len(td["admin-topic"].Partitions); n != 5 {
			return fmt.Errorf("%d partitions", n)
		}
		return nil
	})
	dr, err := adm.DeleteTopics(ctx, "admin-topic")
	if err != nil || dr["admin-topic"].Err != nil {
		t.Fatalf("delete: %v %v", err, dr["admin-topic"].Err)
	}

	// Every address a client is given is Ferry's.
	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range md.Brokers {
		if addr := net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))); !slices.Contains(f.Addrs, addr) {
			t.Fatalf("metadata names broker %d at %s; want only Ferry's lanes %v", b.NodeID, addr, f.Addrs)
		}
	}
	if md.Cluster != "ferry-conformance" {
		t.Fatalf("cluster ID %q, want Ferry's", md.Cluster)
	}
}

// TestBrokerDiesClientsContinue kills the leader of a partition while a
// producer and a consumer work through Ferry: both see only retriable errors
// and every record arrives once, at the offset it was acknowledged at. The
// producer has franz-go's default retries. (Its producer ID is loaded before
// the kill; producers of every client that start during the outage, compared
// with the same clients talking to the brokers directly, are
// conformance.TestBrokerDeathProducers.)
func TestBrokerDiesClientsContinue(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka is not started in -short mode")
	}
	// A cluster of its own: the kill must not disturb the other tests.
	c := kafkatest.Start(t, 3, kafkatest.WithName("gateway-failover"))
	f := ferrytest.Start(t, c.Bootstrap())
	adm := kadm.NewClient(client(t, f.Addr))
	direct := kadm.NewClient(client(t, c.Bootstrap()))
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	const topic = "failover"
	createTopic(t, adm, topic, 3, map[string]*string{"min.insync.replicas": ptr("2")})

	prod := client(t, f.Addr, kgo.DefaultProduceTopic(topic), kgo.ProduceRequestTimeout(10*time.Second))
	want := produced{}
	var mu sync.Mutex
	var errs []error
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			r := &kgo.Record{Key: []byte(fmt.Sprintf("k-%05d", i)), Value: []byte(fmt.Sprintf("v-%d", i)), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(strconv.Itoa(i))}}, Timestamp: time.UnixMilli(1_700_000_000_000 + int64(i))}
			mu.Lock()
			want[string(r.Key)] = r
			mu.Unlock()
			prod.Produce(ctx, r, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
			if i%50 == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	produce(0, 500)
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// Kill the physical leader of partition 0 mid-stream, once every
	// partition has its full ISR (so Kafka itself can elect a new leader).
	var victim int32
	testwait.Eventually(t, 30*time.Second, "the ISR full before the kill", func() error {
		md, err := direct.Metadata(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		full := true
		for _, p := range md.Topics[topic].Partitions {
			full = full && len(p.ISR) == 3
		}
		victim = md.Topics[topic].Partitions[0].Leader
		if !full {
			return fmt.Errorf("%+v", md.Topics[topic].Partitions)
		}
		return nil
	})
	done := make(chan struct{})
	go func() { defer close(done); produce(500, 1500) }()
	time.Sleep(100 * time.Millisecond)
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Restart(victim); err != nil {
			t.Errorf("restarting broker %d: %v", victim, err)
		}
	})
	<-done
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatalf("producer saw %d non-retried errors through Ferry, first: %v", len(errs), errs[0])
	}
	clientLog := &tailBuffer{max: 256 << 10}
	cons := client(t, f.Addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.WithLogger(kgo.BasicLogger(clientLog, kgo.LogLevelDebug, nil)))
	diagnoseOnFailure(t, topic, direct, adm, clientLog)
	consumeAll(t, ctx, cons, want, len(want))
}

func TestUnsupportedVersionClosesOnlyThatConnection(t *testing.T) {
	c := cluster(t)
	f := ferrytest.Start(t, c.Bootstrap())
	conn, err := net.Dial("tcp", f.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Metadata v99: a version no one supports.
	frame := []byte{0, 0, 0, 10, 0, 3, 0, 99, 0, 0, 0, 7, 0, 0}
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var buf [1]byte
	if n, err := conn.Read(buf[:]); err == nil {
		t.Fatalf("read %d bytes; want the connection closed, as a broker does", n)
	}
	// Ferry still serves everyone else.
	adm := kadm.NewClient(client(t, f.Addr))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := adm.BrokerMetadata(ctx); err != nil {
		t.Fatalf("metadata after a bad client: %v", err)
	}
}

func ptr(s string) *string { return &s }
