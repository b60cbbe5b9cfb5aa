package routing

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestFailoverPauseSavedAndCarried: a pause is saved in the state in force
// (same generation, same switch), put in force on this member, and carried
// by the next switch into the state it makes; a resume saves it gone.
func TestFailoverPauseSavedAndCarried(t *testing.T) {
	sc, sw := newScript(State{Generation: 4, Active: "a"})
	p := &FailoverPause{At: time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC), Reason: "broker upgrade"}
	st, err := sw.SetFailoverPause(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Generation != 4 || st.FailoverPaused == nil || st.FailoverPaused.Reason != "broker upgrade" {
		t.Fatalf("state after the pause %+v", st)
	}
	if got := strings.Join(sc.calls, ", "); got != "save 4" {
		t.Fatalf("steps %q, want the state saved once", got)
	}
	if cur := sc.table.Current(); cur.FailoverPaused == nil {
		t.Fatal("the pause is not in force on this member")
	}
	next, err := sw.Switch(context.Background(), Request{To: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if next.Generation != 5 || next.FailoverPaused == nil || !next.FailoverPaused.At.Equal(p.At) {
		t.Fatalf("the switch's state %+v: the pause was not carried", next)
	}
	st, err = sw.SetFailoverPause(context.Background(), nil)
	if err != nil || st.FailoverPaused != nil || sc.table.Current().FailoverPaused != nil {
		t.Fatalf("resume: %+v, %v", st, err)
	}
}

// TestFailoverPauseRefusedWhileSwitching: a state holding writes for a
// switch is never saved over by a pause.
func TestFailoverPauseRefusedWhileSwitching(t *testing.T) {
	sc, sw := newScript(State{Generation: 4, Active: "a", Phase: PhaseDraining, Last: &Switch{ID: "s1", Mode: Planned}})
	_, err := sw.SetFailoverPause(context.Background(), &FailoverPause{At: time.Now()})
	var re *Error
	if !errors.As(err, &re) || re.Reason != ReasonRunning {
		t.Fatalf("pause during a switch: %v, want %s", err, ReasonRunning)
	}
	if len(sc.calls) != 0 {
		t.Fatalf("steps %v: something was saved", sc.calls)
	}
}

// TestTableSetFailoverPause: only the pause changes, only in its
// generation: a member holding writes for a switch keeps holding them.
func TestTableSetFailoverPause(t *testing.T) {
	held := State{Generation: 4, Active: "a", Phase: PhaseDraining, Last: &Switch{ID: "s1"}}
	table := NewTable(held)
	p := &FailoverPause{At: time.Now()}
	if table.SetFailoverPause(3, p) {
		t.Fatal("a pause of another generation was taken")
	}
	if !table.SetFailoverPause(4, p) {
		t.Fatal("the pause of the generation in force was not taken")
	}
	if cur := table.Current(); cur.Phase != PhaseDraining || cur.SwitchID() != "s1" || cur.FailoverPaused == nil {
		t.Fatalf("state %+v: the pause changed more than itself", cur)
	}
	if table.SetFailoverPause(4, p) {
		t.Fatal("the same pause again counts as a change")
	}
}

// TestLeaseTakesAPauseItMissed: a member that missed the pause's call
// takes it from the saved state at its next renewal, and a resume too.
func TestLeaseTakesAPauseItMissed(t *testing.T) {
	store := newMemStore()
	l, table, _ := newTestLease(t, State{Generation: 2, Active: "a"}, store)
	p := &FailoverPause{At: time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)}
	store.set("a", State{Generation: 2, Active: "a", FailoverPaused: p})
	l.renew(context.Background())
	if cur := table.Current(); cur.FailoverPaused == nil || !l.Valid() {
		t.Fatalf("after a renewal: %+v, lease valid %v", cur, l.Valid())
	}
	store.set("a", State{Generation: 2, Active: "a"})
	l.renew(context.Background())
	if cur := table.Current(); cur.FailoverPaused != nil {
		t.Fatal("the resume was not taken")
	}
}
