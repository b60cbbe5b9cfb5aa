package proxy

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"
)

// startFerry runs a Ferry in front of the given bootstrap servers and
// returns its address.
func startFerry(t testing.TB, bootstrap []string, opts ...Option) (*Server, string) {
	t.Helper()
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1})
	base := []Option{
		WithClusterID("ferry-test"),
		WithClusters(upstream.Config{Name: "a", Bootstrap: bootstrap}),
		WithBrokerSet(fleet),
		WithLogger(zaptest.NewLogger(t)),
		WithRegisterer(prometheus.NewRegistry()),
	}
	s, err := New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var lns []net.Listener
	var ports []int32
	for l := 0; l < s.Lanes(); l++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, int32(ln.Addr().(*net.TCPAddr).Port))
	}
	fleet.Set([]routing.Broker{{NodeID: 0, Host: "127.0.0.1", Port: ports[0], LanePorts: ports}})
	for i, ln := range lns {
		go s.ServeLane(ln, i)
	}
	return s, lns[0].Addr().String()
}

func newKfake(t testing.TB, brokers int, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(brokers)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newClient(t testing.TB, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func TestProduceConsumeThroughFerry(t *testing.T) {
	kf := newKfake(t, 3)
	_, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	adm := kadm.NewClient(newClient(t, addr))
	if _, err := adm.CreateTopic(ctx, 6, 3, nil, "orders"); err != nil {
		t.Fatal(err)
	}
	prod := newClient(t, addr, kgo.DefaultProduceTopic("orders"), kgo.ProducerBatchCompression(kgo.Lz4Compression()))
	const n = 600
	want := map[string]*kgo.Record{}
	for i := 0; i < n; i++ {
		r := &kgo.Record{Key: []byte(fmt.Sprintf("k-%d", i)), Value: []byte(fmt.Sprintf("v-%d", i)), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(strconv.Itoa(i))}}}
		prod.Produce(ctx, r, nil)
		want[string(r.Key)] = r
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range want {
		if r.Offset < 0 {
			t.Fatalf("record %s not acknowledged", r.Key)
		}
	}

	cons := newClient(t, addr, kgo.ConsumeTopics("orders"), kgo.ConsumerGroup("g1"), kgo.DisableAutoCommit())
	got := 0
	for got < n {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", got, n, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			w := want[string(r.Key)]
			if w == nil || w.Partition != r.Partition || w.Offset != r.Offset || string(w.Value) != string(r.Value) || string(r.Headers[0].Value) != string(w.Headers[0].Value) || !w.Timestamp.Equal(r.Timestamp) {
				t.Fatalf("record %s at %d/%d differs from what was produced", r.Key, r.Partition, r.Offset)
			}
			got++
		})
		if err := cons.CommitUncommittedOffsets(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Committed offsets read through Ferry equal those read directly.
	viaFerry, err := adm.FetchOffsets(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	direct, err := kadm.NewClient(newClient(t, kf.ListenAddrs()[0])).FetchOffsets(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		v, _ := viaFerry.Lookup("orders", e.Partition)
		d, _ := direct.Lookup("orders", e.Partition)
		if v.At != e.Offset || d.At != e.Offset {
			t.Fatalf("partition %d: committed via Ferry %d, direct %d, end %d", e.Partition, v.At, d.At, e.Offset)
		}
	})
}

func TestMetadataShowsOnlyFerry(t *testing.T) {
	kf := newKfake(t, 3)
	_, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, addr))
	if _, err := adm.CreateTopic(ctx, 3, 3, nil, "t"); err != nil {
		t.Fatal(err)
	}
	md, err := adm.Metadata(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if md.Cluster != "ferry-test" {
		t.Fatalf("cluster ID %q, want Ferry's", md.Cluster)
	}
	// One virtual broker per physical one (lanes), each on its own port.
	if len(md.Brokers) != 3 {
		t.Fatalf("brokers %+v, want 3 lanes", md.Brokers)
	}
	ids := map[int32]bool{}
	ports := map[int32]bool{}
	for _, b := range md.Brokers {
		if b.Host != "127.0.0.1" || ports[b.Port] {
			t.Fatalf("broker %+v: want each lane on a port of its own on Ferry's host", b)
		}
		ports[b.Port] = true
		ids[b.NodeID] = true
	}
	if !ports[int32(mustPort(addr))] {
		t.Fatalf("no lane at the bootstrap address %s", addr)
	}
	// Partitions with the same physical leader share a virtual leader, and
	// different physical leaders get different virtual ones.
	direct, err := kadm.NewClient(newClient(t, kf.ListenAddrs()[0])).Metadata(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	phys2virt := map[int32]int32{}
	for _, p := range md.Topics["t"].Partitions {
		if !ids[p.Leader] {
			t.Fatalf("partition %d leader %d is not a Ferry lane", p.Partition, p.Leader)
		}
		pl := direct.Topics["t"].Partitions[p.Partition].Leader
		if v, ok := phys2virt[pl]; ok && v != p.Leader {
			t.Fatalf("physical leader %d shown as both %d and %d", pl, v, p.Leader)
		}
		phys2virt[pl] = p.Leader
	}
	seen := map[int32]bool{}
	for _, v := range phys2virt {
		if seen[v] {
			t.Fatalf("two physical leaders share virtual leader %d: %v", v, phys2virt)
		}
		seen[v] = true
	}
}

func TestFetchAnswersWithoutWaitingForIdleBrokers(t *testing.T) {
	kf := newKfake(t, 3)
	// One lane: every fetch is split over the three brokers.
	_, addr := startFerry(t, kf.ListenAddrs(), WithLanes(1))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, addr))
	if _, err := adm.CreateTopic(ctx, 6, 1, nil, "latency"); err != nil {
		t.Fatal(err)
	}
	// Long enough that "well under it" is not a race with a busy
	// machine: answered when a part brings records takes milliseconds;
	// waiting for the idle brokers would take all of it.
	const maxWait = 10 * time.Second
	cons := newClient(t, addr, kgo.ConsumeTopics("latency"), kgo.FetchMaxWait(maxWait), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	prod := newClient(t, addr, kgo.DefaultProduceTopic("latency"), kgo.RecordPartitioner(kgo.ManualPartitioner()))

	got := make(chan time.Time, 10)
	go func() {
		for ctx.Err() == nil {
			cons.PollFetches(ctx).EachRecord(func(*kgo.Record) { got <- time.Now() })
		}
	}()
	// A record in every partition, consumed: every partition then has
	// its position and is in the consumer's fetch. (A partition whose
	// position the client was still looking up would join only the
	// fetch after the one parked, a client's MaxWait later, however a
	// busy machine stretched the look-up.)
	for p := int32(0); p < 6; p++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte("warm")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for range 6 {
		select {
		case <-got:
		case <-ctx.Done():
			t.Fatal("the first records were never consumed")
		}
	}
	time.Sleep(1500 * time.Millisecond) // the consumer's next fetch is parked upstream
	for i := 0; i < 3; i++ {
		sent := time.Now()
		if err := prod.ProduceSync(ctx, &kgo.Record{Partition: int32(i), Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-got:
			if d := at.Sub(sent); d > maxWait/2 {
				t.Fatalf("record %d arrived after %v; want well under MaxWait %v", i, d, maxWait)
			}
		case <-ctx.Done():
			t.Fatal("record never consumed")
		}
	}
}

func mustPort(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// TestFillersNeverReachClients writes what the mirror leaves on a standby —
// filler batches between real ones — and reads it through Ferry: the real
// records at their offsets, none of the fillers, and the reader reaches the
// end rather than stalling before the fillers' offsets.
func TestFillersNeverReachClients(t *testing.T) {
	kf := newKfake(t, 1)
	_, addr := startFerry(t, kf.ListenAddrs(), WithClusters(upstream.Config{Name: "a", Bootstrap: kf.ListenAddrs(), MirrorTarget: true}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	direct := newClient(t, kf.ListenAddrs()[0])
	created, err := kadm.NewClient(direct).CreateTopic(ctx, 1, 1, nil, "standby")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := (&kmsg.InitProducerIDRequest{TransactionTimeoutMillis: 60000, ProducerID: -1, ProducerEpoch: -1}).RequestWith(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	produceRaw := func(batch []byte) int64 {
		req := kmsg.NewPtrProduceRequest()
		req.Acks, req.TimeoutMillis = -1, 5000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic, rt.TopicID = "standby", created.ID
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = batch
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, direct)
		if err != nil || resp.Topics[0].Partitions[0].ErrorCode != 0 {
			t.Fatalf("produce: %v %+v", err, resp)
		}
		return resp.Topics[0].Partitions[0].BaseOffset
	}
	real := func(key string) {
		if err := direct.ProduceSync(ctx, &kgo.Record{Topic: "standby", Key: []byte(key), Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	real("a")                                                                                   // offset 0
	produceRaw(protocol.AppendFillerBatch(nil, 3, pid.ProducerID, pid.ProducerEpoch, 0, false)) // 1..3
	real("b")                                                                                   // offset 4
	produceRaw(protocol.AppendFillerBatch(nil, 2, pid.ProducerID, pid.ProducerEpoch, 3, false)) // 5..6, last in the log

	cons := newClient(t, addr, kgo.ConsumeTopics("standby"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	for len(got) < 2 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %v through Ferry, want a and b", got)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == string(protocol.FillerKey) {
				t.Fatalf("a filler record reached the client at offset %d", r.Offset)
			}
			got = append(got, fmt.Sprintf("%s@%d", r.Key, r.Offset))
		})
	}
	if got[0] != "a@0" || got[1] != "b@4" {
		t.Fatalf("read %v, want [a@0 b@4]", got)
	}
	// The reader moved past the trailing fillers: a new record is next.
	real("c")
	for {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("the reader stalled before the fillers")
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) != "c" || r.Offset != 7 {
				t.Fatalf("read %s@%d, want c@7", r.Key, r.Offset)
			}
			done = true
		})
		if done {
			return
		}
	}
}

// TestLeaderMoveFollowedWithoutClientMetadata moves a partition's leader
// under a producer. Clients following the KIP-951 leader hint do not ask
// for metadata, so Ferry must notice the move from the broker's
// NOT_LEADER answer itself; with its periodic refresh set to ten minutes,
// only that keeps the producer from stalling. A record that stalls waits
// for that refresh; one that is merely slow on a busy machine takes a
// second or two: the bound on each record tells them apart whatever the
// machine's speed.
func TestLeaderMoveFollowedWithoutClientMetadata(t *testing.T) {
	kf := newKfake(t, 3)
	_, addr := startFerry(t, kf.ListenAddrs(), WithMetadataInterval(10*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := kadm.NewClient(newClient(t, addr)).CreateTopic(ctx, 1, 1, nil, "moves"); err != nil {
		t.Fatal(err)
	}
	prod := newClient(t, addr, kgo.DefaultProduceTopic("moves"))
	const stall = 15 * time.Second
	for i := 0; i < 600; i++ {
		if i%100 == 50 {
			next := (kf.LeaderFor("moves", 0) + 1) % 3
			if err := kf.MoveTopicPartition("moves", 0, next); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if d := time.Since(start); d > stall {
			t.Fatalf("record %d took %v: Ferry did not follow the leader's move", i, d)
		}
	}
	if o := endOffset(t, kf, "moves"); o != 600 {
		t.Fatalf("end offset %d, want 600: every record once", o)
	}
}

// TestDeleteRecordsAndOffsetsThroughFerry: DeleteRecords and ListOffsets
// split over three leaders give each partition its own answer.
func TestDeleteRecordsAndOffsetsThroughFerry(t *testing.T) {
	kf := newKfake(t, 3)
	_, addr := startFerry(t, kf.ListenAddrs(), WithLanes(1), WithRequestPolicy([]string{"records_delete"}, nil)) // one lane: every request splits
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, addr))
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, "trim"); err != nil {
		t.Fatal(err)
	}
	prod := newClient(t, addr, kgo.DefaultProduceTopic("trim"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := int32(0); p < 3; p++ {
		for i := 0; i < 10; i++ {
			if err := prod.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := adm.DeleteRecords(ctx, kadm.Offsets{"trim": {0: {At: 3}, 1: {At: 5}, 2: {At: 7}}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{0: 3, 1: 5, 2: 7}
	res.Each(func(r kadm.DeleteRecordsResponse) {
		if r.Err != nil || r.LowWatermark != want[r.Partition] {
			t.Fatalf("partition %d: low watermark %d err %v, want %d", r.Partition, r.LowWatermark, r.Err, want[r.Partition])
		}
	})
	starts, err := adm.ListStartOffsets(ctx, "trim")
	if err != nil {
		t.Fatal(err)
	}
	starts.Each(func(o kadm.ListedOffset) {
		if o.Err != nil || o.Offset != want[o.Partition] {
			t.Fatalf("partition %d: start offset %d err %v, want %d", o.Partition, o.Offset, o.Err, want[o.Partition])
		}
	})
	ends, err := adm.ListEndOffsets(ctx, "trim")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil || o.Offset != 10 {
			t.Fatalf("partition %d: end offset %d err %v, want 10", o.Partition, o.Offset, o.Err)
		}
	})
}

// TestOffsetForLeaderEpochUnderGeneration: under generation 2 the epochs
// a client sends are virtual; Ferry maps them back and answers with
// virtual ones. An epoch of an older generation is answered from the end
// recorded when that generation ended (or, with none recorded for it, from
// a later generation's, or the current end), never fenced: a consumer
// validating its position after a switch must not loop. An epoch of a
// newer generation is UNKNOWN_LEADER_EPOCH.
func TestOffsetForLeaderEpochUnderGeneration(t *testing.T) {
	kf := newKfake(t, 3)
	const gen = 3
	st := routing.State{Generation: gen, Active: "a", Fences: []routing.Fence{
		{Generation: 0, Ends: map[string][]int64{"epochs": {2}}},
		{Generation: 2, Ends: map[string][]int64{"other": {9}}},
	}}
	_, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(routing.NewTable(st)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr)
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "epochs"); err != nil {
		t.Fatal(err)
	}
	prod := newClient(t, addr, kgo.DefaultProduceTopic("epochs"))
	for i := 0; i < 5; i++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	md, err := adm.Metadata(ctx, "epochs")
	if err != nil {
		t.Fatal(err)
	}
	epoch := md.Topics["epochs"].Partitions[0].LeaderEpoch
	if routing.EpochGeneration(epoch) != gen {
		t.Fatalf("metadata epoch %d is not of generation %d", epoch, gen)
	}
	ask := func(leaderEpoch int32) kmsg.OffsetForLeaderEpochResponseTopicPartition {
		req := kmsg.NewPtrOffsetForLeaderEpochRequest()
		rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
		rt.Topic = "epochs"
		rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
		rp.Partition, rp.CurrentLeaderEpoch, rp.LeaderEpoch = 0, epoch, leaderEpoch
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Topics[0].Partitions[0]
	}
	p := ask(epoch)
	if p.ErrorCode != 0 || p.EndOffset != 5 || p.LeaderEpoch != epoch {
		t.Fatalf("current epoch: error %d end %d epoch %d; want 0, 5, %d", p.ErrorCode, p.EndOffset, p.LeaderEpoch, epoch)
	}
	for _, tc := range []struct {
		name   string
		epoch  int32
		code   int16
		end    int64
		echoed bool
	}{
		{"generation 0, recorded end", routing.VirtualEpoch(0, 7), 0, 2, true},
		{"generation 1, none recorded for it or later: the current end", routing.VirtualEpoch(1, 0), 0, 5, false},
		{"generation 2, nothing recorded: the current end", routing.VirtualEpoch(2, 4), 0, 5, false},
		{"a newer generation", routing.VirtualEpoch(gen+1, 0), kerr.UnknownLeaderEpoch.Code, -1, false},
	} {
		p := ask(tc.epoch)
		if p.ErrorCode != tc.code || p.EndOffset != tc.end {
			t.Errorf("%s: error %d end %d; want %d, %d", tc.name, p.ErrorCode, p.EndOffset, tc.code, tc.end)
		}
		if tc.echoed && p.LeaderEpoch != tc.epoch {
			t.Errorf("%s: epoch %d, want the client's %d echoed", tc.name, p.LeaderEpoch, tc.epoch)
		}
		if tc.code == 0 && p.LeaderEpoch < tc.epoch {
			t.Errorf("%s: epoch %d is below the client's %d: it would see a truncation", tc.name, p.LeaderEpoch, tc.epoch)
		}
	}
}
