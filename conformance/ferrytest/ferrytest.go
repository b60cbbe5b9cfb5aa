// Package ferrytest runs an in-process Ferry in front of physical clusters,
// for tests that drive real clients through it.
package ferrytest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/proxy"
)

// Ferry is a running in-process Ferry.
type Ferry struct {
	Server   *proxy.Server
	Addr     string // host:port clients bootstrap from
	Registry *prometheus.Registry
}

// Start runs a Ferry in front of the cluster at bootstrap (a comma-separated
// list) until the test ends.
func Start(t testing.TB, bootstrap string, opts ...proxy.Option) *Ferry {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, portS, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portS)
	reg := prometheus.NewRegistry()
	base := []proxy.Option{
		proxy.WithClusterID("ferry-conformance"),
		proxy.WithClusters(proxy.Cluster{Name: "primary", Bootstrap: strings.Split(bootstrap, ",")}),
		proxy.WithFleet(proxy.NewStaticFleet(proxy.Broker{NodeID: 0, Host: host, Port: int32(port)})),
		proxy.WithLogger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))),
		proxy.WithRegisterer(reg),
	}
	s, err := proxy.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		s.Close()
		t.Fatalf("ferry: %v", err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return &Ferry{Server: s, Addr: ln.Addr().String(), Registry: reg}
}
