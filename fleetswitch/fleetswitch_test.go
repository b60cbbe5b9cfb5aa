package fleetswitch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/routing"
)

func planned(to string, timeout time.Duration) routing.Request {
	return routing.Request{To: to, Mode: routing.Planned, Timeout: timeout}
}

// TestSwitchReachesEveryMember: a planned switch asked of one member holds,
// stops the mirror and installs on every member; every member's mirror is
// turned the new way, and the fence of each partition is what the member
// writing it answered.
func TestSwitchReachesEveryMember(t *testing.T) {
	_, ms, store := newMemFleet(t, 3)
	st, err := ms[1].switcher.Switch(context.Background(), planned("b", 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	requireRoutes(t, ms, 1, "b")
	if held, _, _ := store.Load(context.Background()); held.Generation != 1 || held.Active != "b" {
		t.Errorf("the clusters hold %s; want generation 1, b active", held)
	}
	for _, m := range ms {
		m.mirror.mu.Lock()
		follows := m.mirror.follows
		m.mirror.mu.Unlock()
		if len(follows) != 1 || follows[0].Active != "b" {
			t.Errorf("member %d's mirror was told %v; want to follow b once", m.id, follows)
		}
	}
	// Each member answered its own partition at the stop: all three are
	// fenced.
	for p := range int32(3) {
		if _, ok := st.FenceEnd(0, "t", p); !ok {
			t.Errorf("partition t[%d] has no fence in %s", p, st)
		}
	}
}

// TestTwoSwitchesAtOnce: planned switches asked of two members at the same
// moment. One flips; the other is refused (a member holds for one switch
// and refuses another) and releases nothing it did not hold; every member
// ends on the one generation the clusters hold.
func TestTwoSwitchesAtOnce(t *testing.T) {
	net, ms, store := newMemFleet(t, 3)
	// Widen the race: every hold arrives a little late.
	net.setFault(func(_, _ int32, kind string, _ routing.State) fate {
		if kind == CallHold {
			return fate{delay: 20 * time.Millisecond}
		}
		return fate{}
	})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			_, errs[i] = ms[i].switcher.Switch(context.Background(), planned("b", 3*time.Second))
		})
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		if err == nil {
			won++
			continue
		}
		var e *routing.Error
		if !errors.As(err, &e) || e.Reason != routing.ReasonRunning && e.Reason != routing.ReasonSuperseded {
			t.Errorf("switch asked of member %d: %v; want refused as running or superseded", i, err)
		}
	}
	held, _, _ := store.Load(context.Background())
	switch won {
	case 1:
		requireRoutes(t, ms, 1, "b")
		if held.Generation != 1 {
			t.Errorf("the clusters hold %s; want generation 1", held)
		}
	case 0:
		// Both refused each other's hold: nothing flipped, nothing is
		// left held.
		requireRoutes(t, ms, 0, "a")
	default:
		t.Fatalf("%d switches flipped at once", won)
	}
}

// TestLostHoldRollsBack: a hold that never reaches one member fails the
// switch, and every member serves the old cluster again.
func TestLostHoldRollsBack(t *testing.T) {
	net, ms, _ := newMemFleet(t, 3)
	net.setFault(func(_, to int32, kind string, _ routing.State) fate {
		return fate{lost: kind == CallHold && to == 2}
	})
	if _, err := ms[0].switcher.Switch(context.Background(), planned("b", 2*time.Second)); err == nil {
		t.Fatal("a switch whose hold was lost on a member flipped")
	}
	requireRoutes(t, ms, 0, "a")
}

// TestLateHoldAfterRollback: a hold that reaches a member only after its
// switch rolled back (the switch's time ran out waiting for it) must not
// hold that member's writes again. It did: the member took the late hold
// (same generation, same switch) and held writes until its lease gave the
// switch up as abandoned.
func TestLateHoldAfterRollback(t *testing.T) {
	net, ms, _ := newMemFleet(t, 3)
	late := make(chan struct{})
	net.setFault(func(_, to int32, kind string, st routing.State) fate {
		if kind == CallHold && to == 2 && st.Phase == routing.PhaseDraining {
			return fate{delay: 600 * time.Millisecond}
		}
		return fate{}
	})
	// Note when the late hold has been handled.
	h := ms[2].handlers[CallHold]
	ms[2].handlers[CallHold] = func(ctx context.Context, from int32, body []byte) ([]byte, error) {
		defer func() {
			select {
			case <-late:
			default:
				close(late)
			}
		}()
		return h(ctx, from, body)
	}
	if _, err := ms[0].switcher.Switch(context.Background(), planned("b", 200*time.Millisecond)); err == nil {
		t.Fatal("a switch whose hold came late flipped within its time")
	}
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("the late hold never arrived")
	}
	requireRoutes(t, ms, 0, "a")
}

// TestMemberDiesBetweenHoldAndInstall: a member that stops being alive after
// it held is not waited for; the switch flips on the others (the write
// lease keeps the dead one from writing).
func TestMemberDiesBetweenHoldAndInstall(t *testing.T) {
	net, ms, _ := newMemFleet(t, 3)
	net.setFault(func(_, to int32, kind string, _ routing.State) fate {
		return fate{dies: kind == CallMirrorStop && to == 2}
	})
	st, err := ms[0].switcher.Switch(context.Background(), planned("b", 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	requireRoutes(t, ms[:2], 1, "b")
	if got := ms[2].table.Current(); got.Generation != 0 || got.Phase == routing.PhaseServing {
		t.Errorf("the dead member routes by %s; want still holding generation 0's writes", got)
	}
	// Its partition was not answered for: no fence from it.
	if _, ok := st.FenceEnd(0, "t", 2); ok {
		t.Errorf("partition t[2], whose member died, is fenced in %s without an answer", st)
	}
}

// TestRollbackRacesInstall: a planned switch asked of member 0 has held
// member 0 and its hold is still on its way to member 1 when a forced
// switch asked of member 1 flips to b and installs on every member. The
// planned switch's hold then fails on member 1; its rollback must not put
// generation 0 back on any member, nor on the clusters.
func TestRollbackRacesInstall(t *testing.T) {
	net, ms, store := newMemFleet(t, 3)
	net.setFault(func(_, to int32, kind string, st routing.State) fate {
		if kind == CallHold && to == 1 && st.Generation == 0 {
			return fate{delay: 300 * time.Millisecond}
		}
		return fate{}
	})
	plannedErr := make(chan error, 1)
	go func() {
		_, err := ms[0].switcher.Switch(context.Background(), planned("b", 5*time.Second))
		plannedErr <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for ms[0].table.Current().Phase != routing.PhaseDraining {
		if time.Now().After(deadline) {
			t.Fatal("the planned switch never held member 0")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := ms[1].switcher.Switch(context.Background(), routing.Request{To: "b", Mode: routing.Forced}); err != nil {
		t.Fatalf("the forced switch: %v", err)
	}
	err := <-plannedErr
	// It lost to the forced switch either way: superseded when the forced
	// one's generation was installed by the time the planned one rolled
	// back, switch_running when member 2 still held for the forced one
	// (which of the two is a matter of scheduling; both refuse it).
	var e *routing.Error
	if !errors.As(err, &e) || e.Reason != routing.ReasonSuperseded && e.Reason != routing.ReasonRunning {
		t.Fatalf("the planned switch answered %v; want superseded or switch_running", err)
	}
	requireRoutes(t, ms, 1, "b")
	if held, _, _ := store.Load(context.Background()); held.Generation != 1 || held.Active != "b" {
		t.Errorf("the clusters hold %s; want the forced switch's generation 1, b active", held)
	}
}
