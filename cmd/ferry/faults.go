//go:build faults

package main

import (
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/membership"
)

// gossipTransport is, in a member built for fault injection (go build
// -tags faults, as the chaos run does), a gossip transport that SIGUSR1
// cuts off from the other members (gossip and calls, both ways) and
// SIGUSR2 joins up again, while clients and clusters stay reachable.
func gossipTransport(bind string, log *zap.Logger) (*membership.CutTransport, error) {
	t, err := membership.NewCutTransport(bind)
	if err != nil {
		return nil, err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for s := range sigs {
			cut := s == syscall.SIGUSR1
			t.Cut(cut)
			log.Warn("fault injection: gossip cut off from the other members", zap.Bool("cut", cut))
		}
	}()
	return t, nil
}
