package routing

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// memStore is a Store and LeaseStore in memory: each cluster's last saved
// state, the active one written first as KafkaStore does. onSave, when set,
// runs before a state lands.
type memStore struct {
	mu     sync.Mutex
	states map[string]State
	down   map[string]bool
	onSave func(State)
}

func newMemStore() *memStore {
	return &memStore{states: map[string]State{}, down: map[string]bool{}}
}

func (m *memStore) Save(_ context.Context, st State) error {
	if m.onSave != nil {
		m.onSave(st)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down[st.Active] {
		return errors.New("active cluster down")
	}
	for _, c := range []string{"a", "b"} {
		if !m.down[c] {
			m.states[c] = st
		}
	}
	return nil
}

func (m *memStore) LoadFrom(_ context.Context, cluster string) (State, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down[cluster] {
		return State{}, false, errors.New("down")
	}
	st, ok := m.states[cluster]
	return st, ok, nil
}

func (m *memStore) Load(ctx context.Context) (State, bool, error) {
	a, okA, _ := m.LoadFrom(ctx, "a")
	b, okB, _ := m.LoadFrom(ctx, "b")
	if okB && (!okA || b.Generation > a.Generation) {
		return b, true, nil
	}
	return a, okA, nil
}

func (m *memStore) set(cluster string, st State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.states[cluster] = st
}

func (m *memStore) setDown(cluster string, down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down[cluster] = down
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestLease(t *testing.T, st State, store LeaseStore) (*Lease, *Table, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	table := NewTable(st)
	l := NewLease(table, store, 4*time.Second, zap.NewNop())
	l.now, l.base = clock.now, clock.now()
	return l, table, clock
}

// TestLeaseRenewsOnlyFromServingState: a lease is held for its time after a
// read of the active cluster that says the member's generation serves
// there; a read that fails, finds a switch running, or finds an older
// state, does not extend it.
func TestLeaseRenewsOnlyFromServingState(t *testing.T) {
	store := newMemStore()
	l, _, clock := newTestLease(t, State{Generation: 2, Active: "a"}, store)
	ctx := context.Background()
	if l.Valid() {
		t.Fatal("a lease never renewed is valid")
	}
	store.set("a", State{Generation: 2, Active: "a", Phase: PhaseServing})
	changed := l.Changed()
	l.renew(ctx)
	if !l.Valid() {
		t.Fatal("not valid after a serving read")
	}
	select {
	case <-changed:
	default:
		t.Fatal("a renewal did not close Changed")
	}
	clock.add(3 * time.Second)
	if !l.Valid() {
		t.Fatal("lapsed before its time")
	}
	clock.add(time.Second)
	if l.Valid() {
		t.Fatal("valid a whole lease after the read")
	}

	for _, c := range []struct {
		name string
		prep func()
	}{
		{"unreadable", func() { store.setDown("a", true) }},
		{"draining", func() {
			store.setDown("a", false)
			store.set("a", State{Generation: 2, Active: "a", Phase: PhaseDraining, Last: &Switch{Deadline: clock.now()}})
		}},
		{"older generation", func() { store.set("a", State{Generation: 1, Active: "a"}) }},
	} {
		c.prep()
		l.renew(ctx)
		if l.Valid() {
			t.Fatalf("%s: renewed", c.name)
		}
	}

	// A draining state a minute past its switch's deadline is one whose
	// switch died: it renews.
	clock.add(abandonedAfter + time.Second)
	store.set("a", State{Generation: 2, Active: "a", Phase: PhaseDraining, Last: &Switch{Deadline: clock.now().Add(-abandonedAfter - time.Millisecond)}})
	l.renew(ctx)
	if !l.Valid() {
		t.Fatal("an abandoned switch's draining state did not renew")
	}
}

// TestLeaseNothingSaved: before any switch no state is saved, and
// generation 0 serves.
func TestLeaseNothingSaved(t *testing.T) {
	l, _, _ := newTestLease(t, State{Active: "a"}, newMemStore())
	l.renew(context.Background())
	if !l.Valid() {
		t.Fatal("generation 0 with nothing saved did not renew")
	}
}

// TestLeaseAdoptsMissedSwitch: a member that missed a switch finds the
// newer generation on the cluster it still routes to, installs the highest
// one any cluster holds, and renews only from the new active cluster.
func TestLeaseAdoptsMissedSwitch(t *testing.T) {
	store := newMemStore()
	l, table, _ := newTestLease(t, State{Generation: 3, Active: "a"}, store)
	store.set("a", State{Generation: 4, Active: "b"})
	store.set("b", State{Generation: 5, Active: "a"})
	// a holds 4, b holds 5 (a later switch that a did not get yet).
	l.renew(context.Background())
	if st := table.Current(); st.Generation != 5 || st.Active != "a" {
		t.Fatalf("installed %s, want generation 5 on a", st)
	}
	if l.Valid() {
		t.Fatal("renewed while adopting")
	}
	store.set("a", State{Generation: 5, Active: "a"})
	l.renew(context.Background())
	if !l.Valid() {
		t.Fatal("not renewed from the new active cluster")
	}
}

// TestSwitchWaitsOutLeases: with write leases, a planned switch saves the
// draining state before holding anyone, and when the next generation lands
// the lease of a member the hold never reached, renewing all along from
// the same store, has ended.
func TestSwitchWaitsOutLeases(t *testing.T) {
	store := newMemStore()
	store.set("a", State{Generation: 0, Active: "a"})
	sc := &script{table: NewTable(State{Active: "a"})}
	sw := NewSwitcher(sc.table, sc, sc, store, []string{"a", "b"}, zap.NewNop())
	const ttl = 400 * time.Millisecond
	sw.SetWriteLease(ttl)

	// The member the switch does not reach: its own table, renewing
	// from the store as fast as it likes.
	cut := NewLease(NewTable(State{Active: "a"}), store, ttl, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			cut.renew(ctx)
			time.Sleep(time.Millisecond)
		}
	})
	waitFor(t, cut.Valid)

	var saved []string
	var validAtFlip *bool
	store.onSave = func(st State) {
		saved = append(saved, string(st.Phase))
		if st.Generation == 1 {
			v := cut.Valid()
			validAtFlip = &v
		}
	}
	st, err := sw.Switch(context.Background(), Request{To: "b", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	if st.Generation != 1 || st.Active != "b" {
		t.Fatalf("switched to %s", st)
	}
	if len(saved) != 2 || saved[0] != string(PhaseDraining) || saved[1] != string(PhaseServing) {
		t.Fatalf("saved phases %v, want draining then serving", saved)
	}
	if validAtFlip == nil || *validAtFlip {
		t.Fatal("a member the switch did not reach still held its write lease when the next generation was saved")
	}
	if sc.calls[0] != "hold draining" {
		t.Fatalf("first call %q: the draining state must be saved before anyone holds", sc.calls[0])
	}
	var waited bool
	for _, s := range st.Last.Steps {
		waited = waited || s.Step == "wait_write_leases"
	}
	if !waited {
		t.Fatalf("steps %+v lack the lease wait", st.Last.Steps)
	}
	// The cut-off member then learns the switch from the old cluster.
	cut.renew(context.Background())
	if got := cut.table.Current(); got.Generation != 1 || got.Active != "b" {
		t.Fatalf("the cut-off member routes by %s", got)
	}
}

// TestSwitchLeaseRollbackServesAgain: a planned switch that rolls back
// saves the serving state again, so that leases renew.
func TestSwitchLeaseRollbackServesAgain(t *testing.T) {
	store := newMemStore()
	sc := &script{table: NewTable(State{Active: "a"}), drainErr: &LagError{Partitions: []string{"t[0]"}}}
	sw := NewSwitcher(sc.table, sc, sc, store, []string{"a", "b"}, zap.NewNop())
	sw.SetWriteLease(100 * time.Millisecond)
	if _, err := sw.Switch(context.Background(), Request{To: "b"}); err == nil {
		t.Fatal("the drain failed but the switch did not")
	}
	st, _, _ := store.LoadFrom(context.Background(), "a")
	if st.Generation != 0 || st.Phase != PhaseServing {
		t.Fatalf("after the rollback the store holds %s", st)
	}
	l := NewLease(NewTable(State{Active: "a"}), store, time.Second, zap.NewNop())
	l.renew(context.Background())
	if !l.Valid() {
		t.Fatal("leases do not renew after the rollback")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseAbandonedSwitch: a member left holding writes by a switch that
// died takes the next generation if the switch saved it on the other
// cluster before it went, and otherwise serves its own generation again
// once the switch's deadline is a minute past.
func TestLeaseAbandonedSwitch(t *testing.T) {
	for _, flipped := range []bool{false, true} {
		store := newMemStore()
		holding := State{Generation: 3, Active: "a", Phase: PhaseDraining, Last: &Switch{From: "a", To: "b"}}
		l, table, clock := newTestLease(t, holding, store)
		holding.Last.Deadline = clock.now()
		store.set("a", holding)
		if flipped {
			store.set("b", State{Generation: 4, Active: "b"})
		}
		l.renew(context.Background())
		if l.Valid() || table.Current().Phase != PhaseDraining {
			t.Fatalf("flipped %v: before the deadline, lease %v, routing %s", flipped, l.Valid(), table.Current())
		}
		clock.add(abandonedAfter + time.Second)
		l.renew(context.Background())
		st := table.Current()
		switch {
		case flipped && (st.Generation != 4 || st.Active != "b"):
			t.Fatalf("the switch saved generation 4 on b; the member routes by %s", st)
		case !flipped && (st.Generation != 3 || st.Active != "a" || st.Phase != PhaseServing || !l.Valid()):
			t.Fatalf("the switch never flipped; the member routes by %s, lease %v", st, l.Valid())
		}
	}
}

// TestLeaseLooksElsewhereAfterAForcedSwitch: a forced switch to b could not
// save to a, the old active cluster, which this member (cut off from the
// fleet) still reads: its renewals from a go on finding its generation
// serving. Reading every cluster once a lease, it finds the generation b
// holds and moves over, and its write lease then renews from b only.
func TestLeaseLooksElsewhereAfterAForcedSwitch(t *testing.T) {
	store := newMemStore()
	l, table, _ := newTestLease(t, State{Generation: 3, Active: "a"}, store)
	store.set("a", State{Generation: 3, Active: "a", Phase: PhaseServing})
	store.set("b", State{Generation: 4, Active: "b", Phase: PhaseServing})
	l.renew(context.Background())
	if st := table.Current(); st.Generation != 3 {
		t.Fatalf("a renewal from a installed %s", st)
	}
	if !l.lookElsewhere(context.Background()) {
		t.Fatal("the newer generation on b was not installed")
	}
	if st := table.Current(); st.Generation != 4 || st.Active != "b" {
		t.Fatalf("installed %s, want generation 4 on b", st)
	}
	// Nothing newer anywhere: nothing installed.
	store.set("b", State{Generation: 4, Active: "b", Phase: PhaseServing})
	if l.lookElsewhere(context.Background()) {
		t.Fatal("installed again with nothing newer")
	}
	// A planned switch from b is running (its draining state on b) and
	// has saved generation 5 on a, which it may still roll back: not
	// taken until b holds it.
	store.set("b", State{Generation: 4, Active: "b", Phase: PhaseDraining})
	store.set("a", State{Generation: 5, Active: "a", Phase: PhaseServing})
	if l.lookElsewhere(context.Background()) {
		t.Fatalf("took generation 5 from a while b's switch runs: %s", table.Current())
	}
	store.set("b", State{Generation: 4, Active: "b", Phase: PhaseServing})
	// A voided generation (a switch rolled back after its save timed
	// out) is passed over.
	cur := table.Current()
	cur.Voided = append(cur.Voided, 5)
	table.Update(cur)
	if l.lookElsewhere(context.Background()) {
		t.Fatalf("installed voided generation 5: %s", table.Current())
	}
}

// TestLeaseRunWatchesElsewhere: Run does lookElsewhere by itself.
func TestLeaseRunWatchesElsewhere(t *testing.T) {
	store := newMemStore()
	table := NewTable(State{Generation: 3, Active: "a"})
	l := NewLease(table, store, 200*time.Millisecond, zap.NewNop())
	store.set("a", State{Generation: 3, Active: "a", Phase: PhaseServing})
	store.set("b", State{Generation: 4, Active: "b", Phase: PhaseServing})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, func() bool { return table.Current().Generation == 4 })
}
