package fleetswitch

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/membership"
	"github.com/ferry-gw/ferry/routing"
)

// memNet is a fleet of in-memory members: each call is delivered to the
// member's handler unless a fault says otherwise.
type memNet struct {
	mu      sync.Mutex
	members map[int32]*memMember
	// fault, when set, decides each call's fate before it is delivered.
	fault func(from, to int32, kind string, st routing.State) fate
}

// fate is what happens to one call.
type fate struct {
	lost  bool          // never delivered; the caller gets an error
	delay time.Duration // delivered this late, whether or not the caller still waits
	dies  bool          // the member stops being alive before it answers
}

type memMember struct {
	id       int32
	alive    bool
	table    *routing.Table
	mirror   *memMirror
	handlers map[string]membership.Handler
	calls    *memCalls
	switcher *routing.Switcher
}

// memCalls is one member's Calls.
type memCalls struct {
	net  *memNet
	self int32
}

func (c *memCalls) HandleControl(kind string, h membership.Handler) {
	c.net.mu.Lock()
	defer c.net.mu.Unlock()
	c.net.members[c.self].handlers[kind] = h
}

func (c *memCalls) CallAll(ctx context.Context, kind string, body []byte) []membership.Reply {
	c.net.mu.Lock()
	var to []*memMember
	for _, m := range c.net.members {
		if m.alive {
			to = append(to, m)
		}
	}
	fault := c.net.fault
	c.net.mu.Unlock()
	sort.Slice(to, func(i, j int) bool { return to[i].id < to[j].id })
	st, _ := decodeState(body)
	out := make([]membership.Reply, len(to))
	var wg sync.WaitGroup
	for i, m := range to {
		var f fate
		if fault != nil {
			f = fault(c.self, m.id, kind, st)
		}
		wg.Go(func() {
			out[i] = c.deliver(ctx, m, kind, body, f)
		})
	}
	wg.Wait()
	return out
}

// deliver runs the call on m as f says. A late call runs on its own: the
// member gets it whenever it arrives, the caller stops waiting at ctx's end.
func (c *memCalls) deliver(ctx context.Context, m *memMember, kind string, body []byte, f fate) membership.Reply {
	r := membership.Reply{NodeID: m.id}
	switch {
	case f.lost:
		r.Err = fmt.Errorf("call %s to member %d: lost", kind, m.id)
		return r
	case f.dies:
		c.net.kill(m.id)
		r.Err = fmt.Errorf("call %s to member %d: %w", kind, m.id, membership.ErrNotAlive)
		return r
	}
	done := make(chan membership.Reply, 1)
	go func() {
		time.Sleep(f.delay)
		c.net.mu.Lock()
		h := m.handlers[kind]
		c.net.mu.Unlock()
		b, err := h(context.Background(), c.self, body)
		if err != nil {
			err = &membership.RemoteError{NodeID: m.id, Kind: kind, Message: err.Error()}
		}
		done <- membership.Reply{NodeID: m.id, Body: b, Err: err}
	}()
	select {
	case r = <-done:
	case <-ctx.Done():
		r.Err = ctx.Err()
	}
	return r
}

func (n *memNet) kill(id int32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.members[id].alive = false
}

func (n *memNet) setFault(f func(from, to int32, kind string, st routing.State) fate) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fault = f
}

// memMirror is one member's mirror: it copies its own partitions and
// records what it was told.
type memMirror struct {
	mu        sync.Mutex
	parts     []routing.Position
	running   bool
	follows   []routing.State
	drainGate chan struct{} // when set, Drain waits for it (or ctx)
}

func (m *memMirror) Halted() []string { return nil }

func (m *memMirror) Drain(ctx context.Context) error {
	m.mu.Lock()
	gate := m.drainGate
	m.mu.Unlock()
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return &routing.LagError{Partitions: []string{"t[0]"}}
	}
}

func (m *memMirror) SyncGroups(context.Context) error { return nil }

func (m *memMirror) Stop() []routing.Position {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running = false
	return slices.Clone(m.parts)
}

func (m *memMirror) Follow(st routing.State) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running = true
	m.follows = append(m.follows, st)
	return nil
}

func (m *memMirror) Unanswered() func(got []routing.Position) []routing.Position { return nil }

// condStore is the clusters' saved state, refusing what Kafka's store
// refuses (routing.Supersedes).
type condStore struct {
	mu   sync.Mutex
	held routing.State
}

func (s *condStore) Save(_ context.Context, st routing.State) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if why := routing.Supersedes(s.held, st); why != "" {
		return &routing.SupersededError{Cluster: "a", Held: s.held, Why: why}
	}
	s.held = st
	return nil
}

func (s *condStore) Load(context.Context) (routing.State, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held, true, nil
}

// newMemFleet starts n members serving generation 0 with a active, each
// with a switcher over the fleet, all saving to one store; member i's
// mirror writes partition i of topic t.
func newMemFleet(t *testing.T, n int) (*memNet, []*memMember, *condStore) {
	t.Helper()
	net := &memNet{members: map[int32]*memMember{}}
	store := &condStore{}
	var ms []*memMember
	for i := range int32(n) {
		m := &memMember{
			id: i, alive: true,
			table:    routing.NewTable(routing.State{Generation: 0, Active: "a"}),
			mirror:   &memMirror{parts: []routing.Position{{Topic: "t", Partition: i, Standby: 10, Source: 10}}, running: true},
			handlers: map[string]membership.Handler{},
		}
		m.calls = &memCalls{net: net, self: i}
		net.members[i] = m
		ms = append(ms, m)
	}
	for _, m := range ms {
		log := zaptest.NewLogger(t).Named(fmt.Sprint("member-", m.id))
		Register(m.calls, routing.Local{Table: m.table}, m.mirror)
		m.switcher = routing.NewSwitcher(m.table, NewMembers(m.calls, m.table, log),
			NewMirror(context.Background(), m.calls, m.mirror, m.mirror.Halted, log), store, []string{"a", "b"}, log)
	}
	return net, ms, store
}

// requireRoutes fails unless every member in ms routes by generation gen
// to active, serving.
func requireRoutes(t *testing.T, ms []*memMember, gen uint32, active string) {
	t.Helper()
	for _, m := range ms {
		st := m.table.Current()
		if st.Generation != gen || st.Active != active || st.Phase != routing.PhaseServing {
			t.Errorf("member %d routes by %s; want generation %d, %q active, serving", m.id, st, gen, active)
		}
	}
}
