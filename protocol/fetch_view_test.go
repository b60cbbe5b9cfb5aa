package protocol

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// sampleFetchResponse builds a response with two topics, aborted
// transactions, leader hints and diverging epochs, at version v.
func sampleFetchResponse(v int16, endpoints bool) *kmsg.FetchResponse {
	r := kmsg.NewPtrFetchResponse()
	r.SetVersion(v)
	r.ThrottleMillis = 3
	for ti, name := range []string{"orders", "payments"} {
		t := kmsg.NewFetchResponseTopic()
		t.Topic = name
		t.TopicID = [16]byte{byte(ti + 1), 2, 3}
		for p := int32(0); p < 3; p++ {
			fp := kmsg.NewFetchResponseTopicPartition()
			fp.Partition = p
			fp.HighWatermark, fp.LastStableOffset, fp.LogStartOffset = 100+int64(p), 90, 5
			fp.RecordBatches = bytes.Repeat([]byte{byte(p)}, 10+int(p))
			fp.AbortedTransactions = []kmsg.FetchResponseTopicPartitionAbortedTransaction{{ProducerID: 7, FirstOffset: 12}}
			fp.PreferredReadReplica = 2
			if p == 1 {
				fp.ErrorCode = 6
				fp.CurrentLeader.LeaderID, fp.CurrentLeader.LeaderEpoch = 3, 9
				fp.DivergingEpoch.Epoch, fp.DivergingEpoch.EndOffset = 4, 50
			}
			t.Partitions = append(t.Partitions, fp)
		}
		r.Topics = append(r.Topics, t)
	}
	if endpoints {
		r.Brokers = []kmsg.FetchResponseBroker{{NodeID: 3, Host: "kafka-3", Port: 9092}}
	}
	return r
}

func TestWalkFetchResponseMatchesKmsg(t *testing.T) {
	for v := int16(4); v <= 18; v++ {
		want := sampleFetchResponse(v, false)
		body := want.AppendTo(nil)
		var got []FetchPartition
		var topics []FetchTopic
		code, endpoints, err := WalkFetchResponse(body, v, func(t *FetchTopic) error {
			topics = append(topics, *t)
			return nil
		}, func(_ *FetchTopic, p *FetchPartition) error {
			got = append(got, *p)
			return nil
		})
		if err != nil || code != 0 || endpoints {
			t.Fatalf("v%d: %v code %d endpoints %v", v, err, code, endpoints)
		}
		if len(topics) != 2 || len(got) != 6 {
			t.Fatalf("v%d: %d topics %d partitions", v, len(topics), len(got))
		}
		for i, p := range got {
			w := want.Topics[i/3].Partitions[i%3]
			if p.Partition != w.Partition || p.ErrorCode != w.ErrorCode || p.HighWatermark != w.HighWatermark || p.LastStableOffset != w.LastStableOffset || !bytes.Equal(p.Records, w.RecordBatches) {
				t.Fatalf("v%d partition %d: %+v", v, i, p)
			}
			if v >= 5 && p.LogStartOffset != w.LogStartOffset {
				t.Fatalf("v%d log start %d", v, p.LogStartOffset)
			}
			if v >= 12 && i%3 == 1 && (p.CurrentLeader == nil || p.DivergingEpoch == nil) {
				t.Fatalf("v%d: tagged fields not seen", v)
			}
		}
		// Rewriting through the windows is what kmsg then reads.
		if err := walkRewrite(body, v); err != nil {
			t.Fatal(err)
		}
		back := kmsg.NewPtrFetchResponse()
		back.SetVersion(v)
		if err := back.ReadFrom(body); err != nil {
			t.Fatalf("v%d: kmsg cannot read the rewritten response: %v", v, err)
		}
		p := back.Topics[1].Partitions[1]
		if v >= 11 && p.PreferredReadReplica != -1 {
			t.Fatalf("v%d preferred read replica %d", v, p.PreferredReadReplica)
		}
		if v >= 12 && (p.CurrentLeader.LeaderID != 42 || p.CurrentLeader.LeaderEpoch != 9 || p.DivergingEpoch.Epoch != 77) {
			t.Fatalf("v%d tags %+v %+v", v, p.CurrentLeader, p.DivergingEpoch)
		}
		if v >= 13 && back.Topics[0].TopicID[0] != 0xee {
			t.Fatalf("v%d topic ID not rewritten", v)
		}
	}
}

func TestWalkFetchResponseSeesEndpoints(t *testing.T) {
	body := sampleFetchResponse(16, true).AppendTo(nil)
	_, endpoints, err := WalkFetchResponse(body, 16, nil, nil)
	if err != nil || !endpoints {
		t.Fatalf("endpoints %v err %v", endpoints, err)
	}
}

func TestWalkFetchResponseRejectsTruncated(t *testing.T) {
	body := sampleFetchResponse(16, false).AppendTo(nil)
	for n := 0; n < len(body); n += 7 {
		if _, _, err := WalkFetchResponse(body[:n], 16, nil, nil); err == nil {
			t.Fatalf("accepted a response cut at %d of %d bytes", n, len(body))
		}
	}
}

func FuzzWalkFetchResponse(f *testing.F) {
	for _, v := range []int16{4, 11, 12, 13, 16, 18} {
		f.Add(sampleFetchResponse(v, v == 16).AppendTo(nil), v)
	}
	f.Fuzz(func(t *testing.T, body []byte, v int16) {
		if v < 4 || v > 18 {
			return
		}
		WalkFetchResponse(body, v, func(t *FetchTopic) error { return nil }, func(_ *FetchTopic, p *FetchPartition) error { return nil })
	})
}

// walkRewrite applies the test rewrites through WalkFetchResponse's
// windows.
func walkRewrite(body []byte, v int16) error {
	_, _, err := WalkFetchResponse(body, v, func(t *FetchTopic) error {
		rewriteTopic(t)
		return nil
	}, func(_ *FetchTopic, p *FetchPartition) error {
		rewriteHead(p)
		rewriteTail(p)
		return nil
	})
	return err
}

// The rewrites the Fetch walkers' tests make: a topic ID byte, the
// preferred read replica (before the records), the leader hint and the
// diverging epoch (after them).
func rewriteTopic(t *FetchTopic) {
	if t.ID != nil {
		t.ID[0] = 0xee
	}
}

func rewriteHead(p *FetchPartition) {
	if p.PreferredReadReplica != nil {
		binary.BigEndian.PutUint32(p.PreferredReadReplica, 0xffffffff)
	}
}

func rewriteTail(p *FetchPartition) {
	if p.CurrentLeader != nil {
		binary.BigEndian.PutUint32(p.CurrentLeader, 42)
	}
	if p.DivergingEpoch != nil {
		binary.BigEndian.PutUint32(p.DivergingEpoch, 77)
	}
}
