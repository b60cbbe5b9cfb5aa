package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestProduceOnTheWrongLaneRefused: a lane refuses a produce for a
// partition another lane leads, as a broker that is not the leader does,
// instead of forwarding it: a client's batches for one partition then
// travel one connection, and its batches sent on the old leader's lane
// cannot overtake those it sends on the new one's.
func TestProduceOnTheWrongLaneRefused(t *testing.T) {
	c := newKfake(t, 2, kfake.SeedTopics(2, "l"))
	for p, node := range []int32{0, 1} {
		if err := c.MoveTopicPartition("l", int32(p), node); err != nil {
			t.Fatal(err)
		}
	}
	s, addr := startFerry(t, c.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md, err := kadm.NewClient(newClient(t, addr)).Metadata(ctx, "l")
	if err != nil {
		t.Fatal(err)
	}
	leaders := map[int32]int32{}
	for _, p := range md.Topics["l"].Partitions {
		leaders[p.Partition] = p.Leader
	}
	if len(md.Brokers) != 2 || leaders[0] == leaders[1] {
		t.Fatalf("want two lanes leading one partition each; brokers %v, leaders %v", md.Brokers, leaders)
	}
	produceVia := func(node, partition int32) int16 {
		var hostPort string
		for _, b := range md.Brokers {
			if b.NodeID == node {
				hostPort = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
			}
		}
		conn := dialRaw(t, hostPort)
		p := kmsg.NewPtrProduceRequest()
		p.Version = 9
		p.Acks = -1
		p.TimeoutMillis = 5000
		p.Topics = []kmsg.ProduceRequestTopic{{Topic: "l", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: partition}}}}
		return rawCall(t, conn, p, 1).(*kmsg.ProduceResponse).Topics[0].Partitions[0].ErrorCode
	}
	sentUp := func() float64 { return testutil.ToFloat64(s.metrics.bytesUp) }
	before := sentUp()
	if code := produceVia(leaders[1], 0); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("partition 0 produced on partition 1's lane: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	if sent := sentUp() - before; sent != 0 {
		t.Fatalf("the refused produce sent %v bytes upstream", sent)
	}
	// On its own lane the request reaches the broker, which judges the
	// (empty) records itself.
	if code := produceVia(leaders[0], 0); code == kerr.NotLeaderForPartition.Code {
		t.Fatal("partition 0 produced on its own lane was refused NOT_LEADER_OR_FOLLOWER")
	}
	if sentUp() == before {
		t.Fatal("the produce on its own lane was not sent upstream")
	}
}

// TestUnansweredProduceHoldsLaterBatches: a batch of an idempotent
// producer whose answer from the broker was lost is answered
// NOT_LEADER_OR_FOLLOWER in the broker's place, and the partition's next
// batch, sent to the new leader before the lost one is sent again, is
// refused NOT_LEADER_OR_FOLLOWER rather than written: the new
// leader, holding no state for the producer, would take it as the
// producer's first, the lost batch would never be written, and librdkafka
// counts the later acknowledgement as covering it (records acknowledged at
// offset -1001 and not on the cluster, in TestBrokerDeathProducers). Not
// OUT_OF_ORDER_SEQUENCE_NUMBER: the lost batch's own answer may come
// later, and librdkafka takes that code with no earlier batch failed for
// a lost sequence, bumps its epoch, and writes the lost batch again if it
// was written after all (duplicates, in the same test). Sent again in
// order, both are written in order.
func TestUnansweredProduceHoldsLaterBatches(t *testing.T) {
	c := newKfake(t, 2, kfake.SeedTopics(1, "u"))
	const oldLeader, newLeader = 0, 1
	if err := c.MoveTopicPartition("u", 0, oldLeader); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A record already in the partition: the broker then takes any
	// sequence as an unknown producer's first (as Kafka does, KAFKA-15591).
	seed := newClient(t, c.ListenAddrs()[0], kgo.DisableIdempotentWrite())
	if err := seed.ProduceSync(ctx, &kgo.Record{Topic: "u", Value: []byte("seed")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s, addr := startFerry(t, c.ListenAddrs())
	u := s.cluster("a")

	leaderLane := func(leader int32) net.Conn {
		t.Helper()
		for {
			if p, ok := u.Partition(ctx, "u", 0); ok && p.Leader == leader {
				break
			}
			u.RefreshSoon()
			select {
			case <-ctx.Done():
				t.Fatalf("Ferry never saw broker %d lead the partition", leader)
			case <-time.After(50 * time.Millisecond):
			}
		}
		md, err := kadm.NewClient(newClient(t, addr)).Metadata(ctx, "u")
		if err != nil {
			t.Fatal(err)
		}
		lane := md.Topics["u"].Partitions[0].Leader
		for _, b := range md.Brokers {
			if b.NodeID == lane {
				return dialRaw(t, net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))))
			}
		}
		t.Fatalf("lane %d is not among the brokers %v", lane, md.Brokers)
		return nil
	}
	oldLane := leaderLane(oldLeader)
	init := kmsg.NewPtrInitProducerIDRequest()
	init.Version = maxVersion(t, s, kmsg.InitProducerID)
	ip := rawCall(t, oldLane, init, 1).(*kmsg.InitProducerIDResponse)
	if ip.ErrorCode != 0 {
		t.Fatalf("InitProducerId: %v", kerr.ErrorForCode(ip.ErrorCode))
	}
	corr := int32(1)
	produce := func(conn net.Conn, seq int32, v string) kmsg.ProduceResponseTopicPartition {
		corr++
		req := oneRecordProduce("u")
		req.Topics[0].Partitions[0].Records = valueBatch(ip.ProducerID, ip.ProducerEpoch, seq, false, v)
		return rawCall(t, conn, req, corr).(*kmsg.ProduceResponse).Topics[0].Partitions[0]
	}

	// The old leader drops the connection with the first batch unanswered.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		return nil, errors.New("the broker's answer is lost"), true
	})
	if p := produce(oldLane, 0, "first"); p.ErrorCode != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the batch whose answer was lost: %v at %d, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if err := c.MoveTopicPartition("u", 0, newLeader); err != nil {
		t.Fatal(err)
	}
	newLane := leaderLane(newLeader)
	if p := produce(newLane, 1, "second"); p.ErrorCode != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the next batch, to the new leader before the first is sent again: %v at %d, want NOT_LEADER_OR_FOLLOWER (wait behind it)",
			kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if o := endOffset(t, c, "u"); o != 1 {
		t.Fatalf("the end offset is %d, want 1 (the seed alone): the next batch was written ahead of the first", o)
	}
	if p := produce(newLane, 0, "first"); p.ErrorCode != 0 || p.BaseOffset != 1 {
		t.Fatalf("the first batch sent again: %v at %d, want offset 1", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	if p := produce(newLane, 1, "second"); p.ErrorCode != 0 || p.BaseOffset != 2 {
		t.Fatalf("the next batch sent again: %v at %d, want offset 2", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
	}
	fetched := newClient(t, c.ListenAddrs()[0], kgo.ConsumeTopics("u"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	for len(got) < 3 {
		fs := fetched.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, fmt.Sprintf("%d:%s", r.Offset, r.Value)) })
	}
	if want := []string{"0:seed", "1:first", "2:second"}; !slices.Equal(got, want) {
		t.Fatalf("the partition holds %v, want %v", got, want)
	}
}
