package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// randomValue is n bytes that no codec shrinks, different for each seed.
func randomValue(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)})
	r.Read(b)
	return b
}

// splicedBytes is ferry_produce_spliced_bytes_total{to}.
func splicedBytes(s *Server, to string) float64 {
	return testutil.ToFloat64(s.metrics.produceSpliced.WithLabelValues(to))
}

// TestProduceSplicedRecordsArriveIntact: an idempotent producer's large
// batches through Ferry reach the cluster as sent, every record at the
// offset it was acknowledged at, whether they went from the client's
// socket to the broker's through a pipe (a lane per broker: one leader per
// request), also under a generation after a switch, where each batch's
// producer ID is mapped to the physical one in its header and its CRC
// patched without the body (the broker checks it), were read back into
// Ferry from the pipe because the request was split between two leaders
// (one lane), or were never spliced (splice_produces off).
func TestProduceSplicedRecordsArriveIntact(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lanes  int
		gen    uint32
		splice bool
	}{{"a lane per broker", 3, 0, true}, {"generation 3", 3, 3, true}, {"one lane, split", 1, 0, true}, {"off", 3, 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			kf := newKfake(t, 3)
			s, addr := startFerry(t, kf.ListenAddrs(), WithLanes(tc.lanes), WithSpliceProduces(tc.splice),
				WithRoutingTable(routing.NewTable(routing.State{Generation: tc.gen, Active: "a"})))
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			if _, err := kadm.NewClient(newClient(t, kf.ListenAddrs()[0])).CreateTopic(ctx, 3, 1, nil, "big"); err != nil {
				t.Fatal(err)
			}
			// A leader on each broker, so that a request on one lane
			// names partitions of several.
			for p := range int32(3) {
				if kf.LeaderFor("big", p) != p {
					if err := kf.MoveTopicPartition("big", p, p); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Requests under spliceAllocMax (three batches of at
			// most 256 KiB): larger ones are spliced only into a
			// buffer kept from one before.
			prod := newClient(t, addr, kgo.DefaultProduceTopic("big"), kgo.ProducerBatchCompression(kgo.NoCompression()),
				kgo.ProducerLinger(20*time.Millisecond), kgo.ProducerBatchMaxBytes(256<<10))
			const n, size = 400, 20 << 10
			want := make([]*kgo.Record, n)
			for i := range want {
				want[i] = &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: randomValue(uint64(i), size)}
				prod.Produce(ctx, want[i], func(_ *kgo.Record, err error) {
					if err != nil {
						t.Errorf("record %d: %v", i, err)
					}
				})
			}
			if err := prod.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			virt, _, err := prod.ProducerID(ctx)
			if err != nil {
				t.Fatal(err)
			}
			phys := virt // generation 0's IDs are the cluster's
			if tc.gen != 0 {
				var ok bool
				if phys, ok = routing.PhysicalPID(tc.gen, virt); !ok || phys == virt {
					t.Fatalf("producer ID %d is not one of generation %d", virt, tc.gen)
				}
			}

			// Read from the cluster itself.
			cons := newClient(t, kf.ListenAddrs()[0], kgo.ConsumeTopics("big"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			for got := 0; got < n; {
				fs := cons.PollFetches(ctx)
				if ctx.Err() != nil {
					t.Fatalf("read %d of %d records from the cluster", got, n)
				}
				fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
				fs.EachRecord(func(r *kgo.Record) {
					var i int
					fmt.Sscan(string(r.Key), &i)
					w := want[i]
					if r.Partition != w.Partition || r.Offset != w.Offset || string(r.Value) != string(w.Value) {
						t.Fatalf("record %d at %d/%d (%d bytes), acknowledged at %d/%d", i, r.Partition, r.Offset, len(r.Value), w.Partition, w.Offset)
					}
					if r.ProducerID != phys {
						t.Fatalf("record %d written by producer ID %d, want the physical %d (the client's %d)", i, r.ProducerID, phys, virt)
					}
					got++
				})
			}

			// Every frame's charge given back, spliced or not.
			testwait.Eventually(t, 10*time.Second, "ferry_buffered_bytes back to 0", func() error {
				if n := testutil.ToFloat64(s.metrics.buffered); n != 0 {
					return fmt.Errorf("%v bytes still charged", n)
				}
				return nil
			})
			toBroker, toFerry := splicedBytes(s, "broker"), splicedBytes(s, "ferry")
			t.Logf("spliced to the broker %.0f bytes, read back %.0f, of %d", toBroker, toFerry, n*size)
			switch {
			case !tc.splice && toBroker+toFerry != 0:
				t.Fatalf("splice_produces off, yet %.0f bytes were spliced", toBroker+toFerry)
			case tc.splice && tc.lanes == 3 && (toBroker < 1<<20 || toFerry != 0):
				t.Fatalf("one leader a request: %.0f bytes spliced to the broker, %.0f read back", toBroker, toFerry)
			case tc.splice && tc.lanes == 1 && toFerry == 0:
				t.Fatal("requests split between leaders, yet nothing was read back from a pipe")
			}
		})
	}
}

// TestProduceSplicedHeldThroughASwitch: a large Produce read at
// generation 0, its batches into a pipe, and held by a switch's drain goes
// out from the pipe under the generation after it, and the records written
// are those sent.
func TestProduceSplicedHeldThroughASwitch(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	table := routing.NewTable(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseServing})
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(table))
	c := dialRaw(t, addr)

	values := func(round int) []string {
		vs := make([]string, 8)
		for i := range vs {
			vs[i] = string(randomValue(uint64(round*100+i), 20<<10))
		}
		return vs
	}
	produce := func(vs []string) *kmsg.ProduceRequest {
		req := oneRecordProduce("t")
		req.Topics[0].Partitions[0].Records = batchOf(-1, -1, -1, false, nil, vs)
		return req
	}
	// Two at generation 0, through a pipe.
	for round := range 2 {
		if p := rawCall(t, c, produce(values(round)), int32(round+1)).(*kmsg.ProduceResponse).Topics[0].Partitions[0]; p.ErrorCode != 0 {
			t.Fatalf("produce %d: %v", round, kerr.ErrorForCode(p.ErrorCode))
		}
	}
	if splicedBytes(s, "broker") < 100<<10 {
		t.Fatalf("%.0f bytes spliced to the broker at generation 0", splicedBytes(s, "broker"))
	}

	before := splicedBytes(s, "broker")
	table.Update(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseDraining})
	held := values(2)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	writeReq(t, c, produce(held), 3)
	testwait.Eventually(t, 10*time.Second, "the produce held", func() error {
		if n := testutil.ToFloat64(s.metrics.held); n != 1 {
			return fmt.Errorf("%v held", n)
		}
		return nil
	})
	table.Update(routing.State{Generation: 1, Active: "a", Phase: routing.PhaseServing})
	if p := decodeAnswer(t, produce(held), readResp(t, c)).(*kmsg.ProduceResponse).Topics[0].Partitions[0]; p.ErrorCode != 0 || p.BaseOffset != 16 {
		t.Fatalf("the held produce: %v at %d, want offset 16", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if moved, back := splicedBytes(s, "broker")-before, splicedBytes(s, "ferry"); moved < 100<<10 || back != 0 {
		t.Fatalf("the held request: %.0f bytes spliced to the broker, %.0f read back", moved, back)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons := newClient(t, kf.ListenAddrs()[0], kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().At(16)))
	for got := 0; got < len(held); {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of the held produce's %d records", got, len(held))
		}
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Value) != held[r.Offset-16] {
				t.Fatalf("record at offset %d is not the one sent", r.Offset)
			}
			got++
		})
	}
}

// TestProduceAnswerAsIs: a clean answer from the one broker a Produce went
// to reaches the client as the broker's bytes, its correlation ID the
// client's and (v13) its topic IDs the client's, nothing rebuilt; an answer
// with an error, or naming a topic ID the request did not send, is left to
// the path that decodes and rebuilds it.
func TestProduceAnswerAsIs(t *testing.T) {
	s := &Server{}
	virt, phys := [16]byte{1, 1, 1}, [16]byte{2, 2, 2}
	for _, v := range []int16{7, 12, 13} {
		in := kmsg.NewPtrProduceRequest()
		in.Version = v
		in.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", TopicID: virt, Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0}, {Partition: 1}}}}
		answer := func(code int16, id [16]byte) *upstream.Pending {
			resp := kmsg.NewPtrProduceResponse()
			resp.Version = v
			rt := kmsg.ProduceResponseTopic{Topic: "t", TopicID: id}
			for p := range int32(2) {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition, rp.BaseOffset, rp.ErrorCode = p, 100+int64(p), code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
			buf := upstream.ResponseBufs.Get()
			buf.B = resp.AppendTo(protocol.AppendResponseHeader(buf.B[:0], int16(kmsg.Produce), v, 999))
			p := &upstream.Pending{Done: make(chan struct{}), Buf: buf}
			close(p.Done)
			return p
		}
		req := &request{hdr: protocol.RequestHeader{Key: int16(kmsg.Produce), Version: v, CorrelationID: 5}}
		slowed := 0
		slow := func(context.Context) ([]byte, func(), error) { slowed++; return nil, nil, nil }

		out, release, err := s.produceAnswerAsIs(req, in, [][16]byte{phys}, answer(0, phys), slow)(context.Background())
		if err != nil || slowed != 0 || out == nil {
			t.Fatalf("v%d: a clean answer went the slow way (%d) or failed: %v", v, slowed, err)
		}
		got := kmsg.NewPtrProduceResponse()
		got.Version = v
		if err := got.ReadFrom(out[protocol.ResponseHeaderSize(int16(kmsg.Produce), v):]); err != nil {
			t.Fatal(err)
		}
		if corr := int32(binary.BigEndian.Uint32(out)); corr != 5 || got.Topics[0].Partitions[1].BaseOffset != 101 || (v >= 13 && got.Topics[0].TopicID != virt) {
			t.Fatalf("v%d: answered correlation %d, %+v", v, corr, got.Topics[0])
		}
		release()

		rebuilt := []*upstream.Pending{answer(6, phys)}
		if v >= 13 { // before it topics are named, not numbered
			rebuilt = append(rebuilt, answer(0, [16]byte{9}))
		}
		for _, p := range rebuilt {
			before := slowed
			s.produceAnswerAsIs(req, in, [][16]byte{phys}, p, slow)(context.Background())
			if slowed != before+1 {
				t.Fatalf("v%d: an answer to rebuild was passed as it came", v)
			}
		}
	}
}
