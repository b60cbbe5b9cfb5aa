package main

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// switchover runs one switch of the active cluster on this member (the
// admin API's POST /switchover).
func (n *node) switchover(ctx context.Context, req routing.Request) (routing.State, error) {
	return n.switcher.Switch(ctx, req)
}

// switchMirror is the mirror as a switch drives it (routing.Mirror). With
// the mirror disabled the switcher gets nil instead.
type switchMirror struct{ r *mirrorRunner }

var _ routing.Mirror = switchMirror{}

func (m switchMirror) Halted() []string {
	var out []string
	for _, st := range m.r.Info().Partitions {
		if st.State == mirror.StateHalted {
			out = append(out, fmt.Sprintf("%s[%d]: %v", st.Topic, st.Partition, st.Err))
		}
	}
	sort.Strings(out)
	return out
}

func (m switchMirror) Drain(ctx context.Context) error {
	c := m.r.cur.Load()
	if c == nil {
		return errors.New("mirror: not running")
	}
	err := c.m.Drain(ctx)
	var lag *mirror.LagError
	if errors.As(err, &lag) {
		return &routing.LagError{Partitions: lag.Partitions}
	}
	return err
}

func (m switchMirror) SyncGroups(ctx context.Context) error {
	c := m.r.cur.Load()
	if c == nil {
		return errors.New("mirror: not running")
	}
	return c.m.SyncGroups(ctx)
}

func (m switchMirror) Stop() []routing.Position {
	c := m.r.cur.Load()
	if c == nil {
		return nil
	}
	m.r.Stop()
	sts := c.m.Status()
	out := make([]routing.Position, 0, len(sts))
	for _, st := range sts {
		out = append(out, routing.Position{Topic: st.Topic, Partition: st.Partition, Standby: st.Mirrored, Source: st.SourceEnd})
	}
	return out
}

func (m switchMirror) Follow(st routing.State) error { return m.r.Follow(st) }
