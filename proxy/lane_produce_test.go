package proxy

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
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
