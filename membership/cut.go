package membership

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// errCut is what a dial of a cut-off member returns.
var errCut = errors.New("gossip cut off (fault injection)")

// CutTransport is memberlist's network transport with a switch that cuts
// the member off from every other member's gossip and calls, in both
// directions, while its Kafka clients and clusters are untouched: the
// fault of a member on the wrong side of a network partition. It exists
// for fault injection (the chaos run builds Ferry with it); a member in
// production never cuts itself off.
type CutTransport struct {
	inner   *memberlist.NetTransport
	cut     atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

var _ memberlist.NodeAwareTransport = (*CutTransport)(nil)

// NewCutTransport listens as memberlist's own transport would on bind
// (host:port, default 0.0.0.0:7946; port 0 picks one, which Port then
// says).
func NewCutTransport(bind string) (*CutTransport, error) {
	if bind == "" {
		bind = defaultBind
	}
	host, port, err := splitHostPort(bind)
	if err != nil {
		return nil, err
	}
	inner, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port})
	if err != nil {
		return nil, err
	}
	t := &CutTransport{
		inner:   inner,
		packets: make(chan *memberlist.Packet),
		streams: make(chan net.Conn),
		stop:    make(chan struct{}),
	}
	t.wg.Go(t.passPackets)
	t.wg.Go(t.passStreams)
	return t, nil
}

// Cut cuts the member off (true) or joins it up again (false).
func (t *CutTransport) Cut(on bool) { t.cut.Store(on) }

// Port is the port bound (the one picked for port 0).
func (t *CutTransport) Port() int { return t.inner.GetAutoBindPort() }

func (t *CutTransport) passPackets() {
	for {
		select {
		case p := <-t.inner.PacketCh():
			if t.cut.Load() {
				continue
			}
			select {
			case t.packets <- p:
			case <-t.stop:
				return
			}
		case <-t.stop:
			return
		}
	}
}

func (t *CutTransport) passStreams() {
	for {
		select {
		case c := <-t.inner.StreamCh():
			if t.cut.Load() {
				c.Close()
				continue
			}
			select {
			case t.streams <- c:
			case <-t.stop:
				c.Close()
				return
			}
		case <-t.stop:
			return
		}
	}
}

func (t *CutTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

func (t *CutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.cut.Load() {
		return time.Now(), nil // lost on the way, as UDP may
	}
	return t.inner.WriteTo(b, addr)
}

func (t *CutTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, addr.Addr)
}

func (t *CutTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *CutTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.cut.Load() {
		return nil, errCut
	}
	return t.inner.DialTimeout(addr, timeout)
}

func (t *CutTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(addr.Addr, timeout)
}

func (t *CutTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes the listeners; memberlist calls it once, Close may too.
func (t *CutTransport) Shutdown() error {
	var err error
	t.once.Do(func() {
		err = t.inner.Shutdown()
		close(t.stop)
		t.wg.Wait()
	})
	return err
}
