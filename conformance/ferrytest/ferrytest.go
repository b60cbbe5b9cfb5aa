// Package ferrytest runs an in-process Ferry in front of physical clusters,
// for tests that drive real clients through it.
package ferrytest

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// Ferry is a running in-process Ferry.
type Ferry struct {
	Server   *proxy.Server
	Addr     string   // host:port clients bootstrap from (lane 0)
	Addrs    []string // every lane's host:port
	Registry *prometheus.Registry
}

// Start runs a Ferry in front of the cluster at bootstrap (a comma-separated
// list) until the test ends, with one loopback listener per lane.
func Start(t testing.TB, bootstrap string, opts ...proxy.Option) *Ferry {
	t.Helper()
	reg := prometheus.NewRegistry()
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1})
	base := []proxy.Option{
		proxy.WithClusterID("ferry-conformance"),
		proxy.WithClusters(upstream.Config{Name: "primary", Bootstrap: strings.Split(bootstrap, ",")}),
		proxy.WithBrokerSet(fleet),
		proxy.WithLogger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))),
		proxy.WithRegisterer(reg),
	}
	s, err := proxy.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("ferry: %v", err)
	}
	lns, ports := Listen(t, s.Lanes())
	fleet.Set([]routing.Broker{{NodeID: 0, Host: "127.0.0.1", Port: ports[0], LanePorts: ports}})
	for i, ln := range lns {
		go s.ServeLane(ln, i)
	}
	f := &Ferry{Server: s, Addr: lns[0].Addr().String(), Registry: reg}
	for _, ln := range lns {
		f.Addrs = append(f.Addrs, ln.Addr().String())
	}
	return f
}

// Listen opens n loopback listeners on free ports, closed when the test
// ends.
func Listen(t testing.TB, n int) ([]net.Listener, []int32) {
	t.Helper()
	lns := make([]net.Listener, n)
	ports := make([]int32, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		lns[i], ports[i] = ln, int32(ln.Addr().(*net.TCPAddr).Port)
	}
	return lns, ports
}
