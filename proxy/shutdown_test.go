package proxy

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestShutdownAnswersWhatWasRead: a produce the member has read and sent
// upstream when Shutdown starts is answered (the record is in the log and
// the client hears so) before the connection closes; new connections are
// refused meanwhile.
func TestShutdownAnswersWhatWasRead(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(newClient(t, addr)).CreateTopic(ctx, 1, 1, nil, "drained"); err != nil {
		t.Fatal(err)
	}

	// Buffered: the produce may reach the broker before the test waits
	// for it, and must still be held.
	upstream := make(chan struct{}, 1)
	release := make(chan struct{})
	kf.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		select {
		case upstream <- struct{}{}:
			<-release
		default:
		}
		return nil, nil, false
	})

	c := dialRaw(t, addr)
	writeReq(t, c, oneRecordProduce("drained"), 42)
	<-upstream // the produce is at the broker

	done := make(chan error, 1)
	go func() { done <- s.Shutdown(ctx) }()
	// Shutdown stops accepting before it waits for anyone.
	testwait.Until(t, 10*time.Second, "Shutdown to stop accepting", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.draining.Load()
	})
	close(release)

	resp := kmsg.NewPtrProduceResponse()
	resp.Version = 7
	b := readResp(t, c)
	if err := resp.ReadFrom(b[4:]); err != nil { // after the correlation ID
		t.Fatal(err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("produce answered with %v during shutdown", kerr.ErrorForCode(code))
	}
	expectClosed(t, c)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if o := endOffset(t, kf, "drained"); o != 1 {
		t.Fatalf("end offset %d, want the one acknowledged record", o)
	}
}

// oneRecordProduce is a Produce v7 (acks=all) of one plain record to
// rawProduce sends oneRecordProduce(topic) on c and returns its partition's
// answer.
func rawProduce(t *testing.T, c net.Conn, topic string, corr int32) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	return rawCall(t, c, oneRecordProduce(topic), corr).(*kmsg.ProduceResponse).Topics[0].Partitions[0]
}

// endOffset is partition 0 of topic's end offset, listed on the cluster
// directly.
func endOffset(t *testing.T, kf *kfake.Cluster, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(newClient(t, kf.ListenAddrs()[0])).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	o, _ := ends.Lookup(topic, 0)
	return o.Offset
}

// partition 0 of topic.
func oneRecordProduce(topic string) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Version = 7
	req.Acks = -1
	req.TimeoutMillis = 10000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = recordBatch(-1, -1, -1, false)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}
