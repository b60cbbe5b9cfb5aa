//go:build linux

package splice

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/internal/testnet"
)

func raw(t *testing.T, c net.Conn) syscall.RawConn {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

func payload(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{7})
	r.Read(b)
	return b
}

// Bytes moved from one socket into a pipe and from it to another arrive
// as sent, in order, never having entered the process.
func TestFromThenTo(t *testing.T) {
	inW, inR := testnet.Pair(t)
	outW, outR := testnet.Pair(t)
	p, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	defer Put(p)
	want := payload(700 << 10)
	go func() { inW.Write(want) }()
	inR.SetReadDeadline(time.Now().Add(10 * time.Second))
	m, err := p.From(raw(t, inR), len(want))
	if err != nil || m != len(want) || p.Held() != m {
		t.Fatalf("From: moved %d of %d, held %d: %v", m, len(want), p.Held(), err)
	}
	got := make(chan []byte)
	go func() {
		b := make([]byte, len(want))
		io.ReadFull(outR, b)
		got <- b
	}()
	outW.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if n, err := p.To(raw(t, outW), m); err != nil || n != m || p.Held() != 0 {
		t.Fatalf("To: moved %d of %d, held %d: %v", n, m, p.Held(), err)
	}
	if !bytes.Equal(<-got, want) {
		t.Fatal("bytes arrived changed")
	}
}

// More than the pipe holds: From stops when it is full, without error or
// waiting, and the rest is still on the socket, in order.
func TestFromStopsWhenFull(t *testing.T) {
	for len(pool) > 0 { // room in the pool for the one given back below
		(<-pool).Close()
	}
	inW, inR := testnet.Pair(t)
	p, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	// More than 256 slots of the largest fragments (32 KiB).
	want := payload(12 << 20)
	go func() { inW.Write(want) }()
	inR.SetReadDeadline(time.Now().Add(10 * time.Second))
	m, err := p.From(raw(t, inR), len(want))
	if err != nil || m == 0 || m >= len(want) {
		t.Fatalf("moved %d of %d into a pipe: %v", m, len(want), err)
	}
	head := make([]byte, m)
	if err := p.ReadFull(head); err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, len(want)-m)
	if _, err := io.ReadFull(inR, rest); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(append(head, rest...), want) {
		t.Fatal("bytes read back from the pipe and the socket differ from those sent")
	}
	Put(p) // empty: pooled
	if q, _ := Get(); q != p {
		t.Fatal("an emptied pipe was not reused")
	}
}

// A peer that sends less than promised: From waits under the socket's
// deadline; a peer that closes gives io.ErrUnexpectedEOF.
func TestFromDeadlineAndEOF(t *testing.T) {
	inW, inR := testnet.Pair(t)
	p, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	inW.Write(payload(1000))
	inR.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	m, err := p.From(raw(t, inR), 5000)
	if !errors.Is(err, os.ErrDeadlineExceeded) || m != 1000 {
		t.Fatalf("moved %d: %v, want 1000 then the deadline", m, err)
	}
	inW.Close()
	inR.SetReadDeadline(time.Now().Add(10 * time.Second))
	if m, err := p.From(raw(t, inR), 4000); !errors.Is(err, io.ErrUnexpectedEOF) || m != 0 {
		t.Fatalf("moved %d: %v, want unexpected EOF", m, err)
	}
	// A pipe still holding bytes is closed, not pooled.
	held := p
	Put(held)
	if q, _ := Get(); q == held {
		t.Fatal("a pipe holding bytes was pooled")
	}
}

func TestToMoreThanHeld(t *testing.T) {
	outW, _ := testnet.Pair(t)
	p, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	defer Put(p)
	if _, err := p.To(raw(t, outW), 1); err == nil {
		t.Fatal("moved a byte out of an empty pipe")
	}
	if err := p.ReadFull(make([]byte, 1)); err == nil {
		t.Fatal("read a byte out of an empty pipe")
	}
}

// No more than MaxInUse pipes are out at once; one given back is there
// for the next.
func TestMaxInUse(t *testing.T) {
	var out []*Pipe
	defer func() {
		for _, p := range out {
			Put(p)
		}
	}()
	for free := MaxInUse - int(inUse.Load()); len(out) < free; {
		p, err := Get()
		if err != nil {
			t.Fatalf("pipe %d: %v", len(out), err)
		}
		out = append(out, p)
	}
	if _, err := Get(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Get past MaxInUse: %v, want ErrBusy", err)
	}
	Put(out[0])
	p, err := Get()
	if err != nil {
		t.Fatalf("Get after one was given back: %v", err)
	}
	out[0] = p
}
