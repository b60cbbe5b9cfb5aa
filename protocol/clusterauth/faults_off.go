//go:build !faults

package clusterauth

import (
	"context"
	"net"

	"github.com/twmb/franz-go/pkg/kgo"
)

// dialTCP is d.DialContext in a member not built for fault injection (see
// faults.go).
func dialTCP(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	return d.DialContext(ctx, network, addr)
}

// plainDialer is none, franz-go's own, in a member not built for fault
// injection.
func plainDialer() []kgo.Opt { return nil }
