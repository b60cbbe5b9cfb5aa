package proxy

import (
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// firstsFixture: a broker that, like Kafka before 4.5 (kfake capped at a
// released version), takes any first sequence from a producer it holds no
// state for; Ferry in front; a raw connection that knows topic "t" and an
// idempotent producer ID from it.
func firstsFixture(t *testing.T) (*kfake.Cluster, *Server, net.Conn, int64, int16) {
	t.Helper()
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"), kfake.MaxVersions(kversion.V4_0_0()))
	s, addr := startFerry(t, kf.ListenAddrs())
	c := dialRaw(t, addr)
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 9
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr("t")
	md.Topics = append(md.Topics, rt)
	rawCall(t, c, md, 1)
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.Version = 4
	ip.TransactionTimeoutMillis = -1
	ipr := rawCall(t, c, ip, 2).(*kmsg.InitProducerIDResponse)
	if ipr.ErrorCode != 0 {
		t.Fatalf("InitProducerId: %v", kerr.ErrorForCode(ipr.ErrorCode))
	}
	return kf, s, c, ipr.ProducerID, ipr.ProducerEpoch
}

// TestLaterBatchNotWrittenFirst: an idempotent producer's first batch in
// a never-written partition is refused NOT_LEADER_OR_FOLLOWER by the broker
// (a leader not yet in place), and its second, sent right behind it on the
// same connection, must not be written as the producer's first there
// (KAFKA-15591): librdkafka would count the refused one as written. Ferry
// holds the second until the first is answered, and refuses it unwritten;
// sent again in order, both are written at offsets 0 and 1.
func TestLaterBatchNotWrittenFirst(t *testing.T) {
	kf, s, c, pid, epoch := firstsFixture(t)
	kf.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		return notLeaderAnswer(kr), nil, true // once: the next Produce is the broker's
	})

	p0 := produceReq(s, t, nil, valueBatch(pid, epoch, 0, false, "a"))
	p1 := produceReq(s, t, nil, valueBatch(pid, epoch, 1, false, "b"))
	c.SetDeadline(time.Now().Add(30 * time.Second))
	writeReq(t, c, p0, 10)
	writeReq(t, c, p1, 11)
	for _, want := range []int32{10, 11} {
		corr, b := readCorr(t, c)
		if corr != want {
			t.Fatalf("answer to request %d where %d was next", corr, want)
		}
		if a := produceAnswer(t, p0, b); a.ErrorCode != kerr.NotLeaderForPartition.Code {
			t.Fatalf("batch %d answered %v at offset %d, want NOT_LEADER_OR_FOLLOWER: its producer's first batch was refused",
				want-10, kerr.ErrorForCode(a.ErrorCode), a.BaseOffset)
		}
	}
	if o := endOffset(t, kf, "t"); o != 0 {
		t.Fatalf("end offset %d after both batches were refused, want 0 (a later batch written first)", o)
	}

	// The client sends them again, in order.
	for i, p := range []*kmsg.ProduceRequest{p0, p1} {
		a := rawCall(t, c, p, int32(20+i)).(*kmsg.ProduceResponse).Topics[0].Partitions[0]
		if a.ErrorCode != 0 || a.BaseOffset != int64(i) {
			t.Fatalf("batch %d sent again: %v at offset %d, want offset %d", i, kerr.ErrorForCode(a.ErrorCode), a.BaseOffset, i)
		}
	}
	if o := endOffset(t, kf, "t"); o != 2 {
		t.Fatalf("end offset %d, want 2", o)
	}
}

// TestBatchesBehindAWrittenFirstGoOn: pipelined batches behind a
// producer's first in a partition wait for its answer and, it being
// written, go on: every one written, in order, and later ones are not
// held once the first is known.
func TestBatchesBehindAWrittenFirstGoOn(t *testing.T) {
	kf, s, c, pid, epoch := firstsFixture(t)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var reqs []*kmsg.ProduceRequest
	for i := range 5 {
		p := produceReq(s, t, nil, valueBatch(pid, epoch, int32(i), false, "v"))
		reqs = append(reqs, p)
		writeReq(t, c, p, int32(10+i))
	}
	for i, p := range reqs {
		corr, b := readCorr(t, c)
		if corr != int32(10+i) {
			t.Fatalf("answer to request %d where %d was next", corr, 10+i)
		}
		if a := produceAnswer(t, p, b); a.ErrorCode != 0 || a.BaseOffset != int64(i) {
			t.Fatalf("batch %d: %v at offset %d, want offset %d", i, kerr.ErrorForCode(a.ErrorCode), a.BaseOffset, i)
		}
	}
	if o := endOffset(t, kf, "t"); o != 5 {
		t.Fatalf("end offset %d, want 5", o)
	}
}
