package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
)

// Ferry's own cost per produce request, the way the real-broker benchmark
// (conformance/bench) produces: idempotent, acks=all, one request in flight
// per connection, each request a batch of already compressed bytes for
// every partition. The broker is kfake, but its produce requests are
// answered by a shim in front of it from a canned answer, so that the
// fake's own decoding and bookkeeping stay out of ns/op and the profile.
// The client and the shim share Ferry's process and scheduler, so a change
// in how many goroutines a request wakes shows here differently than
// against real Kafka (README, "Measured", the produce path's cost): judge
// those with conformance/bench.
//
//	go test ./proxy -run '^$' -bench 'ProduceThrough' -benchmem -cpuprofile /tmp/produce.pb.gz
func BenchmarkProduceThrough(b *testing.B) {
	for _, c := range []struct {
		parts, batch, conns int
		chatter             bool
	}{
		{6, 6 << 10, 1, false}, // about the size conformance/bench sends at half rate
		{6, 16 << 10, 1, false},
		{2, 64 << 10, 3, false},
		{3, 384 << 10, 1, false}, // full speed: about the size conformance/bench sends then (1.1 MiB a request)
		// Another client's small requests, many times as many as the
		// produces, as on a member that also serves consumers.
		{6, 16 << 10, 1, true},
	} {
		name := fmt.Sprintf("parts=%d/batch=%dKiB/conns=%d", c.parts, c.batch>>10, c.conns)
		if c.chatter {
			name += "/with-small-requests"
		}
		b.Run(name, func(b *testing.B) {
			benchProduceThrough(b, c.parts, c.batch, c.conns, c.chatter)
		})
	}
}

func benchProduceThrough(b *testing.B, parts, batch, conns int, chatter bool) {
	kf := newKfake(b, 1, kfake.ListenFn(func(network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, addr)
		return &cannedProduceListener{Listener: ln}, err
	}))
	_, addr := startFerry(b, kf.ListenAddrs(), WithLogger(zap.NewNop()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adm := kadm.NewClient(newClient(b, addr))
	if _, err := adm.CreateTopic(ctx, int32(parts), 1, nil, "bench"); err != nil {
		b.Fatal(err)
	}
	td, err := adm.ListTopics(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	frame := produceFrame(td["bench"].ID, parts, batch)
	b.SetBytes(int64(len(frame)))

	var cs []net.Conn
	for range conns {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		cs = append(cs, nc)
		// Warm, and check that what is measured is a produce every
		// partition of which succeeds, not a refusal.
		body, err := produceRoundTrip(nc, frame, 0, true)
		if err != nil {
			b.Fatal(err)
		}
		if err := allProduced(body, parts); err != nil {
			b.Fatal(err)
		}
	}
	if chatter {
		stop := make(chan struct{})
		done := make(chan struct{})
		defer func() { close(stop); <-done }()
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		go func() {
			defer close(done)
			req := kmsg.NewPtrApiVersionsRequest()
			frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("chatter")).AppendRequest(nil, req, 0)
			for corr := int32(1); ; corr++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := produceRoundTrip(nc, frame, corr, false); err != nil {
					return
				}
			}
		}()
		time.Sleep(2 * time.Second) // long enough for the pools to calibrate on them
	}
	ch := make(chan int32, conns)
	cpu0 := processCPU()
	b.ResetTimer()
	var wg sync.WaitGroup
	go func() {
		for i := range b.N {
			ch <- int32(i + 1)
		}
		close(ch)
	}()
	for _, nc := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := append([]byte(nil), frame...)
			for corr := range ch {
				if _, err := produceRoundTrip(nc, own, corr, false); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	// The machine may be shared: CPU time is steadier than wall time.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// produceFrame is a v13 Produce frame (size included) for the topic,
// acks=all, one batch of batch compressed-looking bytes per partition.
func produceFrame(topicID [16]byte, parts, batch int) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	req := kmsg.NewPtrProduceRequest()
	req.Version = 13
	req.Acks = -1
	req.TimeoutMillis = 30000
	t := kmsg.NewProduceRequestTopic()
	t.TopicID = topicID
	for p := range parts {
		records := make([]byte, batch)
		for i := range records {
			records[i] = byte(rng.Uint32())
		}
		rb := kmsg.RecordBatch{
			PartitionLeaderEpoch: -1,
			Magic:                2,
			Attributes:           3, // lz4
			LastOffsetDelta:      63,
			FirstTimestamp:       time.Now().UnixMilli(),
			MaxTimestamp:         time.Now().UnixMilli(),
			ProducerID:           4000,
			FirstSequence:        int32(p) * 64,
			NumRecords:           64,
			Records:              records,
		}
		raw := rb.AppendTo(nil)
		rb.Length = int32(len(raw) - 12)
		raw = rb.AppendTo(nil)
		protocol.WalkBatches(raw, func(b protocol.Batch) error { b.UpdateCRC(); return nil })
		tp := kmsg.NewProduceRequestTopicPartition()
		tp.Partition = int32(p)
		tp.Records = raw
		t.Partitions = append(t.Partitions, tp)
	}
	req.Topics = append(req.Topics, t)
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("bench")).AppendRequest(nil, req, 0)
}

// produceRoundTrip sends frame with correlation ID corr and reads its
// answer, whose body (after the correlation ID) it returns if keep.
func produceRoundTrip(nc net.Conn, frame []byte, corr int32, keep bool) ([]byte, error) {
	binary.BigEndian.PutUint32(frame[8:], uint32(corr))
	if _, err := nc.Write(frame); err != nil {
		return nil, err
	}
	var size [8]byte
	if _, err := io.ReadFull(nc, size[:]); err != nil {
		return nil, err
	}
	if got := int32(binary.BigEndian.Uint32(size[4:])); got != corr {
		return nil, fmt.Errorf("answer to %d, want %d", got, corr)
	}
	n := int64(binary.BigEndian.Uint32(size[:])) - 4
	if !keep {
		_, err := io.CopyN(io.Discard, nc, n)
		return nil, err
	}
	body := make([]byte, n)
	_, err := io.ReadFull(nc, body)
	return body, err
}

// allProduced checks a v13 Produce answer's body: every one of parts
// partitions answered without an error.
func allProduced(body []byte, parts int) error {
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = 13
	if len(body) == 0 {
		return errors.New("empty produce answer")
	}
	if err := resp.ReadFrom(body[1:]); err != nil { // after the header's tagged fields
		return err
	}
	n := 0
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return fmt.Errorf("partition %d answered %v", p.Partition, kerr.ErrorForCode(p.ErrorCode))
			}
			n++
		}
	}
	if n != parts {
		return fmt.Errorf("%d partitions answered, want %d", n, parts)
	}
	return nil
}

// cannedProduceListener answers every Produce request itself with success
// for each partition (the answer built once per request size), and passes
// every other request to the kfake broker behind it.
type cannedProduceListener struct{ net.Listener }

func (l *cannedProduceListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	c := &cannedProduceConn{Conn: nc, pr: pr, answers: map[int][]byte{}}
	go c.pump(pw)
	return c, nil
}

type cannedProduceConn struct {
	net.Conn
	pr      *io.PipeReader
	wmu     sync.Mutex
	answers map[int][]byte // by request size: the answer's body
}

func (c *cannedProduceConn) Read(p []byte) (int, error) { return c.pr.Read(p) }

func (c *cannedProduceConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.Conn.Write(p)
}

func (c *cannedProduceConn) Close() error {
	c.pr.Close()
	return c.Conn.Close()
}

func (c *cannedProduceConn) pump(pw *io.PipeWriter) {
	defer pw.Close()
	br := bufio.NewReaderSize(c.Conn, 64<<10)
	var frame, out []byte
	for {
		var size [4]byte
		if _, err := io.ReadFull(br, size[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(size[:]))
		frame = append(frame[:0], size[:]...)
		frame = append(frame, make([]byte, n)...)
		if _, err := io.ReadFull(br, frame[4:]); err != nil {
			return
		}
		hdr, err := protocol.ParseRequestHeader(frame[4:])
		if err != nil || hdr.Key != int16(kmsg.Produce) {
			if _, err := pw.Write(frame); err != nil {
				return
			}
			continue
		}
		body, ok := c.answers[n]
		if !ok {
			req := kmsg.NewPtrProduceRequest()
			req.Version = hdr.Version
			if err := req.ReadFrom(frame[4+hdr.Size:]); err != nil {
				return
			}
			resp := req.ResponseKind().(*kmsg.ProduceResponse)
			for _, t := range req.Topics {
				rt := kmsg.NewProduceResponseTopic()
				rt.Topic, rt.TopicID = t.Topic, t.TopicID
				for _, p := range t.Partitions {
					rp := kmsg.NewProduceResponseTopicPartition()
					rp.Partition = p.Partition
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			body = resp.AppendTo(nil)
			c.answers[n] = body
		}
		out = protocol.AppendResponseHeader(append(out[:0], 0, 0, 0, 0), hdr.Key, hdr.Version, hdr.CorrelationID)
		out = append(out, body...)
		binary.BigEndian.PutUint32(out, uint32(len(out)-4))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}
