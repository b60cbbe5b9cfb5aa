package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
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
			// The counter moves after the bytes do; a client that has
			// them all may be a moment ahead of it.
			spliced := testutil.ToFloat64(s.metrics.splicedBytes)
			if tc.splice {
				spliced = waitCounter(t, s.metrics.splicedBytes, 4<<20, 5*time.Second, "record bytes spliced (of about 6.4 MB)")
			}
			t.Logf("%.0f record bytes spliced", spliced)
			if !tc.splice && spliced != 0 {
				t.Fatalf("%.0f bytes spliced with splicing off", spliced)
			}
			if streamed := testutil.ToFloat64(s.metrics.streamed); (streamed > 0) != tc.splice {
				t.Fatalf("%.0f answers streamed with splicing %v", streamed, tc.splice)
			}
		})
	}
}

// waitCounter waits until c reaches min and returns the value it reached,
// failing the test (naming what c counts and its last value) if it has not
// within d.
func waitCounter(t testing.TB, c prometheus.Counter, min float64, d time.Duration, what string) float64 {
	t.Helper()
	var v float64
	testwait.Eventually(t, d, fmt.Sprintf("%s to reach %v", what, min), func() error {
		if v = testutil.ToFloat64(c); v < min {
			return fmt.Errorf("%v", v)
		}
		return nil
	})
	return v
}

// readAll consumes n records of topic (default "big") from the start, by
// key.
func readAll(t *testing.T, ctx context.Context, addr string, n int, versions *kversion.Versions, topic ...string) map[string]*kgo.Record {
	t.Helper()
	opts := []kgo.Opt{kgo.ConsumeTopics(append(topic, "big")[0]), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(4 << 20)}
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

// TestStreamedAnswerWithLeaderHints: a large answer that also carries a
// KIP-951 leader hint and node endpoints (a partition moved while another
// still streams records) reaches the client streamed, its records byte for
// byte, the topic ID virtual, the hint naming a broker of Ferry's, and the
// physical endpoints gone (zeroed under an unknown tag, same size).
func TestStreamedAnswerWithLeaderHints(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(2, "hinted"))
	s, addr := startFerry(t, kf.ListenAddrs(), WithLanes(3))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr)

	physID := topicID(t, ctx, newClient(t, kf.ListenAddrs()[0]))
	md := kmsg.NewPtrMetadataRequest()
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr("hinted")}}
	vmd, err := md.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	virtID := vmd.Topics[0].TopicID
	ferryBrokers := map[int32]bool{}
	for _, b := range vmd.Brokers {
		ferryBrokers[b.NodeID] = true
	}

	// Records are opaque to Ferry's stream and to kmsg alike.
	records := make([]byte, 512<<10)
	for i := range records {
		records[i] = byte(i * 7)
	}
	kf.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		resp.SetVersion(req.Version)
		rt := kmsg.FetchResponseTopic{Topic: "hinted", TopicID: physID}
		p0 := kmsg.NewFetchResponseTopicPartition()
		p0.Partition, p0.HighWatermark, p0.LastStableOffset, p0.RecordBatches = 0, 1000, 1000, records
		p1 := kmsg.NewFetchResponseTopicPartition()
		p1.Partition, p1.ErrorCode = 1, kerr.NotLeaderForPartition.Code
		p1.CurrentLeader.LeaderID, p1.CurrentLeader.LeaderEpoch = 5, 7
		rt.Partitions = []kmsg.FetchResponseTopicPartition{p0, p1}
		resp.Topics = []kmsg.FetchResponseTopic{rt}
		resp.Brokers = []kmsg.FetchResponseBroker{{NodeID: 5, Host: "kafka-physical-5", Port: 9092}}
		return resp, nil, true
	})

	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis, req.MaxBytes = 100, 50<<20
	req.Topics = []kmsg.FetchRequestTopic{{Topic: "hinted", TopicID: virtID, Partitions: []kmsg.FetchRequestTopicPartition{
		{Partition: 0, FetchOffset: 0, PartitionMaxBytes: 1 << 20, CurrentLeaderEpoch: -1, LastFetchedEpoch: -1, LogStartOffset: -1},
		{Partition: 1, FetchOffset: 0, PartitionMaxBytes: 1 << 20, CurrentLeaderEpoch: -1, LastFetchedEpoch: -1, LogStartOffset: -1},
	}}}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Version < 16 {
		t.Fatalf("fetched at v%d; node endpoints need v16+", resp.Version)
	}
	waitCounter(t, s.metrics.splicedBytes, 1, 5*time.Second, "record bytes spliced (the answer streamed)")
	if len(resp.Topics) != 1 || resp.Topics[0].TopicID != virtID || len(resp.Topics[0].Partitions) != 2 {
		t.Fatalf("topics %+v", resp.Topics)
	}
	p0, p1 := resp.Topics[0].Partitions[0], resp.Topics[0].Partitions[1]
	if !bytes.Equal(p0.RecordBatches, records) || p0.HighWatermark != 1000 {
		t.Fatalf("partition 0: %d record bytes, high watermark %d", len(p0.RecordBatches), p0.HighWatermark)
	}
	if p1.ErrorCode != kerr.NotLeaderForPartition.Code || p1.CurrentLeader.LeaderID == 5 || !ferryBrokers[p1.CurrentLeader.LeaderID] || p1.CurrentLeader.LeaderEpoch != 7 {
		t.Fatalf("partition 1: error %d, leader hint %+v (Ferry's brokers %v)", p1.ErrorCode, p1.CurrentLeader, ferryBrokers)
	}
	if len(resp.Brokers) != 0 {
		t.Fatalf("physical endpoints reached the client: %+v", resp.Brokers)
	}
	padded := false
	resp.UnknownTags.Each(func(tag uint32, v []byte) {
		padded = tag == protocol.FetchPaddingTag && !bytes.Contains(v, []byte("kafka-physical"))
	})
	if !padded {
		t.Fatal("no zeroed padding tag where the node endpoints were")
	}
}

// topicID returns the ID of topic "hinted" as cl's cluster knows it.
func topicID(t *testing.T, ctx context.Context, cl *kgo.Client) [16]byte {
	t.Helper()
	md := kmsg.NewPtrMetadataRequest()
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr("hinted")}}
	resp, err := md.RequestWith(ctx, cl)
	if err != nil || len(resp.Topics) != 1 {
		t.Fatalf("metadata: %v", err)
	}
	return resp.Topics[0].TopicID
}

// TestClientGoneMidStream: a client that closes its connection while a
// large answer is being streamed to it loses only that connection: the
// broker connection the answer was on is closed rather than reused half
// read, and the next client reads every record.
func TestClientGoneMidStream(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "big"))
	s, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prod := newClient(t, kf.ListenAddrs()[0], kgo.DefaultProduceTopic("big"), kgo.ProducerBatchCompression(kgo.NoCompression()))
	const n = 400
	for i := range n {
		prod.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: bytes.Repeat([]byte{byte(i)}, 8<<10)}, nil)
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	for range 3 {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		req := kmsg.NewPtrFetchRequest()
		req.Version, req.MaxWaitMillis, req.MaxBytes = 12, 100, 50<<20
		req.Topics = []kmsg.FetchRequestTopic{{Topic: "big", Partitions: []kmsg.FetchRequestTopicPartition{
			{Partition: 0, FetchOffset: 0, PartitionMaxBytes: 8 << 20, CurrentLeaderEpoch: -1, LastFetchedEpoch: -1, LogStartOffset: -1}}}}
		if _, err := conn.Write(kmsg.NewRequestFormatter(kmsg.FormatterClientID("gone")).AppendRequest(nil, req, 1)); err != nil {
			t.Fatal(err)
		}
		// Read the start of the answer, then leave.
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		head := make([]byte, 64<<10)
		if _, err := io.ReadFull(conn, head); err != nil {
			t.Fatalf("reading the start of the answer: %v", err)
		}
		if size := binary.BigEndian.Uint32(head); size < 1<<20 {
			t.Fatalf("answer of %d bytes; the test needs one large enough to stream", size)
		}
		conn.Close()
	}
	// Each of the three answers was being streamed when its client left
	// (counted once the stream ends).
	waitCounter(t, s.metrics.streamed, 3, 5*time.Second, "answers streamed (the 3 the clients left)")

	got := readAll(t, ctx, addr, n, nil, "big")
	for i := range n {
		r := got[fmt.Sprintf("k%d", i)]
		if r == nil || r.Offset != int64(i) || !bytes.Equal(r.Value, bytes.Repeat([]byte{byte(i)}, 8<<10)) {
			t.Fatalf("record k%d after clients left mid-stream: %v", i, r)
		}
	}
}
