package protocol

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestProduceTopicIDs(t *testing.T) {
	req := kmsg.NewPtrProduceRequest()
	req.Version = 13
	txn := "tx"
	req.TransactionID = &txn
	for i := 0; i < 3; i++ {
		rt := kmsg.NewProduceRequestTopic()
		rt.TopicID = [16]byte{byte(i + 1), 9}
		for p := int32(0); p < 2; p++ {
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Partition = p
			rp.Records = []byte{1, 2, 3, byte(p)}
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	body := req.AppendTo(nil)
	ids, err := ProduceTopicIDs(body, 13)
	if err != nil || len(ids) != 3 {
		t.Fatalf("%d ids, %v", len(ids), err)
	}
	for i, w := range ids {
		if w[0] != byte(i+1) || w[1] != 9 {
			t.Fatalf("window %d: %v", i, w)
		}
		w[0] = 0xaa
	}
	back := kmsg.NewPtrProduceRequest()
	back.Version = 13
	if err := back.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	for _, rt := range back.Topics {
		if rt.TopicID[0] != 0xaa || len(rt.Partitions) != 2 || string(rt.Partitions[1].Records) != string([]byte{1, 2, 3, 1}) {
			t.Fatalf("rewritten request reads back as %+v", rt)
		}
	}
	for n := 0; n < len(body); n++ {
		if _, err := ProduceTopicIDs(body[:n], 13); err == nil {
			t.Fatalf("accepted a request cut at %d of %d bytes", n, len(body))
		}
	}
}

func cleanProduceAnswer(version int16) *kmsg.ProduceResponse {
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = version
	resp.ThrottleMillis = 7
	for ti := range 2 {
		t := kmsg.NewProduceResponseTopic()
		t.Topic = []string{"orders", "payments"}[ti]
		t.TopicID = [16]byte{byte(ti + 1), 9}
		for p := range int32(2) {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p
			rp.BaseOffset = 1000 + int64(p)
			rp.LogAppendTime = -1
			rp.LogStartOffset = 0
			t.Partitions = append(t.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, t)
	}
	return resp
}

func answerFrame(resp *kmsg.ProduceResponse) []byte {
	return resp.AppendTo(AppendResponseHeader(nil, int16(kmsg.Produce), resp.Version, 42))
}

// TestProduceAnswerClean: at every version a broker's answer without an
// error is clean, with its partitions counted and its topic IDs' windows
// (v13) where the IDs lie; any error, record error, error message, leader
// hint, node endpoint or unknown tag, a truncated answer or one with bytes
// left over is not.
func TestProduceAnswerClean(t *testing.T) {
	for v := int16(3); v <= 13; v++ {
		frame := answerFrame(cleanProduceAnswer(v))
		ids, n, ok := ProduceAnswerClean(frame, v)
		if !ok || n != 4 {
			t.Fatalf("v%d: clean answer read as clean=%v with %d partitions", v, ok, n)
		}
		if v >= 13 {
			if len(ids) != 2 || ids[0][0] != 1 || ids[1][0] != 2 {
				t.Fatalf("v%d: topic ID windows %x", v, ids)
			}
			copy(ids[1], []byte{7, 7, 7})
			got := kmsg.NewPtrProduceResponse()
			got.Version = v
			if err := got.ReadFrom(frame[ResponseHeaderSize(int16(kmsg.Produce), v):]); err != nil || got.Topics[1].TopicID[0] != 7 || got.Topics[1].Partitions[1].BaseOffset != 1001 {
				t.Fatalf("v%d: written through a window: %v %+v", v, err, got.Topics[1])
			}
		} else if len(ids) != 0 {
			t.Fatalf("v%d: topic ID windows before v13", v)
		}
		for _, tc := range []struct {
			name string
			from int16
			mut  func(r *kmsg.ProduceResponse)
		}{
			{"error code", 3, func(r *kmsg.ProduceResponse) { r.Topics[1].Partitions[0].ErrorCode = 6 }},
			{"record error", 8, func(r *kmsg.ProduceResponse) {
				r.Topics[0].Partitions[1].ErrorRecords = []kmsg.ProduceResponseTopicPartitionErrorRecord{{RelativeOffset: 1}}
			}},
			{"error message", 8, func(r *kmsg.ProduceResponse) { m := "x"; r.Topics[0].Partitions[0].ErrorMessage = &m }},
			{"leader hint", 10, func(r *kmsg.ProduceResponse) { r.Topics[0].Partitions[0].CurrentLeader.LeaderID = 2 }},
			{"node endpoints", 10, func(r *kmsg.ProduceResponse) {
				r.Brokers = []kmsg.ProduceResponseBroker{{NodeID: 2, Host: "h", Port: 9092}}
			}},
			{"unknown tag", 9, func(r *kmsg.ProduceResponse) { r.Topics[1].UnknownTags.Set(99, []byte{1}) }},
		} {
			if v < tc.from {
				continue
			}
			r := cleanProduceAnswer(v)
			tc.mut(r)
			if _, _, ok := ProduceAnswerClean(answerFrame(r), v); ok {
				t.Fatalf("v%d: an answer with %s read as clean", v, tc.name)
			}
		}
		for _, bad := range [][]byte{frame[:len(frame)-1], append(append([]byte(nil), frame...), 0)} {
			if _, _, ok := ProduceAnswerClean(bad, v); ok {
				t.Fatalf("v%d: an answer of %d bytes (of %d) read as clean", v, len(bad), len(frame))
			}
		}
	}
}
