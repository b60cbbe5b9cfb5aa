package proxy

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// failingListener fails its first Accepts with errs, then accepts from the
// real listener.
type failingListener struct {
	net.Listener
	errs chan error
}

func (l *failingListener) Accept() (net.Conn, error) {
	select {
	case err := <-l.errs:
		return nil, err
	default:
		return l.Listener.Accept()
	}
}

// Running out of file descriptors does not end Serve: each failure is
// counted, the log says so once, and the next client is served.
func TestAcceptErrorsRetried(t *testing.T) {
	kf := newKfake(t, 1)
	core, logs := observer.New(zap.WarnLevel)
	s, err := New(WithClusterID("c"), WithClusters(upstream.Config{Name: "a", Bootstrap: kf.ListenAddrs()}),
		WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1})),
		WithLogger(zap.New(core)), WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: ln, errs: make(chan error, 10)}
	accept := func(errno syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
	}
	for range 5 {
		fl.errs <- accept(syscall.EMFILE)
	}
	fl.errs <- accept(syscall.ENFILE)
	fl.errs <- accept(syscall.ECONNABORTED)
	served := make(chan error, 1)
	go func() { served <- s.Serve(fl) }()

	// Once the errors are used up, a client connects and is served (the
	// connection is counted when accepted).
	c := dialRaw(t, ln.Addr().String())
	defer c.Close()
	testwait.Eventually(t, 10*time.Second, "the client is accepted", func() error {
		if got := testutil.ToFloat64(s.metrics.connsTotal); got != 1 {
			return fmt.Errorf("ferry_client_connections_total = %v", got)
		}
		return nil
	})
	for reason, want := range map[string]float64{"emfile": 5, "enfile": 1, "econnaborted": 1} {
		if got := testutil.ToFloat64(s.connMetrics.acceptErrors(reason)); got != want {
			t.Errorf(`ferry_accept_errors_total{reason=%q} = %v, want %v`, reason, got, want)
		}
	}
	if n := logs.FilterMessage("accepting a client connection failed; retrying").Len(); n != 1 {
		t.Errorf("%d log lines for 7 accept errors within seconds, want 1", n)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v", err)
	default:
	}

	// An error retrying cannot fix still ends Serve.
	fl.errs <- accept(syscall.EINVAL)
	c2 := dialRaw(t, ln.Addr().String()) // wakes the blocked Accept
	defer c2.Close()
	select {
	case err := <-served:
		if err == nil || err == ErrServerClosed {
			t.Fatalf("Serve returned %v, want the EINVAL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve kept retrying EINVAL")
	}
}
