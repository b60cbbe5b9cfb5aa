// Package fleetswitch carries a switch's steps to every live member of a
// fleet: the hold and the install (routing.Members) and the mirror's stop
// and start the other way (routing.Mirror), over the fleet's acknowledged
// calls, and answers those calls on each member (Register). The switch
// itself, its order of steps and its rollback, is routing.Switcher's.
//
// Who answers for a member that does not:
//
//   - A member that stops being alive (gossip finds it suspect, dead or
//     gone) before it answers is not waited for: the write lease has it
//     stop writing before the flip (routing/lease.go).
//   - A member that answers with an error fails the step: the switch rolls
//     back (the hold), or reports it (the install, the mirror's start).
//   - A mirrored partition no member answered for at the stop gets the
//     standby's end as its position, from this member's mirror
//     (LocalMirror.Unanswered): the new generation's fence covers it, and
//     what the source holds beyond it is reported lost.
//   - A call that arrives late, after its switch moved on or rolled back,
//     is refused by the member's table (routing.Table.UpdateFor): it never
//     holds writes again for a switch that ended.
//
// Why calls over the gossip transport rather than HTTP between admin
// addresses: they travel encrypted and authenticated by the fleet's key,
// so the switch needs no second credential and no member exposes an
// internal endpoint; and each call is a request with an answer, which is
// the barrier a switch needs ("every live member holds"). Gossip's own
// broadcasts have no acknowledgement.
package fleetswitch

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/membership"
	"github.com/ferry-gw/ferry/routing"
)

// Calls is the fleet's acknowledged exchange (membership.Fleet).
type Calls interface {
	// CallAll calls every alive member, this one included, and returns
	// each one's reply; a member that stopped being alive before it
	// answered has an error wrapping membership.ErrNotAlive.
	CallAll(ctx context.Context, kind string, body []byte) []membership.Reply
	// HandleControl sets the handler of a kind of call that controls a
	// switch, on handler slots no other kind can take.
	HandleControl(kind string, h membership.Handler)
}

// LocalMirror is this member's mirror as a switch drives it.
type LocalMirror interface {
	// Halted, Drain and SyncGroups act on this member's mirror; Stop
	// stops the writers this member runs and returns their positions;
	// Follow starts them the way a state says.
	routing.Mirror
	// Unanswered, called before the mirror stops, returns what gives the
	// positions of the mirrored partitions that positions got from the
	// members lack (see the package doc); nil when the mirror is not
	// running.
	Unanswered() func(got []routing.Position) []routing.Position
}

// The switch's calls between members.
const (
	CallHold         = "routing.hold"
	CallInstall      = "routing.install"
	CallMirrorStop   = "mirror.stop"
	CallMirrorFollow = "mirror.follow"
)

// mirrorCallTimeout bounds the mirror's stop and start on every member.
const mirrorCallTimeout = 30 * time.Second

// Register answers the switch's calls on this member: local is its table
// (and what it waits on for its writes to settle), mirror its mirror, nil
// when the mirror is disabled.
func Register(c Calls, local routing.Local, mirror LocalMirror) {
	c.HandleControl(CallHold, func(ctx context.Context, _ int32, body []byte) ([]byte, error) {
		st, err := decodeState(body)
		if err != nil {
			return nil, err
		}
		return nil, local.Hold(ctx, st)
	})
	c.HandleControl(CallInstall, func(ctx context.Context, _ int32, body []byte) ([]byte, error) {
		st, err := decodeState(body)
		if err != nil {
			return nil, err
		}
		return nil, local.Install(ctx, st)
	})
	c.HandleControl(CallMirrorStop, func(context.Context, int32, []byte) ([]byte, error) {
		if mirror == nil {
			return json.Marshal([]routing.Position{})
		}
		return json.Marshal(mirror.Stop())
	})
	c.HandleControl(CallMirrorFollow, func(_ context.Context, _ int32, body []byte) ([]byte, error) {
		st, err := decodeState(body)
		if err != nil || mirror == nil {
			return nil, err
		}
		return nil, mirror.Follow(st)
	})
}

func decodeState(body []byte) (routing.State, error) {
	var st routing.State
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("decoding a routing state: %w", err)
	}
	return st, nil
}

// callLive calls every alive member and sorts the replies
// (membership.Split).
func callLive(ctx context.Context, c Calls, log *zap.Logger, kind string, body []byte) (answers map[int32][]byte, failed map[int32]error) {
	answers, failed, _ = membership.Split(log, kind, c.CallAll(ctx, kind, body))
	return answers, failed
}

// Members is routing.Members over the fleet: each step on every alive
// member.
type Members struct {
	calls Calls
	table *routing.Table
	log   *zap.Logger
}

var _ routing.Members = (*Members)(nil)

// NewMembers returns the fleet's members as a switch on this member
// reaches them; table is this member's.
func NewMembers(c Calls, table *routing.Table, log *zap.Logger) *Members {
	return &Members{calls: c, table: table, log: log}
}

// Hold makes every alive member hold writes as st says.
func (m *Members) Hold(ctx context.Context, st routing.State) error {
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, failed := callLive(ctx, m.calls, m.log, CallHold, body)
	return membership.FirstErr(failed)
}

// Install makes every alive member route by st.
func (m *Members) Install(ctx context.Context, st routing.State) error {
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	// This member first: its table is what the switch answers with. A
	// rollback releases only its own switch's hold (UpdateFor).
	self := m.table.UpdateFor(st)
	_, failed := callLive(ctx, m.calls, m.log, CallInstall, body)
	if self != nil {
		return self
	}
	return membership.FirstErr(failed)
}

// Mirror is routing.Mirror over the fleet: the drain and the group sync
// read the clusters, so this member does them; stopping and starting reach
// the writers on every member.
type Mirror struct {
	life   context.Context // the fleet's: its end cuts the stop and start short
	calls  Calls
	local  LocalMirror
	halted func() []string
	log    *zap.Logger
}

var _ routing.Mirror = (*Mirror)(nil)

// NewMirror returns the fleet's mirror as a switch on this member drives
// it; halted lists every member's halted partitions; life ends when this
// member leaves the fleet.
func NewMirror(life context.Context, c Calls, local LocalMirror, halted func() []string, log *zap.Logger) *Mirror {
	return &Mirror{life: life, calls: c, local: local, halted: halted, log: log}
}

// Halted lists the halted partitions across the fleet.
func (m *Mirror) Halted() []string { return m.halted() }

// Drain drains the mirror (this member reads the clusters).
func (m *Mirror) Drain(ctx context.Context) error { return m.local.Drain(ctx) }

// SyncGroups copies the groups' offsets (this member).
func (m *Mirror) SyncGroups(ctx context.Context) error { return m.local.SyncGroups(ctx) }

// Stop stops the writers on every member and returns where each mirrored
// partition stood, answered or not.
func (m *Mirror) Stop() []routing.Position {
	fill := m.local.Unanswered() // before the call stops it
	ctx, cancel := context.WithTimeout(m.life, mirrorCallTimeout)
	defer cancel()
	answers, failed := callLive(ctx, m.calls, m.log, CallMirrorStop, nil)
	for id, err := range failed {
		m.log.Error("a member's mirror did not stop", zap.Int32("member", id), zap.Error(err))
	}
	var out []routing.Position
	for _, b := range answers {
		var ps []routing.Position
		if err := json.Unmarshal(b, &ps); err == nil {
			out = append(out, ps...)
		}
	}
	if fill != nil {
		out = append(out, fill(out)...)
	}
	return out
}

// AbortLeftOpen implements routing.LeftOpenAborter once every member's
// writers stopped: this member aborts, on cluster, what any of them left
// open (the transactional IDs name no member), if its mirror can.
func (m *Mirror) AbortLeftOpen(ctx context.Context, cluster string) error {
	if a, ok := m.local.(routing.LeftOpenAborter); ok {
		return a.AbortLeftOpen(ctx, cluster)
	}
	return nil
}

// Follow starts the writers on every member the way st says.
func (m *Mirror) Follow(st routing.State) error {
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(m.life, mirrorCallTimeout)
	defer cancel()
	_, failed := callLive(ctx, m.calls, m.log, CallMirrorFollow, body)
	return membership.FirstErr(failed)
}
