package mirror

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestDialGate: a writer's connection to a broker holds a place at the dial
// gate from its dial to its first response (or its close), and at most
// newConnsPerBroker are held per broker: the next dial to that broker waits
// until one is answered, while a dial to another broker does not.
func TestDialGate(t *testing.T) {
	// A broker that reads requests and answers one only when told to.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	accepted := make(chan net.Conn, 2*newConnsPerBroker)
	for _, l := range []net.Listener{ln, other} {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var gate dialGate
	links := make([]*link, newConnsPerBroker)
	for i := range links {
		links[i] = newLink(ln.Addr().String(), nil, nil, &gate)
		c, err := links[i].conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer links[i].Close()
		c.Send(kmsg.NewPtrApiVersionsRequest())
	}
	// The gate is full for this broker: the next dial waits.
	next := newLink(ln.Addr().String(), nil, nil, &gate)
	defer next.Close()
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = next.conn(short)
	stop()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial past %d unanswered connections: %v, want it to wait", newConnsPerBroker, err)
	}
	// Another broker is not held up.
	elsewhere := newLink(other.Addr().String(), nil, nil, &gate)
	defer elsewhere.Close()
	if _, err := elsewhere.conn(short); err == nil {
		t.Fatal("the other broker's dial ran on an ended context")
	}
	if _, err := elsewhere.conn(ctx); err != nil {
		t.Fatalf("a dial to another broker: %v", err)
	}

	// One connection answered (a frame with its correlation ID, 1): its
	// place is given back.
	srv := <-accepted
	var answered *link
	for _, l := range links {
		if l.c.nc.LocalAddr().String() == srv.RemoteAddr().String() {
			answered = l
		}
	}
	resp := make([]byte, 4+4+2+4) // size, correlation ID, error code, no API keys
	binary.BigEndian.PutUint32(resp, uint32(len(resp)-4))
	binary.BigEndian.PutUint32(resp[4:], 1)
	if _, err := srv.Write(resp); err != nil {
		t.Fatal(err)
	}
	answered.c.readOne()
	if answered.c.err != nil {
		t.Fatalf("the answer: %v", answered.c.err)
	}
	if _, err := next.conn(ctx); err != nil {
		t.Fatalf("dial after a connection was answered: %v", err)
	}
	// A closed connection gives its place back too.
	third := newLink(ln.Addr().String(), nil, nil, &gate)
	defer third.Close()
	for _, l := range links {
		if l != answered {
			l.Close()
			break
		}
	}
	if _, err := third.conn(ctx); err != nil {
		t.Fatalf("dial after a connection was closed: %v", err)
	}
}
