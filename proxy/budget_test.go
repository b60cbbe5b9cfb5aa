package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// A large frame buffer is dropped when put back, not kept for good; a small
// one is still reused.
func TestLargeBuffersAreNotPooled(t *testing.T) {
	for name, pool := range map[string]*upstream.FramePool{"requests": &upstream.RequestBufs, "responses": &upstream.ResponseBufs, "encoded": &upstream.EncodedBufs} {
		t.Run(name, func(t *testing.T) {
			big := pool.Get()
			big.B = make([]byte, 4<<20)
			pool.Put(big)
			for range 100 {
				if b := pool.Get(); cap(b.B) >= 4<<20 {
					t.Fatalf("a buffer of %d bytes came back from the pool", cap(b.B))
				}
			}
		})
	}
}

func TestBufferBudgetOptions(t *testing.T) {
	base := []Option{WithClusterID("c"), WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "h", Port: 1})), WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"x:1"}})}
	for _, tc := range []struct {
		conn, proc int64
		want       string
	}{
		{1000, 1 << 20, "buffer budget per connection 1000 is below 65536"},
		{8 << 20, 4 << 20, "buffer budget 4194304 is below the budget per connection 8388608"},
		{64 << 10, 64 << 10, ""},
	} {
		s, err := New(append(base, WithBufferBudget(tc.conn, tc.proc))...)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("budgets %d, %d: %v", tc.conn, tc.proc, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("budgets %d, %d: error %v, want %q", tc.conn, tc.proc, err, tc.want)
		}
		if s != nil {
			s.Close()
		}
	}
}

// memTopic is what the budget tests fetch: records of recordSize bytes in
// batches of about 64 KiB, each value naming its offset.
const (
	memRecords   = 160
	recordSize   = 16 << 10
	answerMax    = 256 << 10 // a fetch's MaxBytes and PartitionMaxBytes
	answerMaxish = answerMax + 80<<10
)

func memValue(offset int64) []byte {
	v := bytes.Repeat([]byte{byte(offset)}, recordSize)
	copy(v, fmt.Sprintf("offset %d.", offset))
	return v
}

// memCluster is a one-broker cluster holding memTopic ("mem", written
// directly) and an empty topic "other"; fetches counts the raw clients'
// fetches that reached it.
func memCluster(t *testing.T) (kf *kfake.Cluster, fetches *atomic.Int64) {
	kf = newKfake(t, 1, kfake.SeedTopics(1, "mem", "other"))
	fetches = new(atomic.Int64)
	kf.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if fr := r.(*kmsg.FetchRequest); len(fr.Topics) == 1 && fr.Topics[0].Partitions[0].PartitionMaxBytes == answerMax {
			fetches.Add(1)
		}
		return nil, nil, false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prod := newClient(t, kf.ListenAddrs()[0], kgo.DefaultProduceTopic("mem"), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerBatchMaxBytes(64<<10), kgo.ProducerLinger(10*time.Millisecond))
	for o := range int64(memRecords) {
		prod.Produce(ctx, &kgo.Record{Value: memValue(o)}, func(r *kgo.Record, err error) {
			if err != nil || r.Offset != o {
				t.Errorf("record %d produced at %d: %v", o, r.Offset, err)
			}
		})
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return kf, fetches
}

// startFerrySmallSends is startFerry with each client connection's kernel
// send buffer kept small, so that what a client does not read stays in
// Ferry's memory, where the budgets apply, rather than in the kernel's.
func startFerrySmallSends(t *testing.T, bootstrap []string, opts ...Option) (*Server, string) {
	t.Helper()
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1})
	s, err := New(append([]Option{WithClusterID("ferry-test"), WithClusters(upstream.Config{Name: "a", Bootstrap: bootstrap}), WithBrokerSet(fleet),
		WithLogger(zaptest.NewLogger(t)), WithRegisterer(prometheus.NewRegistry())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Lanes() != 1 {
		t.Fatalf("%d lanes, want 1", s.Lanes())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	fleet.Set([]routing.Broker{{NodeID: 0, Host: "127.0.0.1", Port: port, LanePorts: []int32{port}}})
	go s.Serve(smallSends{ln.(*net.TCPListener)})
	return s, ln.Addr().String()
}

type smallSends struct{ *net.TCPListener }

func (l smallSends) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err == nil {
		c.SetWriteBuffer(16 << 10)
	}
	return c, err
}

// pipeliner is a raw client that sends fetches without reading answers.
type pipeliner struct {
	t       *testing.T
	c       net.Conn
	offsets []int64
}

// dialPipeliner connects with a small receive buffer, so that what the
// client does not read stays in Ferry rather than in the kernel.
func dialPipeliner(t *testing.T, addr string) *pipeliner {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
		})
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return &pipeliner{t: t, c: c}
}

// send pipelines n fetches of "mem" at spread offsets.
func (p *pipeliner) send(n int) {
	for i := range n {
		o := int64(i*7) % (memRecords - 40)
		fr := kmsg.NewPtrFetchRequest()
		fr.Version, fr.ReplicaID, fr.MaxWaitMillis, fr.MinBytes, fr.MaxBytes, fr.SessionEpoch = 12, -1, 100, 1, answerMax, -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = "mem"
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.FetchOffset, rp.PartitionMaxBytes, rp.CurrentLeaderEpoch = o, answerMax, -1
		rt.Partitions = append(rt.Partitions, rp)
		fr.Topics = append(fr.Topics, rt)
		writeReq(p.t, p.c, fr, int32(len(p.offsets)))
		p.offsets = append(p.offsets, o)
	}
}

// readAnswers reads every answer and checks it: in order, and the records
// from the fetch offset on are those produced there.
func (p *pipeliner) readAnswers() error {
	for i, o := range p.offsets {
		var size [4]byte
		if _, err := io.ReadFull(p.c, size[:]); err != nil {
			return fmt.Errorf("answer %d: %w", i, err)
		}
		b := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(p.c, b); err != nil {
			return fmt.Errorf("answer %d: %w", i, err)
		}
		if corr := int32(binary.BigEndian.Uint32(b)); corr != int32(i) {
			return fmt.Errorf("answer %d has correlation ID %d", i, corr)
		}
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(12)
		if err := resp.ReadFrom(b[protocol.ResponseHeaderSize(1, 12):]); err != nil {
			return fmt.Errorf("answer %d: %w", i, err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 || resp.Topics[0].Partitions[0].ErrorCode != 0 {
			return fmt.Errorf("answer %d: %+v", i, resp)
		}
		next := o
		for recs := resp.Topics[0].Partitions[0].RecordBatches; len(recs) > 0; {
			var rb kmsg.RecordBatch
			if err := rb.ReadFrom(recs); err != nil {
				return fmt.Errorf("answer %d: batch: %w", i, err)
			}
			recs = recs[12+int(rb.Length):]
			raw := rb.Records
			for range rb.NumRecords {
				l, m := binary.Varint(raw)
				var r kmsg.Record
				if err := r.ReadFrom(raw[:m+int(l)]); err != nil {
					return fmt.Errorf("answer %d: record: %w", i, err)
				}
				raw = raw[m+int(l):]
				off := rb.FirstOffset + int64(r.OffsetDelta)
				if off < o {
					continue
				}
				if off != next || !bytes.Equal(r.Value, memValue(off)) {
					return fmt.Errorf("answer %d (fetch at %d): record at %d, want %d with its value", i, o, off, next)
				}
				next++
			}
		}
		if next == o {
			return fmt.Errorf("answer %d (fetch at %d): no records", i, o)
		}
	}
	return nil
}

// TestClientThatDoesNotReadIsHeldToItsBudget: a client pipelining 64 large
// fetches without reading them makes Ferry hold no more than its
// per-connection budget (plus the answers it may exceed it by): the answers
// of the fetches Ferry read before the budget filled are not read ahead
// of the client, and once it is full, the client's further fetches are not
// read (nor sent upstream). Another client is served meanwhile; the first
// gets every answer, right, once it reads; and when it leaves, nothing is
// held.
func TestClientThatDoesNotReadIsHeldToItsBudget(t *testing.T) {
	kf, fetches := memCluster(t)
	const connBudget = 2 << 20
	s, addr := startFerrySmallSends(t, kf.ListenAddrs(), WithSpliceFetches(false), WithBufferBudget(connBudget, 64<<20))
	held := func() float64 { return testutil.ToFloat64(s.metrics.buffered) }
	// The budget, the answer that crossed it, and the one the writer waits
	// for (fetches go out on up to four connections, so answers come back
	// out of order); the other client's few bytes.
	const bound = connBudget + 2*answerMaxish + 64<<10

	p := dialPipeliner(t, addr)
	const n = 64
	const first = 16 // 4 MiB of answers
	p.send(first)
	testwait.Until(t, 30*time.Second, "Ferry never filled the connection's budget", func() bool { return held() >= connBudget })
	p.send(n - first)
	if got := fetches.Load(); got > first {
		t.Fatalf("%d fetches went upstream, %d of them sent after the client's budget was full", got, got-first)
	}
	if h := held(); h > bound {
		t.Fatalf("Ferry holds %.0f bytes for a client with a budget of %d", h, connBudget)
	}

	// Another client is served meanwhile.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := newClient(t, addr, kgo.DefaultProduceTopic("other"), kgo.ConsumeTopics("other"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for i := range 5 {
		r := &kgo.Record{Value: []byte(fmt.Sprint(i))}
		if err := other.ProduceSync(ctx, r).FirstErr(); err != nil || r.Offset != int64(i) {
			t.Fatalf("produce %d: offset %d, %v", i, r.Offset, err)
		}
	}
	for got := 0; got < 5; {
		fs := other.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the other client read %d of 5 records while the first did not read", got)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset != int64(got) || string(r.Value) != fmt.Sprint(got) {
				t.Fatalf("read %q at %d, want %d", r.Value, r.Offset, got)
			}
			got++
		})
	}
	other.Close()
	if h := held(); h > bound {
		t.Fatalf("Ferry holds %.0f bytes for a client with a budget of %d", h, connBudget)
	}
	if got := fetches.Load(); got > first {
		t.Fatalf("%d fetches went upstream, %d of them sent after the client's budget was full", got, got-first)
	}
	t.Logf("while the client did not read: %.0f bytes held, %d of its %d fetches sent upstream, %.0f bytes written to it", held(), fetches.Load(), n, testutil.ToFloat64(s.metrics.bytesOut))
	if testutil.ToFloat64(s.metrics.readPauses) == 0 {
		t.Fatal("no pause counted")
	}

	if err := p.readAnswers(); err != nil {
		t.Fatal(err)
	}
	if got := fetches.Load(); got != n {
		t.Fatalf("%d fetches went upstream, want %d", got, n)
	}
	p.c.Close()
	testwait.Until(t, 10*time.Second, "bytes still held after the client left", func() bool { return held() == 0 })
}

// TestClientsAreHeldToTheProcessBudget: several clients that do not read,
// each under its own budget, are held together to the process budget; each
// gets every answer, right, once it reads.
func TestClientsAreHeldToTheProcessBudget(t *testing.T) {
	kf, fetches := memCluster(t)
	const connBudget, procBudget = 2 << 20, 3 << 20
	s, addr := startFerrySmallSends(t, kf.ListenAddrs(), WithSpliceFetches(false), WithBufferBudget(connBudget, procBudget))
	held := func() float64 { return testutil.ToFloat64(s.metrics.buffered) }
	const clients, n = 4, 32
	const first = 6 // 1.5 MiB of answers each, 6 MiB in all
	// The budget, the answer that crossed it, and one answer per client
	// that its writer waits for.
	const bound = procBudget + (1+clients)*answerMaxish

	ps := make([]*pipeliner, clients)
	for i := range ps {
		ps[i] = dialPipeliner(t, addr)
		ps[i].send(first)
	}
	testwait.Until(t, 30*time.Second, "Ferry never filled the process budget", func() bool { return held() >= procBudget })
	for _, p := range ps {
		p.send(n - first)
	}
	// Every client is under its own budget, but no more is read from any.
	if h := held(); h > bound {
		t.Fatalf("Ferry holds %.0f bytes with a process budget of %d", h, procBudget)
	}
	t.Logf("while the clients did not read: %.0f bytes held, %d of their %d fetches sent upstream", held(), fetches.Load(), clients*n)
	if got := fetches.Load(); got > clients*first {
		t.Fatalf("%d fetches went upstream, %d of them sent after the process budget was full", got, got-clients*first)
	}

	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.readAnswers()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	if got := fetches.Load(); got != clients*n {
		t.Fatalf("%d fetches went upstream, want %d", got, clients*n)
	}
	for _, p := range ps {
		p.c.Close()
	}
	testwait.Until(t, 10*time.Second, "bytes still held after the clients left", func() bool { return held() == 0 })
}

// A request or an answer larger than both budgets is not refused: it is
// read when the connection and the process hold less than their budgets,
// and the client notices nothing.
func TestFramesLargerThanTheBudgetsPass(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "big"))
	s, addr := startFerry(t, kf.ListenAddrs(), WithSpliceFetches(false), WithBufferBudget(upstream.MinBufferBudget, upstream.MinBufferBudget))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr, kgo.DefaultProduceTopic("big"), kgo.ConsumeTopics("big"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerBatchMaxBytes(1<<20))
	for i := range 3 {
		r := &kgo.Record{Value: bytes.Repeat([]byte{byte(i)}, 512<<10)} // 8 times the budgets
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil || r.Offset != int64(i) {
			t.Fatalf("produce %d: offset %d, %v", i, r.Offset, err)
		}
	}
	for got := 0; got < 3; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of 3 records", got)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatal(err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset != int64(got) || !bytes.Equal(r.Value, bytes.Repeat([]byte{byte(got)}, 512<<10)) {
				t.Fatalf("record at %d, want %d with its value", r.Offset, got)
			}
			got++
		})
	}
	cl.Close()
	testwait.Until(t, 10*time.Second, "bytes still held after the client left", func() bool { return testutil.ToFloat64(s.metrics.buffered) == 0 })
}

// Waiting for a budget is Ferry's doing, not the client's: a request held
// back longer than the request read timeout is answered, not closed.
func TestBudgetWaitIsNotARequestTimeout(t *testing.T) {
	kf, _ := memCluster(t)
	const budget, readTimeout = 2 << 20, 200 * time.Millisecond
	s, addr := startFerrySmallSends(t, kf.ListenAddrs(), WithSpliceFetches(false), WithBufferBudget(budget, budget), WithRequestReadTimeout(readTimeout))
	a := dialPipeliner(t, addr)
	a.send(16) // fills the process budget
	testwait.Until(t, 30*time.Second, "Ferry never filled the process budget", func() bool { return testutil.ToFloat64(s.metrics.buffered) >= budget })

	// A request larger than Ferry reads ahead of a frame's size (32 KiB),
	// so its body is read from the socket after the wait.
	b := dialRaw(t, addr)
	pr := kmsg.NewPtrProduceRequest()
	pr.Version, pr.Acks, pr.TimeoutMillis = 9, 1, 5000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = "other"
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = make([]byte, 96<<10) // not a batch: refused by the broker, answered all the same
	pt.Partitions = append(pt.Partitions, pp)
	pr.Topics = append(pr.Topics, pt)
	writeReq(t, b, pr, 7)
	// Held back past the read timeout, three times over.
	time.Sleep(3 * readTimeout)
	b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var one [1]byte
	if n, err := b.Read(one[:]); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the second client was answered or closed (%d bytes, %v) while the process budget was full", n, err)
	}
	if err := a.readAnswers(); err != nil {
		t.Fatal(err)
	}
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if corr := int32(binary.BigEndian.Uint32(readResp(t, b))); corr != 7 {
		t.Fatalf("answer with correlation ID %d, want 7", corr)
	}
}
