//go:build faults

package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"

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

// clockSkew is, in a member built for fault injection, how far off its
// wall clock is to be taken (FERRY_FAULT_CLOCK_SKEW, a Go duration such
// as -2h): the switches it runs are stamped so (routing.Switcher.SkewClock).
func clockSkew(log *zap.Logger) time.Duration {
	v := os.Getenv("FERRY_FAULT_CLOCK_SKEW")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		log.Error("fault injection: FERRY_FAULT_CLOCK_SKEW is not a duration; the clock is left true", zap.String("value", v), zap.Error(err))
		return 0
	}
	log.Warn("fault injection: this member's wall clock is taken as skewed", zap.Duration("skew", d))
	return d
}
