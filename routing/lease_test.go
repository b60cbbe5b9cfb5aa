package routing

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/internal/testwait"
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

func (m *memStore) Clusters() []string { return []string{"a", "b"} }

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

	// A draining state read for a minute longer than its switch's
	// timeout, on this member's clock, is one whose switch died: it
	// renews.
	store.set("a", State{Generation: 2, Active: "a", Phase: PhaseDraining, Last: testSwitch(clock.now(), 30*time.Second)})
	l.renew(ctx)
	if l.Valid() {
		t.Fatal("renewed from a switch's draining state at its first read")
	}
	clock.add(30*time.Second + abandonedAfter + time.Second)
	l.renew(ctx)
	if !l.Valid() {
		t.Fatal("an abandoned switch's draining state did not renew")
	}
}

// testSwitch is a planned switch from a to b as the Switcher saves it in
// its draining state, started at start by the switcher's clock.
func testSwitch(start time.Time, timeout time.Duration) *Switch {
	return &Switch{Mode: Planned, From: "a", To: "b", Started: start.UTC(), Deadline: start.UTC().Add(timeout), TimeoutMillis: timeout.Milliseconds()}
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
// the same store, has ended; the mirror drains once more after that lease
// ended, so what that member wrote in its last moments is copied.
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
	testwait.Until(t, 10*time.Second, "the cut-off member's lease valid", cut.Valid)

	var saved []string
	var validAtFlip *bool
	var drainedAfterLease bool // the last drain began with the lease over
	sc.onDrain = func() { drainedAfterLease = !cut.Valid() }
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
	if !drainedAfterLease {
		t.Fatalf("calls %v: the last drain began while a member the switch did not reach could still write to the old cluster", sc.calls)
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

// TestLeaseAbandonedSwitch: a member left holding writes by a switch that
// died takes the next generation if the switch saved it on the other
// cluster before it went, and otherwise serves its own generation again
// once it has read the draining state for a minute longer than the
// switch's timeout. When the other cluster cannot be read, it cannot tell:
// the switch may have saved the next generation there and missed this
// cluster (a planned switch's save to the old cluster is not what it
// waits for), so it keeps holding writes, and takes the next generation
// once it reads it.
func TestLeaseAbandonedSwitch(t *testing.T) {
	for _, c := range []struct {
		name             string
		flipped, unreach bool
	}{{"never flipped", false, false}, {"flipped", true, false}, {"flipped, b unreachable", true, true}} {
		store := newMemStore()
		holding := State{Generation: 3, Active: "a", Phase: PhaseDraining}
		l, table, clock := newTestLease(t, holding, store)
		const timeout = 30 * time.Second
		holding.Last = testSwitch(clock.now(), timeout)
		store.set("a", holding)
		if c.flipped {
			store.set("b", State{Generation: 4, Active: "b"})
		}
		store.setDown("b", c.unreach)
		l.renew(context.Background())
		if l.Valid() || table.Current().Phase != PhaseDraining {
			t.Fatalf("%s: before the timeout, lease %v, routing %s", c.name, l.Valid(), table.Current())
		}
		clock.add(timeout + abandonedAfter + time.Second)
		l.renew(context.Background())
		st := table.Current()
		switch {
		case c.unreach && (st.Generation != 3 || st.Phase == PhaseServing || l.Valid()):
			t.Fatalf("%s: b, which may hold the next generation, was not read; the member routes by %s, lease %v", c.name, st, l.Valid())
		case c.flipped && !c.unreach && (st.Generation != 4 || st.Active != "b"):
			t.Fatalf("%s: the switch saved generation 4 on b; the member routes by %s", c.name, st)
		case !c.flipped && (st.Generation != 3 || st.Active != "a" || st.Phase != PhaseServing || !l.Valid()):
			t.Fatalf("%s: the switch never flipped; the member routes by %s, lease %v", c.name, st, l.Valid())
		}
		if !c.unreach {
			continue
		}
		// b back: the member takes the generation the switch saved.
		store.setDown("b", false)
		clock.add(time.Second)
		l.renew(context.Background())
		if st := table.Current(); st.Generation != 4 || st.Active != "b" {
			t.Fatalf("%s: b back, the member routes by %s", c.name, st)
		}
	}
}

// TestLeaseForcedHoldAbandoned: a member whose writes a forced switch
// holds (a state saved nowhere) while the old cluster still serves its
// generation keeps holding for forcedHoldAbandonedAfter on its own clock,
// then takes the generation the switch saved if it did, and otherwise
// serves again, once every cluster was read.
func TestLeaseForcedHoldAbandoned(t *testing.T) {
	for _, c := range []struct {
		name             string
		flipped, unreach bool
	}{{"never flipped", false, false}, {"flipped", true, false}, {"never flipped, b unreachable", false, true}} {
		store := newMemStore()
		store.set("a", State{Generation: 3, Active: "a", Phase: PhaseServing})
		held := State{Generation: 3, Active: "a", Phase: PhaseSwitching, Last: &Switch{ID: "f", Mode: Forced, From: "a", To: "b"}}
		l, table, clock := newTestLease(t, held, store)
		if c.flipped {
			store.set("b", State{Generation: 4, Active: "b"})
		}
		store.setDown("b", c.unreach)
		l.renew(context.Background())
		clock.add(forcedHoldAbandonedAfter - time.Second)
		l.renew(context.Background())
		if st := table.Current(); st.Phase != PhaseSwitching {
			t.Fatalf("%s: before the bound the member routes by %s", c.name, st)
		}
		clock.add(2 * time.Second)
		l.renew(context.Background())
		st := table.Current()
		switch {
		case c.unreach && st.Phase != PhaseSwitching:
			t.Fatalf("%s: b, which may hold the next generation, was not read; the member routes by %s", c.name, st)
		case c.flipped && (st.Generation != 4 || st.Active != "b"):
			t.Fatalf("%s: the forced switch saved generation 4 on b; the member routes by %s", c.name, st)
		case !c.flipped && !c.unreach && (st.Generation != 3 || st.Active != "a" || st.Phase != PhaseServing):
			t.Fatalf("%s: the forced switch never flipped; the member routes by %s", c.name, st)
		}
	}
}

// TestLeaseAbandonmentCountsOwnClock: whether a switch is abandoned is
// decided by how long this member has read its draining state, on its own
// clock, never by comparing the switcher's deadline with this member's
// wall clock. A member whose clock runs 90 s ahead of the switcher's does
// not serve again while the switch drains (a real Switcher, its drain
// held), and takes the next generation when it lands; one whose clock runs
// 90 s behind, or that starts long after the switch began, still takes a
// switch that died for abandoned once the timeout and the margin have
// passed on its own clock.
func TestLeaseAbandonmentCountsOwnClock(t *testing.T) {
	t.Run("ahead during a switch", func(t *testing.T) {
		store := newMemStore()
		store.set("a", State{Generation: 0, Active: "a", Phase: PhaseServing})
		l, table, clock := newTestLease(t, State{Active: "a"}, store)
		clock.mu.Lock()
		clock.t = time.Now().Add(90 * time.Second)
		clock.mu.Unlock()
		l.base = clock.now()
		l.renew(context.Background())
		if !l.Valid() {
			t.Fatal("not renewed from the serving state")
		}

		mirror := &heldDrain{script: &script{table: NewTable(State{Active: "a"})}, started: make(chan struct{}), release: make(chan struct{})}
		sw := NewSwitcher(mirror.table, mirror, mirror, store, []string{"a", "b"}, zap.NewNop())
		sw.SetWriteLease(50 * time.Millisecond)
		type result struct {
			st  State
			err error
		}
		done := make(chan result, 1)
		go func() {
			st, err := sw.Switch(context.Background(), Request{To: "b", Timeout: 30 * time.Second})
			done <- result{st, err}
		}()
		select {
		case <-mirror.started:
		case r := <-done:
			t.Fatalf("the switch ended before its drain: %v %v", r.st, r.err)
		case <-time.After(10 * time.Second):
			t.Fatal("the switch did not reach its drain in 10 s")
		}
		if saved, _, _ := store.LoadFrom(context.Background(), "a"); saved.Phase != PhaseDraining || saved.Last == nil || saved.Last.TimeoutMillis != 30_000 {
			t.Fatalf("the switch saved %s, last %+v: want draining, with its timeout as a duration", saved, saved.Last)
		}
		// The member renews every 5 s (more than its lease) for 25 s of
		// its clock, the switch draining all along: its lease, from
		// its last read of the serving state, has lapsed at each.
		for range 5 {
			clock.add(5 * time.Second)
			l.renew(context.Background())
			if l.Valid() {
				t.Fatalf("a member whose clock runs 90 s ahead renewed its lease while the switch drains (routing %s)", table.Current())
			}
		}
		close(mirror.release)
		r := <-done
		if r.err != nil || r.st.Generation != 1 {
			t.Fatalf("the switch: %v, %v", r.st, r.err)
		}
		l.renew(context.Background())
		if st := table.Current(); st.Generation != 1 || st.Active != "b" {
			t.Fatalf("after the switch the member routes by %s", st)
		}
	})
	for _, c := range []struct {
		name string
		skew time.Duration
	}{{"behind", -90 * time.Second}, {"started 10 minutes later", 10 * time.Minute}} {
		t.Run(c.name, func(t *testing.T) {
			store := newMemStore()
			l, table, clock := newTestLease(t, State{Generation: 3, Active: "a", Phase: PhaseDraining}, store)
			// The switch died at its start, by its own clock c.skew
			// from this member's.
			const timeout = 30 * time.Second
			st := State{Generation: 3, Active: "a", Phase: PhaseDraining, Last: testSwitch(clock.now().Add(-c.skew), timeout)}
			store.set("a", st)
			store.set("b", st)
			l.renew(context.Background())
			if l.Valid() {
				t.Fatal("renewed at the first read of the draining state")
			}
			clock.add(timeout + abandonedAfter - time.Second)
			l.renew(context.Background())
			if l.Valid() {
				t.Fatal("renewed before the timeout and the margin passed on the member's clock")
			}
			clock.add(2 * time.Second)
			l.renew(context.Background())
			if got := table.Current(); !l.Valid() || got.Generation != 3 || got.Phase != PhaseServing {
				t.Fatalf("the switch died; after its timeout and the margin on the member's clock, lease %v, routing %s", l.Valid(), got)
			}
		})
	}
}

// heldDrain is a script whose drain waits for release.
type heldDrain struct {
	*script
	once             sync.Once
	started, release chan struct{}
}

func (h *heldDrain) Drain(ctx context.Context) error {
	h.once.Do(func() { close(h.started) })
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
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
	testwait.Until(t, 10*time.Second, "generation 4 in force", func() bool { return table.Current().Generation == 4 })
}
