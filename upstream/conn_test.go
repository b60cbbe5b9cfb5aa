package upstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/internal/testnet"
)

// testConn is a Conn over one end of a loopback TCP connection whose other
// end, returned, plays the broker.
func testConn(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	nc, broker := testnet.Pair(t)
	p := &brokerPool{u: &Cluster{opts: Options{MaxResponseSize: 64 << 20}, log: zap.NewNop()}, broker: 1}
	c := newUpConn(p, nc)
	t.Cleanup(func() {
		c.Close(ErrClosed)
		broker.Close()
	})
	return c, broker
}

// answer is a response frame: size, correlation ID, body.
func answer(corr int32, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	return append(b, body...)
}

// request sends a request frame with a correlation ID the connection sets.
func request(t *testing.T, c *Conn, stream bool) *Pending {
	t.Helper()
	frame := make([]byte, 8) // api key, version, correlation ID
	p, err := c.SendFrame(frame, true, stream, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAnswersReadAhead: answers that arrive together, read through the
// connection's buffer, each reach their request whole and in order, and a
// streamed answer whose first bytes the buffer read along with the answer
// before it is streamed complete: those bytes as its Prefix, the rest from
// the socket; the answer after it is read as before.
func TestAnswersReadAhead(t *testing.T) {
	c, broker := testConn(t)
	go io.Copy(io.Discard, broker) // the requests

	small1, small2 := []byte("first answer"), bytes.Repeat([]byte("s"), 3000)
	big := make([]byte, StreamMinBytes+12345)
	for i := range big {
		big[i] = byte(i * 7)
	}
	last := []byte("after the stream")

	p1, p2, p3, p4 := request(t, c, false), request(t, c, false), request(t, c, true), request(t, c, false)
	var all []byte
	all = append(all, answer(p1.corr, small1)...)
	all = append(all, answer(p2.corr, small2)...)
	all = append(all, answer(p3.corr, big)...)
	all = append(all, answer(p4.corr, last)...)
	if _, err := broker.Write(all); err != nil { // one write: the reader gets them together
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, w := range []struct {
		p    *Pending
		body []byte
	}{{p1, small1}, {p2, small2}} {
		buf, err := w.p.Wait(ctx)
		if err != nil {
			t.Fatalf("answer %d: %v", i+1, err)
		}
		if got := buf.B[4:]; !bytes.Equal(got, w.body) {
			t.Fatalf("answer %d: %d bytes %.20q, want %d bytes %.20q", i+1, len(got), got, len(w.body), w.body)
		}
	}
	if _, err := p3.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	st := p3.Streamed
	if st == nil {
		t.Fatal("a streamable answer over StreamMinBytes was read whole")
	}
	if st.Size != int64(len(big)) {
		t.Fatalf("streamed size %d, want %d", st.Size, len(big))
	}
	if len(st.Prefix) == 0 || len(st.Prefix) >= answerReadAhead {
		t.Fatalf("prefix of %d bytes: the buffer read ahead of the stream %d bytes at most, and some (one write)", len(st.Prefix), answerReadAhead)
	}
	got := append([]byte(nil), st.Prefix...)
	rest := make([]byte, st.Size-int64(len(st.Prefix)))
	if _, err := io.ReadFull(st.Conn.NetConn, rest); err != nil {
		t.Fatal(err)
	}
	got = append(got, rest...)
	st.Finish(nil)
	if !bytes.Equal(got, big) {
		t.Fatal("the streamed answer, prefix and socket, differs from what the broker sent")
	}
	buf, err := p4.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.B[4:], last) {
		t.Fatalf("answer after the stream: %q, want %q", buf.B[4:], last)
	}
}
