//go:build faults

package clusterauth

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// In a member built for fault injection (go build -tags faults, as the
// tests that cut one member off from a cluster do), every connection to a
// cluster can be cut: FERRY_FAULT_CUT_FILE names a file listing broker
// addresses (host:port as the brokers advertise them, separated by
// whitespace), read every 100 ms. A dial to a listed address fails at once;
// a connection open to one is closed as soon as it is listed. Every
// connection Ferry opens to a cluster comes through here (Dial and the
// franz-go clients' dialer), so the member is cut off whole: client
// traffic, the mirror, the routing state's reads and the write lease.

var cuts = newCutter(os.Getenv("FERRY_FAULT_CUT_FILE"))

type cutter struct {
	mu    sync.Mutex
	cut   map[string]bool
	conns map[string]map[*cutConn]struct{}
}

func newCutter(path string) *cutter {
	c := &cutter{cut: map[string]bool{}, conns: map[string]map[*cutConn]struct{}{}}
	if path != "" {
		go c.watch(path)
	}
	return c
}

// watch reads the file for as long as the process lives.
func (c *cutter) watch(path string) {
	for range time.Tick(100 * time.Millisecond) {
		b, _ := os.ReadFile(path) // absent: nothing is cut
		now := map[string]bool{}
		for _, a := range strings.Fields(string(b)) {
			now[a] = true
		}
		c.mu.Lock()
		var closing []*cutConn
		for a := range now {
			for cc := range c.conns[a] {
				closing = append(closing, cc)
			}
		}
		c.cut = now
		c.mu.Unlock()
		for _, cc := range closing {
			cc.Close()
		}
	}
}

func (c *cutter) isCut(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut[addr]
}

// dialTCP is d.DialContext, refused for an address cut off.
func dialTCP(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	if cuts.isCut(addr) {
		return nil, fmt.Errorf("dial %s: fault injection: cut off", addr)
	}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cc := &cutConn{Conn: nc, c: cuts, addr: addr}
	cuts.mu.Lock()
	defer cuts.mu.Unlock()
	if cuts.cut[addr] {
		nc.Close()
		return nil, fmt.Errorf("dial %s: fault injection: cut off", addr)
	}
	if cuts.conns[addr] == nil {
		cuts.conns[addr] = map[*cutConn]struct{}{}
	}
	cuts.conns[addr][cc] = struct{}{}
	return cc, nil
}

// cutConn is a connection the cutter can close.
type cutConn struct {
	net.Conn
	c    *cutter
	addr string
	once sync.Once
}

func (cc *cutConn) Close() error {
	cc.once.Do(func() {
		cc.c.mu.Lock()
		delete(cc.c.conns[cc.addr], cc)
		cc.c.mu.Unlock()
	})
	return cc.Conn.Close()
}

// plainDialer is, for a cluster without TLS, a franz-go dialer through
// dialTCP (franz-go's own would not pass here).
func plainDialer() []kgo.Opt {
	return []kgo.Opt{kgo.Dialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
		return dialTCP(ctx, &d, network, addr)
	})}
}
