package benchutil

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestDelayRelay: an echo through the relay takes at least its round-trip
// time, and twenty messages written back to back come back in about one
// round trip, not twenty (the relay delays, it does not wait per message).
func TestDelayRelay(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	const rtt = 200 * time.Millisecond
	r, err := ListenDelayRelay(rtt)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Serve(echo.Addr().String())

	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	msg := []byte("0123456789")
	for range 20 {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, 20*len(msg))
	if _, err := io.ReadFull(c, got[:len(msg)]); err != nil {
		t.Fatal(err)
	}
	if first := time.Since(start); first < rtt {
		t.Fatalf("the first echo came back after %v, under the round trip %v", first, rtt)
	}
	if _, err := io.ReadFull(c, got[len(msg):]); err != nil {
		t.Fatal(err)
	}
	if all := time.Since(start); all > 10*rtt {
		t.Fatalf("twenty messages came back after %v: the relay waits per message (each would add %v)", all, rtt)
	}
	for i := range 20 {
		if string(got[i*len(msg):(i+1)*len(msg)]) != string(msg) {
			t.Fatalf("echo %d is %q", i, got[i*len(msg):(i+1)*len(msg)])
		}
	}
	r.SetRTT(0)
	c2, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	start = time.Now()
	if _, err := c2.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c2, got[:len(msg)]); err != nil {
		t.Fatal(err)
	}
	// SetRTT(0) took effect: well under the 200 ms it was.
	if d := time.Since(start); d >= rtt || string(got[:len(msg)]) != string(msg) {
		t.Fatalf("after SetRTT(0): echo %q after %v", got[:len(msg)], d)
	}
}
