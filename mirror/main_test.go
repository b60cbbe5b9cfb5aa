package mirror

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/protocol"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild() // never returns
	}
	kafkatest.Main(m)
}

// Two 1-node clusters shared by every test of the package: "active" (the
// source) and "standby" (the target). Tests use their own topics and their
// own Mirror restricted to those topics.
var (
	clustersOnce     sync.Once
	active, standby  *kafkatest.Cluster
	clustersStartErr error
)

// brokerConfig: an authorizer that lets everyone in (so ACLs can be
// described and created), and a fast log cleaner for the compaction test.
var brokerConfig = map[string]string{
	"authorizer.class.name":           "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
	"allow.everyone.if.no.acl.found":  "true",
	"super.users":                     "User:ANONYMOUS",
	"log.cleaner.backoff.ms":          "500",
	"log.retention.check.interval.ms": "1000",
	"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}

func clusters(t *testing.T) (*kafkatest.Cluster, *kafkatest.Cluster) {
	t.Helper()
	if testing.Short() {
		t.Skip("real Kafka is not started in -short mode")
	}
	clustersOnce.Do(func() {
		var wg sync.WaitGroup
		var errA, errS error
		wg.Go(func() {
			active, errA = kafkatest.New(kafkatest.Config{Brokers: 1, Name: "mirror-active", BrokerConfig: brokerConfig})
		})
		wg.Go(func() {
			standby, errS = kafkatest.New(kafkatest.Config{Brokers: 1, Name: "mirror-standby", BrokerConfig: brokerConfig})
		})
		wg.Wait()
		if errA != nil || errS != nil {
			clustersStartErr = fmt.Errorf("active: %v; standby: %v", errA, errS)
		}
	})
	if clustersStartErr != nil {
		t.Fatal(clustersStartErr)
	}
	return active, standby
}

func newClient(t *testing.T, c *kafkatest.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Addrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func createTopic(t *testing.T, c *kafkatest.Cluster, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	adm := kadm.NewClient(newClient(t, c))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating %s: %v", topic, err)
	}
}

// topicIDs returns the IDs of topics on cluster c.
func topicIDs(t *testing.T, c *kafkatest.Cluster, topics ...string) map[string][16]byte {
	t.Helper()
	adm := kadm.NewClient(newClient(t, c))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		t.Fatalf("listing %v: %v", topics, err)
	}
	ids := make(map[string][16]byte, len(td))
	for name, d := range td {
		if d.Err != nil {
			t.Fatalf("listing %s: %v", name, d.Err)
		}
		ids[name] = d.ID
	}
	return ids
}

// startMirror runs a Mirror over the given topics until the test ends.
func startMirror(t *testing.T, opts ...Option) *Mirror {
	t.Helper()
	a, s := clusters(t)
	base := []Option{Source(a.Bootstrap()), Target(s.Bootstrap()), SyncInterval(500 * time.Millisecond),
		FetchMaxWait(100 * time.Millisecond), Logger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))}
	m, err := New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = m.Run(context.Background())
	}()
	t.Cleanup(func() {
		m.Close()
		<-done
	})
	return m
}

func waitCaughtUp(t *testing.T, m *Mirror, topics ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := m.WaitCaughtUp(ctx, topics...); err != nil {
		t.Fatalf("waiting for the mirror to catch up: %v\n%+v", err, m.Status())
	}
}

// rawBatches fetches every batch of a partition as bytes, read_uncommitted,
// from the log start.
func rawBatches(t *testing.T, c *kafkatest.Cluster, topic string, partition int32) []protocol.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cn, err := dialConn(ctx, c.Addrs()[0], nil) // 1-node clusters: the leader
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	start, end := offsetsOf(t, c, topic, partition)
	var out []protocol.Batch
	for at := start; at < end; {
		req := kmsg.NewPtrFetchRequest()
		req.Version = fetchVersion
		req.ReplicaID = -1
		req.MaxBytes = 16 << 20
		req.SessionEpoch = -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = partition
		rp.FetchOffset = at
		rp.CurrentLeaderEpoch = -1
		rp.LastFetchedEpoch = -1
		rp.PartitionMaxBytes = 16 << 20
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		r, err := cn.Do(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		p := r.(*kmsg.FetchResponse).Topics[0].Partitions[0]
		if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
			t.Fatalf("fetch %s[%d]@%d: %v", topic, partition, at, err)
		}
		n := 0
		_ = protocol.WalkBatches(p.RecordBatches, func(b protocol.Batch) error {
			if b.NextOffset() > at {
				out = append(out, append(protocol.Batch(nil), b...))
				at = b.NextOffset()
				n++
			}
			return nil
		})
		if n == 0 {
			t.Fatalf("fetch %s[%d]@%d returned nothing below end %d", topic, partition, at, end)
		}
	}
	return out
}

// offsetsOf returns a partition's log start and high watermark.
func offsetsOf(t *testing.T, c *kafkatest.Cluster, topic string, partition int32) (int64, int64) {
	t.Helper()
	adm := kadm.NewClient(newClient(t, c))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	e, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	so, _ := s.Lookup(topic, partition)
	eo, _ := e.Lookup(topic, partition)
	if so.Err != nil || eo.Err != nil {
		t.Fatalf("offsets of %s[%d]: %v %v", topic, partition, so.Err, eo.Err)
	}
	return so.Offset, eo.Offset
}

type rec struct {
	Offset  int64
	Key     string
	Value   string
	Headers string
	Time    int64
}

// consumeAll reads a partition from its start with the given isolation
// level until no record arrives for 400ms.
func consumeAll(t *testing.T, c *kafkatest.Cluster, topic string, partition int32, committed bool) []rec {
	t.Helper()
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	cl := newClient(t, c, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(iso), kgo.FetchMaxWait(50*time.Millisecond))
	var out []rec
	// The first poll may take a while (connections, ListOffsets); after
	// that, no record for 400ms ends the read.
	idle := 15 * time.Second
	if start, end := offsetsOf(t, c, topic, partition); start == end {
		return nil
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), idle)
		idle = 400 * time.Millisecond
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachError(func(_ string, _ int32, err error) {
			if err != context.DeadlineExceeded {
				t.Fatalf("consuming %s[%d]: %v", topic, partition, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			var h bytes.Buffer
			for _, x := range r.Headers {
				fmt.Fprintf(&h, "%s=%s;", x.Key, x.Value)
			}
			out = append(out, rec{r.Offset, string(r.Key), string(r.Value), h.String(), r.Timestamp.UnixMilli()})
			n++
		})
		if n == 0 {
			return out
		}
	}
}

// sameRecords fails the test unless both clusters show the same records of
// the partition at the same offsets, read_uncommitted and read_committed.
func sameRecords(t *testing.T, topic string, partition int32) (uncommitted, committed []rec) {
	t.Helper()
	for _, rc := range []bool{false, true} {
		src := consumeAll(t, active, topic, partition, rc)
		// Fillers are visible to direct readers of the standby (Ferry
		// drops them from its Fetch responses): leave them out.
		var dst []rec
		for _, r := range consumeAll(t, standby, topic, partition, rc) {
			if r.Key != string(protocol.FillerKey) {
				dst = append(dst, r)
			}
		}
		if len(src) != len(dst) {
			t.Fatalf("%s[%d] read_committed=%v: source has %d records, standby %d", topic, partition, rc, len(src), len(dst))
		}
		for i := range src {
			if src[i] != dst[i] {
				t.Fatalf("%s[%d] read_committed=%v record %d: source %+v, standby %+v", topic, partition, rc, i, src[i], dst[i])
			}
		}
		if rc {
			committed = src
		} else {
			uncommitted = src
		}
	}
	return uncommitted, committed
}

// sameBatches fails the test unless both logs hold the same batches at the
// same offsets with byte-equal payloads (fillers and markers aside).
func sameBatches(t *testing.T, topic string, partition int32) {
	t.Helper()
	sameBatchesBut(t, topic, partition, nil)
}

// sameBatchesBut is sameBatches, a source batch the standby no longer
// holds passing where compacted(b) says the standby's own cleaner may have
// removed it.
func sameBatchesBut(t *testing.T, topic string, partition int32, compacted func(b protocol.Batch) bool) {
	t.Helper()
	ss, se := offsetsOf(t, active, topic, partition)
	ds, de := offsetsOf(t, standby, topic, partition)
	if se != de {
		t.Fatalf("%s[%d]: source ends at %d, standby at %d", topic, partition, se, de)
	}
	if ss != ds {
		t.Errorf("%s[%d]: source log starts at %d, standby at %d", topic, partition, ss, ds)
	}
	src := rawBatches(t, active, topic, partition)
	dst := rawBatches(t, standby, topic, partition)
	byBase := make(map[int64]protocol.Batch)
	for _, b := range dst {
		byBase[b.BaseOffset()] = b
	}
	for _, b := range src {
		if b.IsControl() {
			d := byBase[b.BaseOffset()]
			if d == nil || !d.IsControl() {
				t.Fatalf("%s[%d]: source marker at %d, standby has none there", topic, partition, b.BaseOffset())
			}
			st, _ := protocol.ControlType(b)
			dt, _ := protocol.ControlType(d)
			if st != dt {
				t.Fatalf("%s[%d]: source marker at %d is type %d, standby's %d", topic, partition, b.BaseOffset(), st, dt)
			}
			continue
		}
		if b.NumRecords() == 0 {
			continue // an empty batch the cleaner kept: a filler on the standby
		}
		d := byBase[b.BaseOffset()]
		if d == nil && compacted != nil && compacted(b) {
			continue
		}
		if d == nil {
			t.Fatalf("%s[%d]: source batch at %d missing on the standby", topic, partition, b.BaseOffset())
		}
		if d.NextOffset() != b.NextOffset() || d.NumRecords() != b.NumRecords() || d.Compression() != b.Compression() ||
			d.BaseTimestamp() != b.BaseTimestamp() || !bytes.Equal(d.Payload(), b.Payload()) {
			t.Fatalf("%s[%d]: batch at %d differs: source codec %d %d records %d payload bytes, standby codec %d %d records %d payload bytes",
				topic, partition, b.BaseOffset(), b.Compression(), b.NumRecords(), len(b.Payload()), d.Compression(), d.NumRecords(), len(d.Payload()))
		}
	}
}
