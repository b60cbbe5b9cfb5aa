//go:build !faults

package main

import (
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/membership"
)

// gossipTransport is nil, memberlist's own, in a member not built for
// fault injection (see faults.go).
func gossipTransport(string, *zap.Logger) (*membership.CutTransport, error) { return nil, nil }
