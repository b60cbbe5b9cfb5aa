package upstream

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/bytebufferpool"

	"github.com/ferry-gw/ferry/protocol"
)

// testGauges stand for the server's ferry_buffered_bytes and
// ferry_read_pauses_total.
type testGauges struct {
	buffered   prometheus.Gauge
	readPauses prometheus.Counter
}

func newTestGauges() testGauges {
	return testGauges{prometheus.NewGauge(prometheus.GaugeOpts{Name: "buffered"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "pauses"})}
}

// The budget's rules, one at a time: a connection under its budget is
// admitted whole even past it; over it, requests and answers wait until a
// release; the answer the writer waits for is read anyway; an abandoned one
// is not; closing releases everything.
func TestBudgetRules(t *testing.T) {
	m := newTestGauges()
	b := NewBudget(150, 100, m.buffered, m.readPauses)
	held := func() float64 { return testutil.ToFloat64(m.buffered) }
	ctx := context.Background()
	c1, c2 := b.Conn(0), b.Conn(0)
	// Empty buffers: what a pooled one holds already is charged too
	// (TestBudgetChargesTheMemoryHeld).
	r1, r2, r3 := new(bytebufferpool.ByteBuffer), new(bytebufferpool.ByteBuffer), new(bytebufferpool.ByteBuffer)

	if _, err := c1.Admit(ctx, r1, 90); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Admit(ctx, r2, 500); err != nil { // under budget: taken whole
		t.Fatal(err)
	}
	if held() != 590 {
		t.Fatalf("held %v, want 590", held())
	}
	// c1 over its budget, and the process over its own: c2 waits too.
	admitted := make(chan error, 1)
	go func() {
		_, err := c2.Admit(ctx, r3, 10)
		admitted <- err
	}()
	a := &Pending{Mem: c1}
	ans := new(bytebufferpool.ByteBuffer)
	answered := make(chan bool, 1)
	go func() { answered <- c1.AdmitAnswer(a, ans, 20, nil) }()
	select {
	case <-admitted:
		t.Fatal("a request admitted over the process budget")
	case <-answered:
		t.Fatal("an answer admitted over the connection's budget")
	case <-time.After(50 * time.Millisecond):
	}
	a.Want() // the writer waits for it
	if ok := <-answered; !ok || held() != 610 {
		t.Fatalf("the answer the writer waits for: admitted %v, held %v", ok, held())
	}
	// An abandoned answer is read past, not held.
	ab := &Pending{Mem: c1}
	abandoned := make(chan bool, 1)
	go func() { abandoned <- c1.AdmitAnswer(ab, new(bytebufferpool.ByteBuffer), 30, nil) }()
	ab.Abandon()
	if ok := <-abandoned; ok {
		t.Fatal("an abandoned answer admitted")
	}
	RequestBufs.Put(r2) // c1 holds 110, the process 110: c2 may go
	if err := <-admitted; err != nil || held() != 120 {
		t.Fatalf("after a release: %v, held %v", err, held())
	}
	// A closed connection's buffers hold nothing, before or after they
	// are put back.
	c1.Close()
	if held() != 10 {
		t.Fatalf("held %v after the connection closed, want c2's 10", held())
	}
	ResponseBufs.Put(ans)
	RequestBufs.Put(r1)
	RequestBufs.Put(r3)
	if held() != 0 {
		t.Fatalf("held %v, want 0", held())
	}
}

// TestBudgetChargesTheMemoryHeld: ferry_buffered_bytes counts the memory a
// frame's buffer holds once the frame is read into it, request or answer,
// not only the frame's size: a small frame given a pooled buffer that a
// large one grew (the pools keep buffers up to 1 MiB) must not hold that
// memory uncounted.
func TestBudgetChargesTheMemoryHeld(t *testing.T) {
	m := newTestGauges()
	b := NewBudget(64<<20, 64<<20, m.buffered, m.readPauses)
	c := b.Conn(0)
	for _, tc := range []struct {
		name        string
		capacity, n int
	}{
		{"a small frame in a large pooled buffer", 1 << 20, 100},
		{"a frame in a buffer a little larger", 150 << 10, 100 << 10},
		{"a tiny frame in a small pooled buffer", 2 << 10, 10},
		{"a frame larger than its buffer", 4 << 10, 300 << 10},
	} {
		for _, answer := range []bool{false, true} {
			buf := &bytebufferpool.ByteBuffer{B: make([]byte, 0, tc.capacity)}
			if answer {
				if !c.AdmitAnswer(&Pending{Mem: c}, buf, tc.n, nil) {
					t.Fatalf("%s: answer not admitted", tc.name)
				}
			} else if _, err := c.Admit(context.Background(), buf, tc.n); err != nil {
				t.Fatal(err)
			}
			if err := protocol.ReadFrameBody(bytes.NewReader(make([]byte, tc.n)), tc.n, buf); err != nil {
				t.Fatal(err)
			}
			if got := testutil.ToFloat64(m.buffered); got != float64(cap(buf.B)) {
				t.Errorf("%s (answer %v): ferry_buffered_bytes %v, the buffer holds %d bytes", tc.name, answer, got, cap(buf.B))
			}
			ReleaseBuf(buf)
		}
	}
}
