package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// rawFetch fetches partition 0 of topic from offset at addr with one
// Fetch request and returns its records.
func rawFetch(t *testing.T, ctx context.Context, cl *kgo.Client, topic string, offset int64, epoch int32) kmsg.FetchResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis, req.MaxBytes = 100, 50<<20
	req.Topics = []kmsg.FetchRequestTopic{{Topic: topic, Partitions: []kmsg.FetchRequestTopicPartition{
		{Partition: 0, FetchOffset: offset, PartitionMaxBytes: 8 << 20, CurrentLeaderEpoch: epoch, LastFetchedEpoch: -1, LogStartOffset: -1}}}}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 || resp.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("fetch answer %+v", resp)
	}
	return resp.Topics[0].Partitions[0]
}

// TestStreamedFetchUnderGeneration2: after two switches a consumer reading
// megabytes through Ferry gets every record at its offset, byte for byte,
// with the answers streamed; a raw fetch shows each batch exactly as the
// broker holds it but for its partition leader epoch, which is the
// virtual one of generation 2.
func TestStreamedFetchUnderGeneration2(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "big"))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	prod := newClient(t, kf.ListenAddrs()[0], kgo.DefaultProduceTopic("big"), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(256<<10))
	const n = 500 // 8 KiB each: 4 MB
	for i := range n {
		prod.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: bytes.Repeat([]byte{byte(i), byte(i >> 8), 7}, 8<<10/3)}, nil)
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	direct := readAll(t, ctx, kf.ListenAddrs()[0], n, nil)

	const gen = 2
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(routing.NewTable(routing.State{Generation: gen, Active: "a"})),
		WithClusters(upstream.Config{Name: "a", Bootstrap: kf.ListenAddrs(), MirrorTarget: true}))
	got := readAll(t, ctx, addr, n, nil)
	for k, d := range direct {
		r := got[k]
		if r == nil {
			t.Fatalf("record %s missing through Ferry", k)
		}
		if r.Offset != d.Offset || !bytes.Equal(r.Value, d.Value) || r.LeaderEpoch != routing.VirtualEpoch(gen, d.LeaderEpoch) {
			t.Fatalf("record %s through Ferry at %d epoch %d (value equal %v), directly at %d epoch %d", k, r.Offset, r.LeaderEpoch, bytes.Equal(r.Value, d.Value), d.Offset, d.LeaderEpoch)
		}
	}
	waitCounter(t, s.metrics.splicedBytes, 1<<20, 5*time.Second, fmt.Sprintf("record bytes spliced under generation %d", gen))
	streamed := testutil.ToFloat64(s.metrics.streamed)
	if streamed == 0 {
		t.Fatal("no answer was streamed")
	}

	// One answer, compared batch by batch with the broker's.
	v12 := kversion.Stable()
	v12.SetMaxKeyVersion(1, 12) // topics by name
	dcl, fcl := newClient(t, kf.ListenAddrs()[0], kgo.MaxVersions(v12)), newClient(t, addr, kgo.MaxVersions(v12))
	want := rawFetch(t, ctx, dcl, "big", 0, -1).RecordBatches
	gotp := rawFetch(t, ctx, fcl, "big", 0, routing.VirtualEpoch(gen, 0))
	if testutil.ToFloat64(s.metrics.streamed) == streamed || len(gotp.RecordBatches) < upstream.StreamMinBytes {
		t.Fatalf("the raw fetch was not streamed (%d record bytes)", len(gotp.RecordBatches))
	}
	if len(gotp.RecordBatches) != len(want) {
		t.Fatalf("%d record bytes through Ferry, %d directly", len(gotp.RecordBatches), len(want))
	}
	batches := 0
	for rest, frest := want, gotp.RecordBatches; len(rest) > 0; batches++ {
		b, r, err := protocol.ParseBatch(rest)
		if err != nil {
			break // a trailing partial batch
		}
		fb := protocol.Batch(frest[:len(b)])
		if fb.PartitionLeaderEpoch() != routing.VirtualEpoch(gen, b.PartitionLeaderEpoch()) || b.PartitionLeaderEpoch() < 0 {
			t.Fatalf("batch at %d: leader epoch %d through Ferry, %d on the broker", b.BaseOffset(), fb.PartitionLeaderEpoch(), b.PartitionLeaderEpoch())
		}
		if !bytes.Equal(fb[:12], b[:12]) || !bytes.Equal(fb[16:], b[16:]) {
			t.Fatalf("batch at %d differs from the broker's beyond its leader epoch", b.BaseOffset())
		}
		rest, frest = r, frest[len(b):]
	}
	if batches < 4 {
		t.Fatalf("%d batches compared", batches)
	}
}

// TestFillersHiddenInEveryPath: filler batches in a log read through Ferry
// (a cluster the mirror wrote into) never reach a client, whether the
// answer is streamed, read whole and rewritten in place, or merged from
// two brokers; the real records arrive at their offsets and the reader
// steps over the fillers' offsets.
func TestFillersHiddenInEveryPath(t *testing.T) {
	kf := newKfake(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	direct := newClient(t, kf.ListenAddrs()[0])
	created, err := kadm.NewClient(direct).CreateTopic(ctx, 2, 1, nil, "mirrored")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := (&kmsg.InitProducerIDRequest{TransactionTimeoutMillis: 60000, ProducerID: -1, ProducerEpoch: -1}).RequestWith(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	// Leaders on two brokers, for the merged case.
	if l := kf.LeaderFor("mirrored", 0); kf.LeaderFor("mirrored", 1) == l {
		if err := kf.MoveTopicPartition("mirrored", 1, 1-l); err != nil {
			t.Fatal(err)
		}
	}
	seq := map[int32]int32{}
	filler := func(p int32, n int32) {
		req := kmsg.NewPtrProduceRequest()
		req.Acks, req.TimeoutMillis = -1, 5000
		rt := kmsg.ProduceRequestTopic{Topic: "mirrored", TopicID: created.ID}
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition, rp.Records = p, protocol.AppendFillerBatch(nil, n, pid.ProducerID, pid.ProducerEpoch, seq[p], false)
		seq[p] += n
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		kr, err := direct.Broker(int(kf.LeaderFor("mirrored", p))).Request(ctx, req)
		if err != nil || kr.(*kmsg.ProduceResponse).Topics[0].Partitions[0].ErrorCode != 0 {
			t.Fatalf("produce: %v %+v", err, kr)
		}
	}
	value := func(p int32, i int) []byte { return bytes.Repeat([]byte{byte(p), byte(i)}, 4<<10) }
	real := func(p int32, from, to int) {
		for i := from; i < to; i++ {
			direct.Produce(ctx, &kgo.Record{Topic: "mirrored", Partition: p, Key: []byte(fmt.Sprintf("%d-%d", p, i)), Value: value(p, i)}, nil)
		}
		if err := direct.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Each partition: 40 records of 8 KiB (enough for a streamed answer),
	// 3 fillers, 40 more, and 2 fillers last in the log: 85 offsets.
	direct = newClient(t, kf.ListenAddrs()[0], kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchCompression(kgo.NoCompression()))
	for p := range int32(2) {
		real(p, 0, 40)
		filler(p, 3)
		real(p, 43, 83)
		filler(p, 2)
	}

	next := 85 // partition 0's next offset; each case writes one record there
	for _, tc := range []struct {
		name   string
		gen    uint32
		splice bool
		lanes  int
	}{{"streamed", 0, true, 0}, {"streamed-gen3", 3, true, 0}, {"in-place", 0, false, 0}, {"merged-gen1", 1, true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []Option{WithClusters(upstream.Config{Name: "a", Bootstrap: kf.ListenAddrs(), MirrorTarget: true}), WithSpliceFetches(tc.splice),
				WithRoutingTable(routing.NewTable(routing.State{Generation: tc.gen, Active: "a"}))}
			if tc.lanes > 0 {
				opts = append(opts, WithLanes(tc.lanes)) // one lane: a fetch of both partitions is split
			}
			s, addr := startFerry(t, kf.ListenAddrs(), opts...)
			cons := newClient(t, addr, kgo.ConsumeTopics("mirrored"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(4<<20))
			got := map[string]int64{}
			for len(got) < 2*80 {
				fs := cons.PollFetches(ctx)
				if ctx.Err() != nil {
					t.Fatalf("read %d of %d records through Ferry", len(got), 2*80)
				}
				fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
				fs.EachRecord(func(r *kgo.Record) {
					var p int32
					var i int
					fmt.Sscanf(string(r.Key), "%d-%d", &p, &i)
					if string(r.Key) == string(protocol.FillerKey) || r.Offset != int64(i) || !bytes.Equal(r.Value, value(p, i)) {
						t.Fatalf("read %q at %d/%d", r.Key, r.Partition, r.Offset)
					}
					if r.LeaderEpoch>>routing.EpochBits != int32(tc.gen) {
						t.Fatalf("leader epoch %d under generation %d", r.LeaderEpoch, tc.gen)
					}
					if i < 85 {
						got[string(r.Key)] = r.Offset
					}
				})
			}
			if hidden := testutil.ToFloat64(s.metrics.fillersHidden); hidden < 4 {
				t.Fatalf("%.0f fillers hidden, want 4 or more", hidden)
			}
			streamed := testutil.ToFloat64(s.metrics.streamed)
			// Streamed only where one broker answers a whole fetch. With
			// one lane the consumer's first fetch names both partitions
			// and is split and merged; a later one may name only the
			// partition whose records it has used up, go to one broker
			// and be streamed, so only the other cases are asserted.
			if want := tc.splice && tc.lanes == 0; tc.lanes == 0 && want != (streamed > 0) {
				t.Fatalf("%.0f answers streamed", streamed)
			}
			// The reader stepped over the trailing fillers (the first
			// case): a new record is next.
			real(0, next, next+1)
			for {
				fs := cons.PollFetches(ctx)
				if ctx.Err() != nil {
					t.Fatal("the reader stalled before the fillers")
				}
				done := false
				fs.EachRecord(func(r *kgo.Record) {
					if r.Offset == int64(next) && string(r.Key) == fmt.Sprintf("0-%d", next) {
						done = true
					} else if r.Offset >= 85 {
						t.Fatalf("read %s at %d, want 0-%d at %d", r.Key, r.Offset, next, next)
					}
				})
				if done {
					break
				}
			}
			cons.Close()
			next++
		})
	}
}

// TestStreamedAnswerIdentityUnderGeneration: a streamed answer carrying a
// diverging epoch and a KIP-951 leader hint under generation 2 has both
// epochs made virtual in the stream, the hint naming a broker of Ferry's,
// and each batch's leader epoch virtual; without streaming, the same.
func TestStreamedAnswerIdentityUnderGeneration(t *testing.T) {
	// A batch large enough to stream: a filler-shaped batch that is no
	// filler (no producer ID), leader epoch 4.
	batch := protocol.Batch(protocol.AppendFillerBatch(nil, 12000, 0, 0, 0, false))
	batch.SetProducer(-1, -1, -1)
	batch.SetPartitionLeaderEpoch(4)
	batch.UpdateCRC()
	for _, splice := range []bool{true, false} {
		t.Run(fmt.Sprint("splice=", splice), func(t *testing.T) {
			kf := newKfake(t, 1, kfake.SeedTopics(2, "hinted"))
			const gen = 2
			s, addr := startFerry(t, kf.ListenAddrs(), WithLanes(3), WithSpliceFetches(splice),
				WithRoutingTable(routing.NewTable(routing.State{Generation: gen, Active: "a"})))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			kf.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
				kf.KeepControl()
				req := kr.(*kmsg.FetchRequest)
				resp := req.ResponseKind().(*kmsg.FetchResponse)
				resp.SetVersion(req.Version)
				rt := kmsg.FetchResponseTopic{Topic: "hinted", TopicID: req.Topics[0].TopicID}
				p0 := kmsg.NewFetchResponseTopicPartition()
				p0.Partition, p0.HighWatermark, p0.LastStableOffset, p0.RecordBatches = 0, 12000, 12000, batch
				p0.DivergingEpoch.EndOffset, p0.DivergingEpoch.Epoch = 10, 3
				p1 := kmsg.NewFetchResponseTopicPartition()
				p1.Partition, p1.ErrorCode = 1, 6 // NOT_LEADER_OR_FOLLOWER
				p1.CurrentLeader.LeaderID, p1.CurrentLeader.LeaderEpoch = 0, 7
				rt.Partitions = []kmsg.FetchResponseTopicPartition{p0, p1}
				resp.Topics = []kmsg.FetchResponseTopic{rt}
				return resp, nil, true
			})
			cl := newClient(t, addr)
			md := kmsg.NewPtrMetadataRequest()
			md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr("hinted")}}
			vmd, err := md.RequestWith(ctx, cl)
			if err != nil || len(vmd.Topics) != 1 {
				t.Fatalf("metadata: %v", err)
			}
			req := kmsg.NewPtrFetchRequest()
			req.MaxWaitMillis, req.MaxBytes = 100, 50<<20
			req.Topics = []kmsg.FetchRequestTopic{{Topic: "hinted", TopicID: vmd.Topics[0].TopicID, Partitions: []kmsg.FetchRequestTopicPartition{
				{Partition: 0, FetchOffset: 0, PartitionMaxBytes: 1 << 20, CurrentLeaderEpoch: -1, LastFetchedEpoch: -1, LogStartOffset: -1},
				{Partition: 1, FetchOffset: 0, PartitionMaxBytes: 1 << 20, CurrentLeaderEpoch: -1, LastFetchedEpoch: -1, LogStartOffset: -1},
			}}}
			resp, err := req.RequestWith(ctx, cl)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Version < 16 {
				t.Fatalf("fetched at v%d; leader hints need v16+", resp.Version)
			}
			if streamed := testutil.ToFloat64(s.metrics.streamed); (streamed > 0) != splice {
				t.Fatalf("%.0f answers streamed with splice %v", streamed, splice)
			}
			p0, p1 := resp.Topics[0].Partitions[0], resp.Topics[0].Partitions[1]
			if p0.DivergingEpoch.Epoch != routing.VirtualEpoch(gen, 3) || p0.DivergingEpoch.EndOffset != 10 {
				t.Fatalf("diverging epoch %+v, want epoch %d", p0.DivergingEpoch, routing.VirtualEpoch(gen, 3))
			}
			if p1.CurrentLeader.LeaderEpoch != routing.VirtualEpoch(gen, 7) || p1.CurrentLeader.LeaderID != s.virtualLeader(s.cluster("a"), "hinted", 1, 0) {
				t.Fatalf("leader hint %+v, want epoch %d on a broker of Ferry's", p1.CurrentLeader, routing.VirtualEpoch(gen, 7))
			}
			got := protocol.Batch(p0.RecordBatches)
			if len(got) != len(batch) || got.PartitionLeaderEpoch() != routing.VirtualEpoch(gen, 4) || !bytes.Equal(got[16:], batch[16:]) {
				t.Fatalf("batch of %d bytes (sent %d), leader epoch %d", len(got), len(batch), got.PartitionLeaderEpoch())
			}
			if binary.BigEndian.Uint32(got[12:]) == 4 {
				t.Fatal("leader epoch unchanged")
			}
		})
	}
}
