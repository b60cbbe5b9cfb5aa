//go:build !faults

package main

import (
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/membership"
)

// gossipTransport is nil, memberlist's own, in a member not built for
// fault injection (see faults.go).
func gossipTransport(string, *zap.Logger) (*membership.CutTransport, error) { return nil, nil }

// clockSkew is 0 in a member not built for fault injection.
func clockSkew(*zap.Logger) time.Duration { return 0 }
