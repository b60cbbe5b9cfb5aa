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
