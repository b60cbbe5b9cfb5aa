package proxy

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// readCorr reads one answer frame and returns its correlation ID and body.
func readCorr(t *testing.T, c net.Conn) (int32, []byte) {
	t.Helper()
	b := readResp(t, c)
	if len(b) < 4 {
		t.Fatalf("answer of %d bytes", len(b))
	}
	return int32(binary.BigEndian.Uint32(b)), b
}

// produceAnswer decodes a Produce answer's only partition.
func produceAnswer(t *testing.T, req *kmsg.ProduceRequest, b []byte) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	return decodeAnswer(t, req, b).(*kmsg.ProduceResponse).Topics[0].Partitions[0]
}

// longPollFetch is a Fetch of partition 0 of topic, waiting up to maxWait
// for a byte.
func longPollFetch(topic string, version int16, maxWait time.Duration) *kmsg.FetchRequest {
	fr := kmsg.NewPtrFetchRequest()
	fr.Version, fr.ReplicaID, fr.MaxWaitMillis, fr.MinBytes, fr.MaxBytes = version, -1, int32(maxWait/time.Millisecond), 1, 1<<20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = topic
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.PartitionMaxBytes = 1 << 20
	ft.Partitions = append(ft.Partitions, fp)
	fr.Topics = append(fr.Topics, ft)
	return fr
}

// TestProduceAnswerWaitsItsTurn: a produce answer written by the goroutine
// that read it from the broker (answers.go) still goes out in request
// order — behind a long-polling Fetch sent before it and answered later.
func TestProduceAnswerWaitsItsTurn(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t", "idle"))
	_, addr := startFerry(t, kf.ListenAddrs())
	c := dialRaw(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))

	// Ferry learns the topics first (a produce to an unknown topic is
	// answered by Ferry, not by the broker).
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 9
	for _, n := range []string{"t", "idle"} {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(n)
		md.Topics = append(md.Topics, rt)
	}
	rawCall(t, c, md, 1)

	fetch := longPollFetch("idle", 11, time.Second)

	sent := time.Now()
	writeReq(t, c, fetch, 2)
	p1, p2 := oneRecordProduce("t"), oneRecordProduce("t")
	writeReq(t, c, p1, 3)
	writeReq(t, c, p2, 4)

	corr, _ := readCorr(t, c)
	if corr != 2 {
		t.Fatalf("first answer is to request %d, want 2 (the Fetch sent first)", corr)
	}
	if waited := time.Since(sent); waited < 500*time.Millisecond {
		t.Fatalf("the Fetch was answered after %v: it did not long-poll, and the test shows nothing", waited)
	}
	for i, want := range []int32{3, 4} {
		corr, b := readCorr(t, c)
		if corr != want {
			t.Fatalf("answer to request %d where %d was next", corr, want)
		}
		if p := produceAnswer(t, p1, b); p.ErrorCode != 0 || p.BaseOffset != int64(i) {
			t.Fatalf("produce %d: %v at %d, want offset %d", want, kerr.ErrorForCode(p.ErrorCode), p.BaseOffset, i)
		}
	}
	if o := endOffset(t, kf, "t"); o != 2 {
		t.Fatalf("end offset %d, want 2", o)
	}
}

// TestAnswerBehindAPausedProduceWaits: an answer Ferry has at once (an
// ApiVersions) sent behind a produce the broker has not answered yet is
// not written before it; both go out, in order, once the broker answers.
func TestAnswerBehindAPausedProduceWaits(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	entered, release := make(chan struct{}, 1), make(chan struct{})
	kf.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		select {
		case entered <- struct{}{}:
			kf.SleepControl(func() { <-release })
		default:
		}
		return nil, nil, false
	})
	_, addr := startFerry(t, kf.ListenAddrs())
	c := dialRaw(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))

	p := oneRecordProduce("t")
	writeReq(t, c, p, 1)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the produce never reached the broker")
	}
	writeReq(t, c, kmsg.NewPtrApiVersionsRequest(), 2)

	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	var size [4]byte
	_, err := c.Read(size[:])
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		close(release)
		t.Fatalf("read while the produce is paused: %v, want nothing (the ApiVersions answer overtook the produce's)", err)
	}
	close(release)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	corr, b := readCorr(t, c)
	if corr != 1 {
		t.Fatalf("first answer is to request %d, want 1 (the produce)", corr)
	}
	if pa := produceAnswer(t, p, b); pa.ErrorCode != 0 || pa.BaseOffset != 0 {
		t.Fatalf("produce: %v at %d, want offset 0", kerr.ErrorForCode(pa.ErrorCode), pa.BaseOffset)
	}
	if corr, _ := readCorr(t, c); corr != 2 {
		t.Fatalf("second answer is to request %d, want 2", corr)
	}
}
