package benchutil

import (
	"net"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"sync"
	"sync/atomic"
	"time"
)

// DelayRelay forwards TCP connections to a target and delays every byte by
// half a round-trip time in each direction, without limiting bandwidth: a
// cluster a region away, on loopback. Bytes are read as they come, stamped,
// and written once their time has come, so a stream of requests stays a
// stream (a relay that waited per request would measure itself). The
// round-trip time can be changed between runs (SetRTT); a connection open
// then keeps the time it had for the bytes already read.
type DelayRelay struct {
	ln     net.Listener
	oneWay atomic.Int64 // nanoseconds

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

// ListenDelayRelay listens on a loopback port; Serve forwards.
func ListenDelayRelay(rtt time.Duration) (*DelayRelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &DelayRelay{ln: ln, conns: map[net.Conn]bool{}}
	r.SetRTT(rtt)
	return r, nil
}

// Addr is where clients connect.
func (r *DelayRelay) Addr() string { return r.ln.Addr().String() }

// Port is Addr's port.
func (r *DelayRelay) Port() int { return r.ln.Addr().(*net.TCPAddr).Port }

// SetRTT sets the round-trip time added from now on.
func (r *DelayRelay) SetRTT(rtt time.Duration) { r.oneWay.Store(int64(rtt / 2)) }

// Serve accepts connections and forwards each to target until Close.
func (r *DelayRelay) Serve(target string) {
	r.wg.Go(func() {
		for {
			c, err := r.ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			if !r.track(c, u) {
				return
			}
			r.wg.Go(func() {
				defer r.untrack(c, u)
				done := make(chan struct{})
				go func() {
					r.pipe(u, c)
					close(done)
				}()
				r.pipe(c, u)
				<-done
			})
		}
	})
}

func (r *DelayRelay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		r.conns[c] = true
	}
	return true
}

func (r *DelayRelay) untrack(cs ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(r.conns, c)
	}
}

// pipe copies src to dst, each chunk written one way's delay after it was
// read. The queue between the two holds what is in flight on the
// "wire": at 200 MB/s and 50 ms one way, 10 MB.
func (r *DelayRelay) pipe(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(time.Duration(r.oneWay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			for range q {
			}
			return
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// DelayedListener is the broker listener a 1-broker cluster behind a
// DelayRelay has: advertised at the relay, so that a client bootstrapped
// there reaches the broker only through it.
const DelayedListener = "DELAYED"

// Listener is the DelayedListener to add to the cluster's configuration
// before it starts; ServeCluster then forwards to it.
func (r *DelayRelay) Listener() kafkatest.Listener {
	return kafkatest.Listener{Name: DelayedListener, Advertise: func(int32) string { return r.Addr() }}
}

// ServeCluster forwards to the DelayedListener of c's (one) broker.
func (r *DelayRelay) ServeCluster(c *kafkatest.Cluster) {
	r.Serve(c.ListenerAddr(DelayedListener, c.NodeIDs()[0]))
}

// Close stops accepting, closes every connection and waits for the
// forwarding to end. Safe to call more than once.
func (r *DelayRelay) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		r.ln.Close()
		for c := range r.conns {
			c.Close()
		}
	}
	r.mu.Unlock()
	r.wg.Wait()
}
