package routing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// script records what a switch asked of the members, the mirror and the
// store, in order.
type script struct {
	calls    []string
	drainErr error
	saveErr  error
	// saveErrGen, when set, limits saveErr to that generation.
	saveErrGen uint32
	halted     []string
	pos        []Position
	table      *Table
	onDrain    func() // called at each drain
}

func (s *script) Hold(_ context.Context, st State) error {
	s.table.Update(st)
	s.calls = append(s.calls, "hold "+string(st.Phase))
	return nil
}

func (s *script) Install(_ context.Context, st State) error {
	s.table.Update(st)
	s.calls = append(s.calls, fmt.Sprintf("install %d %s %s", st.Generation, st.Active, st.Phase))
	return nil
}

func (s *script) Halted() []string { return s.halted }

func (s *script) Drain(context.Context) error {
	s.calls = append(s.calls, "drain")
	if s.onDrain != nil {
		s.onDrain()
	}
	return s.drainErr
}

func (s *script) SyncGroups(context.Context) error {
	s.calls = append(s.calls, "sync groups")
	return nil
}

func (s *script) Stop() []Position {
	s.calls = append(s.calls, "stop mirror")
	return s.pos
}

// AbortLeftOpen: a forced switch ends what the stopped writers left open
// on its target.
func (s *script) AbortLeftOpen(_ context.Context, cluster string) error {
	s.calls = append(s.calls, "abort left open on "+cluster)
	return nil
}

func (s *script) Follow(st State) error {
	s.calls = append(s.calls, "follow "+st.Active)
	return nil
}

func (s *script) Save(_ context.Context, st State) error {
	s.calls = append(s.calls, fmt.Sprintf("save %d", st.Generation))
	if s.saveErrGen != 0 && st.Generation != s.saveErrGen {
		return nil
	}
	return s.saveErr
}

func (s *script) Load(context.Context) (State, bool, error) { return State{}, false, nil }

func newScript(st State) (*script, *Switcher) {
	sc := &script{table: NewTable(st)}
	return sc, NewSwitcher(sc.table, sc, sc, sc, []string{"a", "b"}, zap.NewNop())
}

// TestPlannedSwitchSteps: a planned switch holds, drains, holds EndTxn
// too and drains again, copies group offsets, stops the mirror, saves the
// next generation before installing it, and starts the mirror the other
// way; the ends the mirror stood at become the old generation's fence.
func TestPlannedSwitchSteps(t *testing.T) {
	sc, sw := newScript(State{Generation: 4, Active: "a"})
	sc.pos = []Position{{Topic: "t", Partition: 1, Standby: 7, Source: 7}, {Topic: "t", Partition: 0, Standby: 3, Source: 3}}
	sw.SaveVersions(func() map[int16][2]int16 { return map[int16][2]int16{0: {3, 11}} })
	st, err := sw.Switch(context.Background(), Request{To: "b"})
	if err != nil {
		t.Fatal(err)
	}
	want := "hold draining, drain, hold switching, drain, sync groups, stop mirror, save 5, install 5 b serving, follow b"
	if got := strings.Join(sc.calls, ", "); got != want {
		t.Fatalf("steps:\n got %s\nwant %s", got, want)
	}
	if st.Generation != 5 || st.Active != "b" || st.Last.Outcome != "switched" || len(st.Last.Lost) != 0 || st.APIVersions[0] != [2]int16{3, 11} {
		t.Fatalf("state %+v, last %+v", st, st.Last)
	}
	if end, ok := st.FenceEnd(4, "t", 0); !ok || end != 3 {
		t.Fatalf("fence of generation 4 for t[0]: %d, %v", end, ok)
	}
	if end, ok := st.FenceEnd(4, "t", 1); !ok || end != 7 {
		t.Fatalf("fence of generation 4 for t[1]: %d, %v", end, ok)
	}
	// The state names what it took over from: where an idempotent
	// producer's last batches were written.
	if gen, from, ok := st.Previous(); !ok || gen != 4 || from != "a" {
		t.Fatalf("previous: %d on %q, %v; want 4 on a", gen, from, ok)
	}
	// The same call again answers the same state and does nothing.
	sc.calls = nil
	again, err := sw.Switch(context.Background(), Request{To: "b"})
	if err != nil || again.Generation != 5 || len(sc.calls) != 0 {
		t.Fatalf("repeat: %+v, %v, calls %v", again, err, sc.calls)
	}
}

// warmingStore is a script's store that can ready a write (warmer).
type warmingStore struct {
	*script
	mu       sync.Mutex
	warmed   []string
	saveSeen []string // what had been warmed at each save
}

func (w *warmingStore) Warm(_ context.Context, cluster string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warmed = append(w.warmed, cluster)
}

func (w *warmingStore) Save(ctx context.Context, st State) error {
	w.mu.Lock()
	w.saveSeen = append(w.saveSeen, fmt.Sprintf("save %d after warming %v", st.Generation, slices.Sorted(slices.Values(w.warmed))))
	w.mu.Unlock()
	return w.script.Save(ctx, st)
}

// TestPlannedSwitchWarmsTheStore: a planned switch has the store ready
// its writes to every cluster before it drains, and saves after (at 50 ms
// a round trip, a save with a new producer took 870 ms of held writes,
// one warmed 255 ms).
func TestPlannedSwitchWarmsTheStore(t *testing.T) {
	sc := &script{table: NewTable(State{Generation: 4, Active: "a"})}
	ws := &warmingStore{script: sc}
	sw := NewSwitcher(sc.table, sc, sc, ws, []string{"a", "b"}, zap.NewNop())
	if _, err := sw.Switch(context.Background(), Request{To: "b"}); err != nil {
		t.Fatal(err)
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if want := []string{"save 5 after warming [a b]"}; !slices.Equal(ws.saveSeen, want) {
		t.Fatalf("saves: %v, want %v", ws.saveSeen, want)
	}
}

// TestPlannedSwitchRollsBack: a drain that fails releases the writes to
// the old cluster at the same generation, with the lagging partitions in
// the error; a save that fails restarts the mirror the old way.
func TestPlannedSwitchRollsBack(t *testing.T) {
	sc, sw := newScript(State{Generation: 1, Active: "a"})
	sc.drainErr = &LagError{Partitions: []string{"t[0]: standby 3 of 9"}}
	_, err := sw.Switch(context.Background(), Request{To: "b"})
	var e *Error
	if !errors.As(err, &e) || e.Reason != ReasonDrainTimeout || len(e.Partitions) != 1 {
		t.Fatalf("drain failure: %v", err)
	}
	if st := sc.table.Current(); st.Generation != 1 || st.Active != "a" || st.Phase != PhaseServing || !strings.HasPrefix(st.Last.Outcome, "rolled back") {
		t.Fatalf("after the rollback: %+v", st)
	}
	if _, _, ok := sc.table.Current().Previous(); ok {
		t.Fatal("a rolled-back switch's state names a previous cluster")
	}

	// A save to the new cluster that fails may still land there: its
	// generation is voided, saved on the old cluster, and skipped.
	sc, sw = newScript(State{Generation: 1, Active: "a"})
	sc.saveErr, sc.saveErrGen = errors.New("unreachable"), 2
	_, err = sw.Switch(context.Background(), Request{To: "b"})
	if !errors.As(err, &e) || e.Reason != ReasonSaveFailed {
		t.Fatalf("save failure: %v", err)
	}
	if got := strings.Join(sc.calls, ", "); !strings.Contains(got, "save 2, follow a, save 1, install 1 a serving") {
		t.Fatalf("after a failed save: %s", got)
	}
	if st := sc.table.Current(); st.Generation != 1 || !st.IsVoided(2) {
		t.Fatalf("after a failed save: %+v", st)
	}
	sc.saveErr = nil
	st, err := sw.Switch(context.Background(), Request{To: "b"})
	if err != nil || st.Generation != 3 || st.Active != "b" || !st.IsVoided(2) {
		t.Fatalf("the switch after a voided generation: %+v, %v", st, err)
	}
}

// TestForcedSwitchReportsLost: a forced switch neither holds nor drains;
// what the source held beyond the standby is reported lost; the refusals
// come before anything is touched.
func TestForcedSwitchReportsLost(t *testing.T) {
	sc, sw := newScript(State{Generation: 0, Active: "a"})
	// t[2]: the old cluster could not be listed and the mirror had not
	// read it yet (a writer not started): whatever it acknowledged from
	// the standby's end on may be lost, and is reported so.
	// t[3]: the standby held 6, from 2 in a transaction the mirror had
	// left open (aborted by the switch): lost from 2.
	// t[4]: the standby held 8 but parted from the source at 6 (its
	// writer halted on a stray marker there): lost from 6.
	committed, parted := int64(2), int64(6)
	sc.pos = []Position{{Topic: "t", Partition: 0, Standby: 5, Source: 9}, {Topic: "t", Partition: 1, Standby: 4, Source: 4},
		{Topic: "t", Partition: 2, Standby: 3, Source: -1}, {Topic: "t", Partition: 3, Standby: 6, Source: 6, Committed: &committed},
		{Topic: "t", Partition: 4, Standby: 8, Source: 9, Matches: &parted}}
	st, err := sw.Switch(context.Background(), Request{To: "b", Mode: Forced})
	if err != nil {
		t.Fatal(err)
	}
	// Writes are held before the mirror stops: nothing the old cluster
	// takes from there on is passed on as acknowledged.
	if got := strings.Join(sc.calls, ", "); got != "hold switching, stop mirror, abort left open on b, save 1, install 1 b serving, follow b" {
		t.Fatalf("steps: %s", got)
	}
	if !st.ForcedFrom(0) || st.ForcedFrom(1) {
		t.Fatalf("%s: the forced switch's state must refuse answers to writes of generation 0 only", st)
	}
	if fmt.Sprint(st.Last.Lost) != fmt.Sprint([]LostRange{{Topic: "t", Partition: 0, From: 5, To: 9}, {Topic: "t", Partition: 2, From: 3, To: UnknownEnd},
		{Topic: "t", Partition: 3, From: 2, To: 6}, {Topic: "t", Partition: 4, From: 6, To: 9}}) {
		t.Fatalf("lost %v", st.Last.Lost)
	}
	if open := st.Last.Lost[1]; open.Contains(2) || !open.Contains(3) || !open.Contains(1<<40) {
		t.Fatalf("%+v: an unknown end holds every offset from its start", open)
	}
	if _, _, ok := st.Previous(); ok {
		t.Fatal("a forced switch's state names a previous cluster to read producers from; its old cluster may be gone")
	}

	for _, tc := range []struct {
		req    Request
		halted []string
		reason string
	}{
		{Request{To: "c"}, nil, ReasonUnknownCluster},
		{Request{To: "b"}, nil, ReasonAlreadyActive},
		{Request{To: "a", Mode: "sideways"}, nil, ReasonBadRequest},
		{Request{To: "a"}, []string{"t[0]: diverged"}, ReasonHalted},
	} {
		sc.calls, sc.halted = nil, tc.halted
		_, err := sw.Switch(context.Background(), tc.req)
		if !errors.As(err, new(*Error)) || err.(*Error).Reason != tc.reason || len(sc.calls) != 0 {
			t.Errorf("%+v: %v, calls %v; want %s and nothing done", tc.req, err, sc.calls, tc.reason)
		}
	}
}

// TestForcedSwitchReleasesItsHoldWhenTheSaveFails: a forced switch whose
// save fails releases the writes it held, on every member, to the old
// cluster (its generation voided); while it held, answers to writes of the
// old generation were refused, and after the release they are not.
func TestForcedSwitchReleasesItsHoldWhenTheSaveFails(t *testing.T) {
	sc, _ := newScript(State{Generation: 3, Active: "a", Phase: PhaseServing})
	sc.saveErr = errors.New("b unreachable")
	var during State
	sc.pos = []Position{{Topic: "t", Standby: 1, Source: 1}}
	hk := hooked{script: sc, onStop: func() { during = sc.table.Current() }}
	sw := NewSwitcher(sc.table, sc, hk, sc, []string{"a", "b"}, zap.NewNop())
	_, err := sw.Switch(context.Background(), Request{To: "b", Mode: Forced})
	var e *Error
	if !errors.As(err, &e) || e.Reason != ReasonSaveFailed {
		t.Fatalf("forced switch with the save failing: %v, want %s", err, ReasonSaveFailed)
	}
	if got := strings.Join(sc.calls, ", "); got != "hold switching, stop mirror, abort left open on b, save 4, follow a, install 3 a serving" {
		t.Fatalf("steps: %s", got)
	}
	if during.Phase != PhaseSwitching || !during.ForcedFrom(3) {
		t.Fatalf("while the mirror stopped the member routed by %s: answers to generation 3's writes not refused", during)
	}
	cur := sc.table.Current()
	if cur.Phase != PhaseServing || cur.Active != "a" || cur.ForcedFrom(3) || !cur.IsVoided(4) {
		t.Fatalf("after the failed save the member routes by %s (voided %v): writes still held or refused", cur, cur.Voided)
	}
}

// TestForcedFrom: answers to writes of a generation are refused while a
// forced switch out of it holds and under every generation it led to, not
// for a planned switch's or a rolled-back one's.
func TestForcedFrom(t *testing.T) {
	g := func(n uint32) *uint32 { return &n }
	forced := Switch{ID: "f", Mode: Forced, Outcome: OutcomeSwitched, FromGeneration: g(2)}
	planned := Switch{ID: "p", Mode: Planned, Outcome: OutcomeSwitched, FromGeneration: g(3)}
	for _, tc := range []struct {
		st   State
		gen  uint32
		want bool
	}{
		{State{Generation: 2, Phase: PhaseSwitching, Last: &Switch{ID: "f", Mode: Forced}}, 2, true},
		{State{Generation: 2, Phase: PhaseSwitching, Last: &Switch{ID: "p", Mode: Planned}}, 2, false},
		{State{Generation: 2, Phase: PhaseServing, Last: &Switch{ID: "f", Mode: Forced, Outcome: "failed: x"}}, 2, false},
		{State{Generation: 3, Phase: PhaseServing, Last: &forced}, 2, true},
		{State{Generation: 3, Phase: PhaseServing, Last: &forced}, 3, false},
		{State{Generation: 4, Phase: PhaseServing, Last: &planned, History: []Switch{forced}}, 2, true},
		{State{Generation: 4, Phase: PhaseServing, Last: &planned, History: []Switch{forced}}, 3, false},
		{State{Generation: 1, Phase: PhaseServing}, 2, false},
	} {
		if got := tc.st.ForcedFrom(tc.gen); got != tc.want {
			t.Errorf("%s (last %+v, history %d): ForcedFrom(%d) = %v, want %v", tc.st, tc.st.Last, len(tc.st.History), tc.gen, got, tc.want)
		}
	}
}

// TestFencesKeepTheLatest: a state remembers the ends of the last
// MaxFences generations.
func TestFencesKeepTheLatest(t *testing.T) {
	sc, sw := newScript(State{Generation: 0, Active: "a"})
	sc.pos = []Position{{Topic: "t", Standby: 1, Source: 1}}
	to := []string{"b", "a"}
	for i := range MaxFences + 3 {
		if _, err := sw.Switch(context.Background(), Request{To: to[i%2], Mode: Forced}); err != nil {
			t.Fatal(err)
		}
	}
	st := sc.table.Current()
	if len(st.Fences) != MaxFences || st.Fences[0].Generation != 3 || st.Fences[MaxFences-1].Generation != st.Generation-1 {
		t.Fatalf("fences of generations %v at generation %d", st.Fences, st.Generation)
	}
}

// TestHistoryKeepsEarlierSwitches: each switch moves the one before it
// into the history, rolled back ones included, lost ranges counted; the
// history keeps the latest MaxHistory.
func TestHistoryKeepsEarlierSwitches(t *testing.T) {
	sc, sw := newScript(State{Generation: 0, Active: "a"})
	sc.pos = []Position{{Topic: "t", Partition: 0, Standby: 5, Source: 9}, {Topic: "t", Partition: 1, Standby: 2, Source: 3}}
	if _, err := sw.Switch(context.Background(), Request{To: "b", Mode: Forced}); err != nil {
		t.Fatal(err)
	}
	if st := sc.table.Current(); len(st.History) != 0 {
		t.Fatalf("history %+v after the first switch", st.History)
	}
	sc.drainErr = errors.New("drain failed")
	if _, err := sw.Switch(context.Background(), Request{To: "a", Mode: Planned}); err == nil {
		t.Fatal("a switch whose drain failed succeeded")
	}
	sc.drainErr = nil
	st, err := sw.Switch(context.Background(), Request{To: "a", Mode: Planned})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.History) != 2 {
		t.Fatalf("history %+v, want the forced switch and the rolled-back one", st.History)
	}
	forced, back := st.History[0], st.History[1]
	if forced.Mode != Forced || forced.To != "b" || forced.Outcome != "switched" || forced.LostRanges != 2 || forced.Lost != nil {
		t.Errorf("first in history %+v: want the forced switch to b, its 2 lost ranges counted, not listed", forced)
	}
	if back.Mode != Planned || !strings.HasPrefix(back.Outcome, "rolled back") {
		t.Errorf("second in history %+v: want the rolled-back planned switch", back)
	}
	if st.Last.To != "a" || st.Last.Outcome != "switched" {
		t.Errorf("last %+v", st.Last)
	}

	to := []string{"b", "a"}
	for i := range MaxHistory + 2 {
		if _, err := sw.Switch(context.Background(), Request{To: to[i%2], Mode: Forced}); err != nil {
			t.Fatal(err)
		}
	}
	st = sc.table.Current()
	if len(st.History) != MaxHistory || st.History[MaxHistory-1].Finished.After(st.Last.Started) {
		t.Fatalf("%d in history (last %+v), want the %d before the last switch", len(st.History), st.History[len(st.History)-1], MaxHistory)
	}
}

// TestSwitchChecksPrincipals: a switch, planned or forced, whose target
// some mapped principals cannot authenticate on is refused with
// principals_unauthenticated and their list before anything is held or
// saved; it goes through once they can, and a forced switch asked to skip
// the check goes through regardless (a planned one may not skip it).
func TestSwitchChecksPrincipals(t *testing.T) {
	sc, sw := newScript(State{Generation: 4, Active: "a"})
	failing := []string{"User:bob: SASL authentication failed"}
	var checked []string
	sw.CheckPrincipals(func(_ context.Context, cluster string) ([]string, error) {
		checked = append(checked, cluster)
		return failing, nil
	})
	for _, mode := range []Mode{Planned, Forced} {
		_, err := sw.Switch(context.Background(), Request{To: "b", Mode: mode})
		var re *Error
		if !errors.As(err, &re) || re.Reason != ReasonPrincipals || len(re.Principals) != 1 || re.Principals[0] != failing[0] {
			t.Fatalf("%s: %v, want %s naming User:bob", mode, err, ReasonPrincipals)
		}
		if len(sc.calls) != 0 || sc.table.Current().Generation != 4 {
			t.Fatalf("%s: refused after %v", mode, sc.calls)
		}
	}
	if _, err := sw.Switch(context.Background(), Request{To: "b", SkipPrincipalCheck: true}); err == nil || err.(*Error).Reason != ReasonBadRequest {
		t.Fatalf("planned with the check skipped: %v, want bad_request", err)
	}
	if fmt.Sprint(checked) != "[b b]" {
		t.Fatalf("checked %v, want the target twice", checked)
	}
	failing = nil
	if st, err := sw.Switch(context.Background(), Request{To: "b"}); err != nil || st.Active != "b" {
		t.Fatalf("planned once every principal authenticates: %+v %v", st, err)
	}
	failing = []string{"User:bob: no"}
	if st, err := sw.Switch(context.Background(), Request{To: "a", Mode: Forced, SkipPrincipalCheck: true}); err != nil || st.Active != "a" {
		t.Fatalf("forced with the check skipped: %+v %v", st, err)
	}
}

// TestSwitchRefusedAtTheGenerationLimit: a switch whose next generation
// would be past MaxGeneration (counting voided ones) is refused with
// generation_limit before anything is held; the one before it switches.
func TestSwitchRefusedAtTheGenerationLimit(t *testing.T) {
	_, sw := newScript(State{Generation: MaxGeneration - 1, Active: "a"})
	st, err := sw.Switch(context.Background(), Request{To: "b", Mode: Forced})
	if err != nil || st.Generation != MaxGeneration {
		t.Fatalf("switch to the last generation: %v, %v", st, err)
	}
	for _, tc := range []struct {
		name string
		st   State
	}{
		{"at the limit", State{Generation: MaxGeneration, Active: "b"}},
		{"a voided generation at the limit", State{Generation: MaxGeneration - 3, Active: "b", Voided: []uint32{MaxGeneration}}},
	} {
		sc, sw := newScript(tc.st)
		for _, mode := range []Mode{Planned, Forced} {
			sc.calls = nil
			_, err := sw.Switch(context.Background(), Request{To: "a", Mode: mode})
			var e *Error
			if !errors.As(err, &e) || e.Reason != ReasonGenerationLimit || len(sc.calls) != 0 {
				t.Fatalf("%s, %s: %v, calls %v; want %s and nothing done", tc.name, mode, err, sc.calls, ReasonGenerationLimit)
			}
			if !strings.Contains(e.Msg, fmt.Sprint(MaxGeneration)) || !strings.Contains(e.Msg, "RUNBOOK") {
				t.Fatalf("the refusal does not name the limit and what to do: %s", e.Msg)
			}
			if got := sc.table.Current(); got.Generation != tc.st.Generation || got.Active != "b" {
				t.Fatalf("%s: the state changed to %v", tc.name, got)
			}
		}
	}
}

// TestSkewedClockStampsOnly: a member whose wall clock is two hours behind
// stamps its switch two hours back (what other members read), while the
// switch's timeout and its duration count on the monotonic clock: the
// switch runs and answers as on a true clock.
func TestSkewedClockStampsOnly(t *testing.T) {
	_, sw := newScript(State{Generation: 4, Active: "a"})
	sw.SkewClock(-2 * time.Hour)
	before := time.Now()
	st, err := sw.Switch(context.Background(), Request{To: "b", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := st.Last
	if lag := before.Sub(l.Started); lag < 2*time.Hour-time.Minute || lag > 2*time.Hour+time.Minute {
		t.Fatalf("started %v, %v before the true clock; want two hours", l.Started, lag)
	}
	if l.timeout() != 30*time.Second || l.Outcome != "switched" {
		t.Fatalf("timeout %v, outcome %q; want 30s, switched", l.timeout(), l.Outcome)
	}
	if d, err := time.ParseDuration(l.Duration); err != nil || d < 0 || d > 10*time.Second {
		t.Fatalf("duration %q (%v)", l.Duration, err)
	}
}

// TestFenceBefore: where a generation began in a partition is the end
// recorded for the latest generation before it that has one, whatever the
// fences' order; none before it (or only unknown ends) is not known.
func TestFenceBefore(t *testing.T) {
	st := State{Fences: []Fence{
		{Generation: 5, Ends: map[string][]int64{"t": {50, -1}}},
		{Generation: 2, Ends: map[string][]int64{"t": {20, 21}}},
		{Generation: 7, Ends: map[string][]int64{"t": {70, 71}}},
	}}
	for _, c := range []struct {
		gen       uint32
		partition int32
		want      int64
		ok        bool
	}{
		{7, 0, 50, true}, // generation 5 ended where 7 began (6 voided)
		{6, 0, 50, true},
		{5, 0, 20, true},
		{7, 1, 21, true}, // generation 5's end unknown there
		{2, 0, 0, false},
		{9, 2, 0, false}, // no such partition
	} {
		if got, ok := st.FenceBefore(c.gen, "t", c.partition); got != c.want || ok != c.ok {
			t.Errorf("FenceBefore(%d, t, %d) = %d, %v; want %d, %v", c.gen, c.partition, got, ok, c.want, c.ok)
		}
	}
}

// TestSwitcherRetire: the active cluster cannot be retired, nor one that
// is not configured; when the member's own retiring fails nothing changes;
// once retired, a switch to the cluster is refused unknown_cluster.
func TestSwitcherRetire(t *testing.T) {
	_, sw := newScript(State{Generation: 4, Active: "a"})
	var se *Error
	if err := sw.Retire("a", func() error { t.Fatal("ran for the active cluster"); return nil }); !errors.As(err, &se) || se.Reason != ReasonBadRequest {
		t.Fatalf("retiring the active cluster: %v", err)
	}
	if err := sw.Retire("c", func() error { return nil }); !errors.As(err, &se) || se.Reason != ReasonUnknownCluster {
		t.Fatalf("retiring an unknown cluster: %v", err)
	}
	failed := errors.New("the proxy refused")
	if err := sw.Retire("b", func() error { return failed }); !errors.Is(err, failed) || !slices.Equal(sw.Clusters(), []string{"a", "b"}) {
		t.Fatalf("a failed retire: %v, clusters %v", err, sw.Clusters())
	}
	if err := sw.Retire("b", func() error { return nil }); err != nil || !slices.Equal(sw.Clusters(), []string{"a"}) {
		t.Fatalf("retire: %v, clusters %v", err, sw.Clusters())
	}
	if _, err := sw.Switch(context.Background(), Request{To: "b"}); !errors.As(err, &se) || se.Reason != ReasonUnknownCluster {
		t.Fatalf("a switch to the retired cluster: %v", err)
	}
}

// TestLocalRefusesUnservedCluster: a member that does not serve a cluster
// (retired while another member still has it) refuses to hold for a switch
// to it, and to install a state making it active, and keeps routing as it
// did.
func TestLocalRefusesUnservedCluster(t *testing.T) {
	table := NewTable(State{Generation: 4, Active: "a"})
	l := Local{Table: table, Clusters: func() []string { return []string{"a"} }}
	hold := State{Generation: 4, Active: "a", Phase: PhaseDraining, Last: &Switch{ID: "s1", From: "a", To: "b"}}
	var se *Error
	if err := l.Hold(context.Background(), hold); !errors.As(err, &se) || se.Reason != ReasonUnknownCluster {
		t.Fatalf("hold for a switch to b: %v", err)
	}
	if err := l.Install(context.Background(), State{Generation: 5, Active: "b", Last: &Switch{ID: "s1", From: "a", To: "b"}}); !errors.As(err, &se) || se.Reason != ReasonUnknownCluster {
		t.Fatalf("install of b active: %v", err)
	}
	if cur := table.Current(); cur.Generation != 4 || cur.Active != "a" || cur.Phase != PhaseServing {
		t.Fatalf("routing %v after the refusals", cur)
	}
	if err := l.Install(context.Background(), State{Generation: 5, Active: "a"}); err != nil {
		t.Fatalf("install of a served cluster: %v", err)
	}
}
