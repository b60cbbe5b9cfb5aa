package routing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// memFleet is Members over in-memory members, each a table: every step on
// every member in order, beforeHold run ahead of each member's hold.
type memFleet struct {
	tables     []*Table
	beforeHold func(i int, st State)
}

func (f *memFleet) Hold(ctx context.Context, st State) error {
	var errs []error
	for i, t := range f.tables {
		if f.beforeHold != nil {
			f.beforeHold(i, st)
		}
		if err := (Local{Table: t}).Hold(ctx, st); err != nil {
			errs = append(errs, fmt.Errorf("member %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

func (f *memFleet) Install(ctx context.Context, st State) error {
	var errs []error
	for i, t := range f.tables {
		if err := (Local{Table: t}).Install(ctx, st); err != nil {
			errs = append(errs, fmt.Errorf("member %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// condStore is Store over in-memory clusters, with KafkaStore's condition
// (supersedes): nothing is written when a cluster holds a state the one
// saved must not replace.
type condStore struct {
	mu   sync.Mutex
	held map[string]State
}

func (m *condStore) Save(_ context.Context, st State) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, h := range m.held {
		if why := Supersedes(h, st); why != "" {
			return &SupersededError{Cluster: name, Held: h, Why: why}
		}
	}
	for name := range m.held {
		m.held[name] = st
	}
	return nil
}

func (m *condStore) Load(context.Context) (State, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held["a"], true, nil
}

// TestMemberHoldsForOneSwitch: a member holding writes for switch X
// refuses a hold for switch Y, naming X (switch_running, which the admin
// API answers 409), and Y's rollback does not release X's hold; X's own
// rollback does, and a newer generation is always taken.
func TestMemberHoldsForOneSwitch(t *testing.T) {
	serving := State{Generation: 3, Active: "a", Phase: PhaseServing, Last: &Switch{ID: "p", Outcome: OutcomeSwitched}}
	hold := func(id string) State {
		st := serving
		st.Phase = PhaseDraining
		st.Last = &Switch{ID: id, Mode: Planned, From: "a", To: "b"}
		return st
	}
	back := func(id string) State {
		st := serving
		st.Last = &Switch{ID: id, Mode: Planned, From: "a", To: "b", Outcome: "rolled back: drain"}
		return st
	}
	m := Local{Table: NewTable(serving)}
	ctx := context.Background()
	if err := m.Hold(ctx, hold("x")); err != nil {
		t.Fatalf("hold for x: %v", err)
	}
	err := m.Hold(ctx, hold("y"))
	var e *Error
	if !errors.As(err, &e) || e.Reason != ReasonRunning || e.Switch != "x" || !errors.Is(err, ErrOtherSwitch) {
		t.Fatalf("hold for y while holding for x: %v, want switch_running naming x", err)
	}
	if err := m.Install(ctx, back("y")); !errors.As(err, &e) || e.Reason != ReasonRunning || e.Switch != "x" {
		t.Fatalf("y's rollback over x's hold: %v, want switch_running naming x", err)
	}
	if cur := m.Table.Current(); cur.Phase != PhaseDraining || cur.SwitchID() != "x" {
		t.Fatalf("after y's refusals: %s of switch %s, want x's hold kept", cur, cur.SwitchID())
	}
	if err := m.Install(ctx, back("x")); err != nil {
		t.Fatalf("x's rollback: %v", err)
	}
	if cur := m.Table.Current(); cur.Phase != PhaseServing {
		t.Fatalf("after x's rollback: %s", cur)
	}
	// x's hold arriving after its rollback (a late call) is refused, and
	// the writes stay released.
	if err := m.Hold(ctx, hold("x")); !errors.As(err, &e) || e.Reason != ReasonSuperseded || m.Table.Current().Phase != PhaseServing {
		t.Fatalf("x's hold after its rollback: %v, now %s; want superseded, serving", err, m.Table.Current())
	}
	// Holding again, for y: a forced switch's newer generation is taken.
	if err := m.Hold(ctx, hold("y")); err != nil {
		t.Fatalf("hold for y once x rolled back: %v", err)
	}
	// y's second hold (EndTxn too), then its first once more, late.
	switching := hold("y")
	switching.Phase = PhaseSwitching
	if err := m.Hold(ctx, switching); err != nil {
		t.Fatalf("y's second hold: %v", err)
	}
	if err := m.Hold(ctx, hold("y")); !errors.As(err, &e) || e.Reason != ReasonSuperseded || m.Table.Current().Phase != PhaseSwitching {
		t.Fatalf("y's first hold after its second: %v, now %s; want superseded, switching", err, m.Table.Current())
	}
	forced := State{Generation: 4, Active: "b", Phase: PhaseServing, Last: &Switch{ID: "z", Mode: Forced, Outcome: OutcomeSwitched}}
	if err := m.Install(ctx, forced); err != nil {
		t.Fatalf("a newer generation over y's hold: %v", err)
	}
	if err := m.Install(ctx, back("y")); !errors.As(err, &e) || e.Reason != ReasonSuperseded || m.Table.Current().Generation != 4 {
		t.Fatalf("y's rollback over generation 4: %v, now %s; want superseded", err, m.Table.Current())
	}
}

// TestSwitchRefusedByAMemberHoldingForAnother: a planned switch whose hold
// a member refuses because it holds for another switch answers
// switch_running naming that switch, and its rollback releases its own
// member but leaves the other switch's hold in place.
func TestSwitchRefusedByAMemberHoldingForAnother(t *testing.T) {
	serving := State{Generation: 2, Active: "a", Phase: PhaseServing}
	other := serving
	other.Phase = PhaseDraining
	other.Last = &Switch{ID: "x", Mode: Planned, From: "a", To: "b"}
	fleet := &memFleet{tables: []*Table{NewTable(serving), NewTable(other)}}
	sc := &script{table: fleet.tables[0]}
	sw := NewSwitcher(fleet.tables[0], fleet, sc, sc, []string{"a", "b"}, zap.NewNop())
	_, err := sw.Switch(context.Background(), Request{To: "b"})
	var e *Error
	if !errors.As(err, &e) || e.Reason != ReasonRunning || e.Switch != "x" {
		t.Fatalf("switch while member 1 holds for x: %v, want switch_running naming x", err)
	}
	if cur := fleet.tables[0].Current(); cur.Phase != PhaseServing || cur.Generation != 2 {
		t.Fatalf("member 0 after the refusal: %s, want serving again", cur)
	}
	if cur := fleet.tables[1].Current(); cur.Phase != PhaseDraining || cur.SwitchID() != "x" {
		t.Fatalf("member 1 after the refusal: %s of switch %s, want x's hold kept", cur, cur.SwitchID())
	}
}

// TestPlannedSwitchLosesToAForcedOne: a forced switch asked of member 1
// while member 0's planned switch is holding (its hold has reached member
// 0 only) flips; the planned switch then finds the fleet on the forced
// switch's generation and rolls back without saving its serving state
// over it. Every member and every cluster ends on the forced switch's
// generation, which keeps its lost ranges.
func TestPlannedSwitchLosesToAForcedOne(t *testing.T) {
	serving := State{Generation: 0, Active: "a", Phase: PhaseServing}
	store := &condStore{held: map[string]State{"a": serving, "b": serving}}
	fleet := &memFleet{tables: []*Table{NewTable(serving), NewTable(serving)}}
	sc0 := &script{table: fleet.tables[0]}
	planned := NewSwitcher(fleet.tables[0], fleet, sc0, store, []string{"a", "b"}, zap.NewNop())
	planned.SetWriteLease(1) // saves its draining state first, and its rollback
	sc1 := &script{table: fleet.tables[1], pos: []Position{{Topic: "t", Partition: 0, Standby: 5, Source: 9}}}
	forced := NewSwitcher(fleet.tables[1], fleet, sc1, store, []string{"a", "b"}, zap.NewNop())

	var forcedSt State
	var forcedErr error
	fleet.beforeHold = func(i int, st State) {
		if i == 1 && st.Phase == PhaseDraining && forcedSt.Last == nil {
			forcedSt, forcedErr = forced.Switch(context.Background(), Request{To: "b", Mode: Forced})
		}
	}
	_, err := planned.Switch(context.Background(), Request{To: "b"})
	if forcedErr != nil {
		t.Fatalf("forced switch: %v", forcedErr)
	}
	var e *Error
	if !errors.As(err, &e) || e.Reason != ReasonSuperseded {
		t.Fatalf("the planned switch after the forced one flipped: %v, want superseded", err)
	}
	if forcedSt.Generation != 1 || forcedSt.Active != "b" || len(forcedSt.Last.Lost) != 1 {
		t.Fatalf("forced switch: %s, lost %v", forcedSt, forcedSt.Last.Lost)
	}
	for name, st := range store.held {
		if st.Generation != 1 || st.Active != "b" || st.SwitchID() != forcedSt.SwitchID() || len(st.Last.Lost) != 1 {
			t.Errorf("cluster %s holds %s of switch %s, want the forced switch's generation 1 on b with its lost range", name, st, st.SwitchID())
		}
	}
	for i, tb := range fleet.tables {
		if cur := tb.Current(); cur.Generation != 1 || cur.Active != "b" || cur.Phase != PhaseServing {
			t.Errorf("member %d routes by %s, want generation 1 on b, serving", i, cur)
		}
	}
}

// hooked is a script whose drain and stop run hooks first.
type hooked struct {
	*script
	onDrain, onStop func()
}

func (h hooked) Drain(ctx context.Context) error {
	if h.onDrain != nil {
		h.onDrain()
	}
	return h.script.Drain(ctx)
}

func (h hooked) Stop() []Position {
	if h.onStop != nil {
		h.onStop()
	}
	return h.script.Stop()
}

// slowInstall is Members whose install waits for release first.
type slowInstall struct {
	*memFleet
	installing chan struct{} // closed when the install is asked for
	release    chan struct{}
}

func (f slowInstall) Install(ctx context.Context, st State) error {
	close(f.installing)
	<-f.release
	return f.memFleet.Install(ctx, st)
}

// beforeHolding is slowInstall whose Hold runs hook first.
type beforeHolding struct {
	slowInstall
	hook func()
}

func (f beforeHolding) Hold(ctx context.Context, st State) error {
	f.hook()
	return f.slowInstall.Hold(ctx, st)
}

// TestPlannedSwitchStoppedByAForcedOneAnswersSuperseded: a forced switch
// on member 1, begun before the planned switch on member 0 held it, holds
// once the planned switch drains: it takes the members' hold over, stops
// the mirror under the planned switch's drain and saves its generation;
// its install has not reached member 0 when the drain fails. The planned
// switch answers superseded (409: another switch flipped), not
// drain_timeout (504: try again), and its rollback puts nothing back: the
// clusters keep the forced switch's generation, member 0's writes stay
// held for the forced switch (not released to the old cluster), and once
// the install lands both members route by it.
func TestPlannedSwitchStoppedByAForcedOneAnswersSuperseded(t *testing.T) {
	serving := State{Generation: 0, Active: "a", Phase: PhaseServing}
	store := &condStore{held: map[string]State{"a": serving, "b": serving}}
	fleet := &memFleet{tables: []*Table{NewTable(serving), NewTable(serving)}}
	forcedHolding, plannedDraining := make(chan struct{}), make(chan struct{})
	members := beforeHolding{slowInstall{fleet, make(chan struct{}), make(chan struct{})}, func() {
		close(forcedHolding)
		<-plannedDraining
	}}
	forced := NewSwitcher(fleet.tables[1], members, &script{table: fleet.tables[1]}, store, []string{"a", "b"}, zap.NewNop())
	var forcedSt State
	var forcedErr error
	forcedDone := make(chan struct{})
	go func() {
		defer close(forcedDone)
		forcedSt, forcedErr = forced.Switch(context.Background(), Request{To: "b", Mode: Forced})
	}()
	<-forcedHolding

	plannedMirror := hooked{script: &script{table: fleet.tables[0], drainErr: errors.New("the mirror was stopped")}, onDrain: func() {
		close(plannedDraining)
		<-members.installing // the forced switch has held, stopped the mirror and saved
	}}
	planned := NewSwitcher(fleet.tables[0], fleet, plannedMirror, store, []string{"a", "b"}, zap.NewNop())
	planned.SetWriteLease(1)
	_, err := planned.Switch(context.Background(), Request{To: "b", Timeout: 5 * time.Second})
	if cur := fleet.tables[0].Current(); cur.Phase == PhaseServing || cur.SwitchID() == "" || cur.Last.Mode != Forced {
		t.Errorf("after the planned switch's rollback member 0 routes by %s: the writes are not held for the forced switch", cur)
	}
	close(members.release)
	<-forcedDone
	if forcedErr != nil || forcedSt.Generation != 1 {
		t.Fatalf("forced switch: %s, %v", forcedSt, forcedErr)
	}
	var e *Error
	if !errors.As(err, &e) || e.Reason != ReasonSuperseded {
		t.Errorf("the planned switch whose drain the forced one stopped: %v, want superseded", err)
	}
	for name, st := range store.held {
		if st.Generation != 1 || st.Active != "b" || st.SwitchID() != forcedSt.SwitchID() {
			t.Errorf("cluster %s holds %s of switch %s, want the forced switch's generation 1 on b", name, st, st.SwitchID())
		}
	}
	for i, tb := range fleet.tables {
		if cur := tb.Current(); cur.Generation != 1 || cur.Active != "b" || cur.Phase != PhaseServing {
			t.Errorf("member %d routes by %s, want generation 1 on b, serving", i, cur)
		}
	}
}
