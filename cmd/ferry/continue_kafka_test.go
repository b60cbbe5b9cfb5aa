package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
)

// TestIdempotentProducerContinuesAcrossSwitchRealKafka: an idempotent
// producer's first batch under a new generation continues where it
// stopped on the cluster the switch took over from, whichever member it
// comes through (the 30-minute chaos run's "2/53258 holds 305788 after
// 306303": a batch outstanding on a member cut off through a switch, the
// next one written first through another member). A producer writes
// v0..v4 through member 0; a planned switch moves the fleet to the
// standby. With v5 outstanding on member 0, v6 through member 1 is
// refused (retried in place), v3 (written before the switch, its answer
// lost) is answered DUPLICATE_SEQUENCE_NUMBER at its offset, found in the
// old cluster's log; v5 through member 0, then
// v6 and v7 through member 1, are written. The standby holds v0..v7, in
// order, once each. What the old cluster holds of the producer is read
// with Kafka's DescribeProducers.
func TestIdempotentProducerContinuesAcrossSwitchRealKafka(t *testing.T) {
	f := startTestFleet(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const topic = "continue"
	createTopicVia(t, ctx, f.members[0].kafka, topic, 1)
	// One client per member, each request to that member (its seed);
	// Produce before v13, which names topics by ID.
	var via []*kgo.Client
	for _, m := range f.members {
		via = append(via, newClient(t, kgo.SeedBrokers(m.kafka), kgo.MaxVersions(kversion.V3_9_0())))
	}
	cl := via[0]
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.TransactionTimeoutMillis = 60000
	ipr, err := ip.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(ipr.ErrorCode)
	}
	if err != nil {
		t.Fatalf("InitProducerId: %v", err)
	}
	pid, epoch := ipr.ProducerID, ipr.ProducerEpoch
	var answeredAt int64 // the base offset of the last answer
	produce := func(member int, seq int32) error {
		t.Helper()
		p := kmsg.NewPtrProduceRequest()
		p.Acks, p.TimeoutMillis = -1, 10000
		p.Topics = []kmsg.ProduceRequestTopic{{Topic: topic, Partitions: []kmsg.ProduceRequestTopicPartition{
			{Partition: 0, Records: oneRecordBatch(pid, epoch, seq, fmt.Sprintf("v%d", seq))}}}}
		resp, err := via[member].SeedBrokers()[0].Request(ctx, p)
		if err != nil {
			t.Fatalf("produce v%d through member %d: %v", seq, member, err)
		}
		pr := resp.(*kmsg.ProduceResponse).Topics[0].Partitions[0]
		answeredAt = pr.BaseOffset
		return kerr.ErrorForCode(pr.ErrorCode)
	}
	for seq := range int32(5) {
		var err error
		if seq == 0 {
			// A topic just created: its broker may not host the partition
			// yet, and these raw requests are not retried by a client.
			testwait.Eventually(t, 30*time.Second, "v0 not answered UNKNOWN_TOPIC_OR_PARTITION (the new topic's partition hosted)", func() error {
				if err = produce(0, seq); errors.Is(err, kerr.UnknownTopicOrPartition) {
					return err
				}
				return nil
			})
		} else {
			err = produce(0, seq)
		}
		if err != nil {
			t.Fatalf("v%d before the switch: %v", seq, err)
		}
	}
	if out, err := ferryCmd(t, "switchover", "--admin", f.members[0].admin, "--to", "standby").CombinedOutput(); err != nil {
		t.Fatalf("switchover: %v\n%s", err, out)
	}
	for _, m := range f.members {
		waitGeneration(t, m, 1, "standby")
	}

	if err := produce(1, 6); err != kerr.NotLeaderForPartition {
		t.Fatalf("v6 with v5 outstanding, through member 1: %v, want NOT_LEADER_OR_FOLLOWER", err)
	}
	if err := produce(1, 3); err != kerr.DuplicateSequenceNumber || answeredAt != 3 {
		t.Fatalf("v3, written before the switch: %v at %d, want DUPLICATE_SEQUENCE_NUMBER at 3 (where both clusters hold it)", err, answeredAt)
	}
	if err := produce(0, 5); err != nil {
		t.Fatalf("v5 through member 0: %v", err)
	}
	for _, seq := range []int32{6, 7} {
		if err := produce(1, seq); err != nil {
			t.Fatalf("v%d through member 1 after v5: %v", seq, err)
		}
	}
	want := "0/0=v0 0/1=v1 0/2=v2 0/3=v3 0/4=v4 0/5=v5 0/6=v6 0/7=v7"
	if got := strings.Join(readAll(t, f.standby.Addrs(), topic), " "); got != want {
		t.Fatalf("the standby holds %s; want %s", got, want)
	}
}

// oneRecordBatch is a v2 batch of one record of value v from an idempotent
// producer.
func oneRecordBatch(pid int64, epoch int16, seq int32, v string) []byte {
	var body []byte
	body = append(body, 0)               // attributes
	body = binary.AppendVarint(body, 0)  // timestamp delta
	body = binary.AppendVarint(body, 0)  // offset delta
	body = binary.AppendVarint(body, -1) // key
	body = binary.AppendVarint(body, int64(len(v)))
	body = append(body, v...)
	body = binary.AppendVarint(body, 0) // headers
	payload := binary.AppendVarint(nil, int64(len(body)))
	payload = append(payload, body...)
	now := time.Now().UnixMilli()
	kb := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1, Magic: 2, FirstTimestamp: now, MaxTimestamp: now,
		ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq, NumRecords: 1, Records: payload,
	}
	kb.Length = int32(protocol.BatchHeaderSize - 12 + len(payload))
	b := protocol.Batch(kb.AppendTo(nil))
	b.UpdateCRC()
	return b
}
