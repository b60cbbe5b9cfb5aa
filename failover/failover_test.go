package failover

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/routing"
)

var policy = Policy{After: 30 * time.Second, MaxLossRecords: 1000, MaxLossSeconds: 10, MinInterval: 10 * time.Minute}

func serving(gen uint32, active string) routing.State {
	return routing.State{Generation: gen, Active: active, Phase: routing.PhaseServing}
}

// down is member id's view of generation 0, primary unreachable for d,
// the standby answering, lag known.
func down(id int32, d time.Duration, lag int64) View {
	return View{Member: id, Active: "primary", Standby: "standby", StandbyUp: true,
		DownMillis: d.Milliseconds(), LagRecords: lag, LagSeconds: 1, LagKnown: true}
}

func up(id int32) View {
	return View{Member: id, Active: "primary", Standby: "standby", StandbyUp: true, LagKnown: true}
}

func three(alive ...bool) []Member {
	out := []Member{{ID: 0, Alive: true}, {ID: 1, Alive: true}, {ID: 2, Alive: true}}
	for i, a := range alive {
		out[i].Alive = a
	}
	return out
}

func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	long := 31 * time.Second
	forcedAway := serving(1, "standby")
	forcedAway.Last = &routing.Switch{Mode: routing.Forced, From: "primary", To: "standby", Outcome: routing.OutcomeSwitched, Finished: now.Add(-time.Hour)}
	paused := serving(0, "primary")
	paused.FailoverPaused = &routing.FailoverPause{At: now.Add(-time.Hour), Reason: "upgrade"}
	recent := serving(1, "primary")
	recent.Last = &routing.Switch{Mode: routing.Planned, From: "standby", To: "primary", Outcome: routing.OutcomeSwitched, Finished: now.Add(-5 * time.Minute)}
	for _, c := range []struct {
		name    string
		st      routing.State
		standby string
		members []Member
		views   []View
		act     bool
		blocked bool
		reason  string // a part of the verdict's reason
		votes   int
	}{
		{name: "all three see it gone", st: serving(0, "primary"), standby: "standby", members: three(),
			views: []View{down(0, long, 10), down(1, long, 20), down(2, long, 30)}, act: true, votes: 3},
		{name: "two of three: a majority", st: serving(0, "primary"), standby: "standby", members: three(),
			views: []View{down(0, long, 10), down(1, long, 20), up(2)}, act: true, votes: 2},
		{name: "one of three: not", st: serving(0, "primary"), standby: "standby", members: three(),
			views: []View{down(0, long, 10), up(1), up(2)}, votes: 1, reason: "1 of 3 members"},
		{name: "alone in a partition: the others dead still count", st: serving(0, "primary"), standby: "standby",
			members: three(true, false, false), views: []View{down(0, long, 10)}, votes: 1, reason: "2 needed"},
		{name: "not long enough yet", st: serving(0, "primary"), standby: "standby", members: three(),
			views: []View{down(0, 20*time.Second, 0), down(1, 25*time.Second, 0), down(2, long, 0)}, votes: 1},
		{name: "standby unreachable too", st: serving(0, "primary"), standby: "standby", members: three(),
			views: []View{{Member: 0, Active: "primary", Standby: "standby", DownMillis: long.Milliseconds(), LagKnown: true},
				{Member: 1, Active: "primary", Standby: "standby", DownMillis: long.Milliseconds(), LagKnown: true}}, votes: 0},
		{name: "views of an older generation", st: serving(1, "primary"), standby: "standby", members: three(),
			views: []View{down(0, long, 0), down(1, long, 0), down(2, long, 0)}, votes: 0},
		{name: "lag over max_loss records", st: serving(0, "primary"), standby: "standby", members: three(),
			views: []View{down(0, long, 600), down(1, long, 600), down(2, long, 0)}, votes: 3, blocked: true, reason: "exceeds max_loss"},
		{name: "lag over max_loss seconds", st: serving(0, "primary"), standby: "standby", members: three(),
			views: []View{down(0, long, 0), down(1, long, 0), func() View { v := down(2, long, 0); v.LagSeconds = 11; return v }()},
			votes: 3, blocked: true, reason: "exceeds max_loss"},
		{name: "a member's lag unknown", st: serving(0, "primary"), standby: "standby", members: three(),
			views: []View{down(0, long, 0), down(1, long, 0), func() View { v := down(2, long, 0); v.LagKnown = false; return v }()},
			votes: 3, blocked: true, reason: "unknown"},
		{name: "never back to a cluster a forced switch left", st: forcedAway, standby: "primary", members: three(),
			views: []View{
				{Member: 0, Generation: 1, Active: "standby", Standby: "primary", StandbyUp: true, DownMillis: long.Milliseconds(), LagKnown: true},
				{Member: 1, Generation: 1, Active: "standby", Standby: "primary", StandbyUp: true, DownMillis: long.Milliseconds(), LagKnown: true}},
			votes: 2, blocked: true, reason: "planned, by a person"},
		{name: "within min_interval of the last switch", st: recent, standby: "standby", members: three(),
			views: []View{
				{Member: 0, Generation: 1, Active: "primary", Standby: "standby", StandbyUp: true, DownMillis: long.Milliseconds(), LagKnown: true},
				{Member: 1, Generation: 1, Active: "primary", Standby: "standby", StandbyUp: true, DownMillis: long.Milliseconds(), LagKnown: true}},
			votes: 2, blocked: true, reason: "min_interval"},
		{name: "paused", st: paused, standby: "standby", members: three(),
			views: []View{down(0, long, 0), down(1, long, 0), down(2, long, 0)}, votes: 3, blocked: true, reason: "paused (since 2026-12-06T11:00:00Z: upgrade)"},
		{name: "a switch running", st: routing.State{Active: "primary", Phase: routing.PhaseDraining}, standby: "standby", members: three(),
			views: []View{down(0, long, 0), down(1, long, 0), down(2, long, 0)}, reason: "a switch is running"},
		{name: "a member alone in its fleet", st: serving(0, "primary"), standby: "standby", members: []Member{{ID: 0, Alive: true}},
			views: []View{down(0, long, 0)}, act: true, votes: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Decide(policy, c.st, c.standby, c.members, c.views, now)
			if v.Act != c.act || v.Blocked != c.blocked || v.Votes != c.votes || !strings.Contains(v.Reason, c.reason) {
				t.Fatalf("verdict %+v; want act %v, blocked %v, %d votes, a reason with %q", v, c.act, c.blocked, c.votes, c.reason)
			}
			if v.Act && v.Target != c.standby {
				t.Fatalf("switches to %q, want %q", v.Target, c.standby)
			}
		})
	}
}

func TestDecideActIn(t *testing.T) {
	v := Decide(policy, serving(0, "primary"), "standby", three(),
		[]View{down(0, 31*time.Second, 0), down(1, 20*time.Second, 0), down(2, 5*time.Second, 0)}, time.Now())
	if v.Act || v.ActIn != 10*time.Second {
		t.Fatalf("verdict %+v: want no action yet, the second vote in 10s", v)
	}
}

// TestActorOneOfTheAlive: every member that sees the same alive members
// names the same actor, one of them; it moves only when it goes.
func TestActorOneOfTheAlive(t *testing.T) {
	a := Actor([]int32{0, 1, 2})
	if b := Actor([]int32{2, 0, 1}); a != b {
		t.Fatalf("the order of the members changes the actor: %d, %d", a, b)
	}
	var rest []int32
	for _, id := range []int32{0, 1, 2} {
		if id != a {
			rest = append(rest, id)
		}
	}
	b := Actor(rest)
	if b == a || b < 0 {
		t.Fatalf("with %d gone the actor is %d", a, b)
	}
	if Actor(append(rest, 7)) == b && Actor([]int32{b, 7}) != b && Actor([]int32{b, 7}) != 7 {
		t.Fatal("the actor is not one of the alive members")
	}
	if Actor(nil) != -1 {
		t.Fatal("an actor with nobody alive")
	}
}

// fakeMember is a Runner's surroundings: clusters that answer or not, and
// a switch that records its requests.
type fakeMember struct {
	mu       sync.Mutex
	st       routing.State
	down     map[string]bool
	switches []routing.Request
	lag      int64
	// reached is when each cluster last answered a probe; switchedAt
	// when the first switch was asked for.
	reached    map[string]time.Time
	switchedAt time.Time
}

func (f *fakeMember) config(self int32) Config {
	return Config{
		Policy: Policy{After: 300 * time.Millisecond, MaxLossRecords: 100, MaxLossSeconds: -1, MinInterval: time.Hour},
		Self:   self,
		Routes: func() routing.State { f.mu.Lock(); defer f.mu.Unlock(); return f.st },
		Standby: func(active string) string {
			if active == "primary" {
				return "standby"
			}
			return "primary"
		},
		Probe: func(ctx context.Context, cluster string) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.down[cluster] {
				return errors.New("connection refused")
			}
			if f.reached == nil {
				f.reached = map[string]time.Time{}
			}
			f.reached[cluster] = time.Now()
			return nil
		},
		Lag: func() (int64, float64, bool) { f.mu.Lock(); defer f.mu.Unlock(); return f.lag, 0.5, true },
		Switch: func(ctx context.Context, req routing.Request) (routing.State, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.switches) == 0 {
				f.switchedAt = time.Now()
			}
			f.switches = append(f.switches, req)
			if req.OnlyFrom == nil || *req.OnlyFrom != f.st.Generation {
				return routing.State{}, errors.New("superseded")
			}
			f.st = routing.State{Generation: f.st.Generation + 1, Active: req.To, Phase: routing.PhaseServing,
				Last: &routing.Switch{Mode: req.Mode, Automatic: req.Automatic, From: f.st.Active, To: req.To,
					Outcome: routing.OutcomeSwitched, Finished: time.Now()}}
			return f.st, nil
		},
		Interval: 20 * time.Millisecond,
	}
}

func (f *fakeMember) set(cluster string, isDown bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down[cluster] = isDown
}

func (f *fakeMember) requests() []routing.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]routing.Request(nil), f.switches...)
}

// TestRunnerSwitchesOnceWhenTheActiveIsGone: a member alone, the active
// cluster gone: one automatic forced switch after After, from the
// generation it was decided in, and none back (the cluster a forced switch
// left) when the new active one goes too.
func TestRunnerSwitchesOnceWhenTheActiveIsGone(t *testing.T) {
	f := &fakeMember{st: serving(0, "primary"), down: map[string]bool{}, lag: 5}
	r := New(f.config(0))
	ctx, cancel := context.WithCancel(context.Background())
	var done atomic.Bool
	go func() { r.Run(ctx); done.Store(true) }()
	defer cancel()

	time.Sleep(200 * time.Millisecond)
	if n := len(f.requests()); n != 0 {
		t.Fatalf("%d switches with both clusters up", n)
	}
	f.set("primary", true)
	start := time.Now()
	for len(f.requests()) == 0 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no switch 10 s after the active cluster went; status %+v", r.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.mu.Lock()
	gone := f.switchedAt.Sub(f.reached["primary"])
	f.mu.Unlock()
	if gone < 300*time.Millisecond {
		t.Fatalf("switched %v after the active cluster last answered, before after (300ms)", gone)
	}
	req := f.requests()[0]
	if req.To != "standby" || req.Mode != routing.Forced || !req.Automatic || req.OnlyFrom == nil || *req.OnlyFrom != 0 {
		t.Fatalf("switch request %+v: want forced, automatic, to standby, only from generation 0", req)
	}
	// The new active cluster goes too: the way back is a person's.
	f.set("standby", true)
	f.set("primary", false)
	time.Sleep(time.Second)
	if n := len(f.requests()); n != 1 {
		t.Fatalf("%d switches; want the one: never back by itself to the cluster a forced switch left", n)
	}
	st := r.Status()
	if st.Verdict == nil || !st.Verdict.Blocked || !strings.Contains(st.Verdict.Reason, "planned, by a person") {
		t.Fatalf("status %+v: want the failback refused, blocked", st.Verdict)
	}
	if st.LastAttempt == nil || st.LastAttempt.Outcome != routing.OutcomeSwitched {
		t.Fatalf("last attempt %+v", st.LastAttempt)
	}
}

// blockedAfterFailure runs a Runner of cfg, takes the active cluster of f
// away, and returns the first blocked verdict, failing the test after 10 s.
func blockedAfterFailure(t *testing.T, f *fakeMember, cfg Config) *Verdict {
	t.Helper()
	r := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go r.Run(ctx)
	time.Sleep(100 * time.Millisecond)
	f.set("primary", true)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if v := r.Status().Verdict; v != nil && v.Blocked {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("never blocked; status %+v", r.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunnerLagOverBudget: the lag read before the failure exceeds
// max_loss: no switch, reported blocked.
func TestRunnerLagOverBudget(t *testing.T) {
	f := &fakeMember{st: serving(0, "primary"), down: map[string]bool{}, lag: 500}
	v := blockedAfterFailure(t, f, f.config(0))
	if !strings.Contains(v.Reason, "exceeds max_loss") || v.LossRecords != 500 {
		t.Fatalf("verdict %+v: want blocked for the loss of 500 records", v)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(f.requests()); n != 0 {
		t.Fatalf("%d switches with the lag over max_loss", n)
	}
}

// TestRunnerSavedPauseStops: a pause saved on the target that this member
// has not taken yet (its table has none) still stops the switch, read just
// before it, and the verdict says so.
func TestRunnerSavedPauseStops(t *testing.T) {
	f := &fakeMember{st: serving(0, "primary"), down: map[string]bool{}, lag: 5}
	cfg := f.config(0)
	var loads atomic.Int32
	cfg.LoadFrom = func(_ context.Context, cluster string) (routing.State, bool, error) {
		loads.Add(1)
		if cluster != "standby" {
			t.Errorf("read the saved state of %s, want the target's", cluster)
		}
		st := serving(0, "primary")
		st.FailoverPaused = &routing.FailoverPause{At: time.Now()}
		return st, true, nil
	}
	v := blockedAfterFailure(t, f, cfg)
	if !strings.Contains(v.Reason, "paused in the routing state saved on standby") || loads.Load() == 0 {
		t.Fatalf("verdict %+v (%d loads): want blocked by the pause saved on the target", v, loads.Load())
	}
	if n := len(f.requests()); n != 0 {
		t.Fatalf("%d switches with a pause saved", n)
	}
}

// TestRunnerRemembersARestartedMembersLag: member 1 read a lag of 40
// records while the active cluster answered, then restarted and has read
// none since (the cluster gone). The member deciding takes the reading it
// gathered before: with the budget at 100 it switches; at 30 it is
// blocked for the loss, not for a lag unknown. And a member deciding that
// restarted itself takes its own last reading from the others' memory.
func TestRunnerRemembersARestartedMembersLag(t *testing.T) {
	if a := Actor([]int32{0, 1}); a != 0 {
		t.Fatalf("the actor of {0, 1} is %d; the cases below decide on 0", a)
	}
	for _, tc := range []struct {
		name   string
		budget int64
		act    bool
	}{{"within max_loss", 100, true}, {"over max_loss", 30, false}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeMember{st: serving(0, "primary"), down: map[string]bool{}, lag: 5}
			var mu sync.Mutex
			other := View{Member: 1, Active: "primary", Standby: "standby", StandbyUp: true, LagRecords: 40, LagSeconds: 1, LagKnown: true}
			cfg := f.config(0)
			cfg.Policy.MaxLossRecords = tc.budget
			cfg.Members = func() []Member { return []Member{{ID: 0, Alive: true}, {ID: 1, Alive: true}} }
			var r *Runner
			cfg.Views = func(context.Context) []View {
				mu.Lock()
				defer mu.Unlock()
				return []View{r.View(), other}
			}
			r = New(cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go r.Run(ctx)
			waitFor(t, "member 1's reading remembered", func() bool {
				k := r.View().Known
				return len(k) == 2 && k[1] == Reading{Member: 1, Records: 40, Seconds: 1}
			})
			// Member 1 restarted: its own reading is gone; then the
			// active cluster goes for both.
			mu.Lock()
			other.LagRecords, other.LagSeconds, other.LagKnown = 0, 0, false
			other.DownMillis, other.Error = time.Hour.Milliseconds(), "connection refused"
			mu.Unlock()
			f.set("primary", true)
			waitFor(t, "a verdict with both votes", func() bool {
				v := r.Status().Verdict
				return v != nil && v.Votes == 2 && (v.Act || v.Blocked) || len(f.requests()) > 0
			})
			if tc.act {
				waitFor(t, "the switch", func() bool { return len(f.requests()) == 1 })
				return
			}
			v := blockedVerdict(t, r)
			if !strings.Contains(v.Reason, "exceeds max_loss") || v.LossRecords != 45 {
				t.Fatalf("verdict %+v: want blocked for the loss, 45 records (5 read, 40 remembered)", v)
			}
			if n := len(f.requests()); n != 0 {
				t.Fatalf("%d switches over max_loss", n)
			}
		})
	}
	t.Run("the deciding member restarted", func(t *testing.T) {
		f := &fakeMember{st: serving(0, "primary"), down: map[string]bool{"primary": true}, lag: 5}
		cfg := f.config(0)
		cfg.Members = func() []Member { return []Member{{ID: 0, Alive: true}, {ID: 1, Alive: true}} }
		other := View{Member: 1, Active: "primary", Standby: "standby", StandbyUp: true, LagRecords: 40, LagSeconds: 1, LagKnown: true,
			DownMillis: time.Hour.Milliseconds(), Known: []Reading{{Member: 0, Records: 50, Seconds: 2}, {Member: 1, Records: 40, Seconds: 1}}}
		var r *Runner
		cfg.Views = func(context.Context) []View { return []View{r.View(), other} }
		r = New(cfg)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		waitFor(t, "the switch", func() bool { return len(f.requests()) == 1 })
		if v := r.Status().Verdict; v == nil || v.LossRecords != 90 {
			t.Fatalf("verdict %+v: want the loss bounded by 90 records (its own 50, remembered by member 1, and member 1's 40)", v)
		}
	})
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func blockedVerdict(t *testing.T, r *Runner) *Verdict {
	t.Helper()
	var v *Verdict
	waitFor(t, "a blocked verdict", func() bool { v = r.Status().Verdict; return v != nil && v.Blocked })
	return v
}

// TestRunnerStartingMemberNeverDecides: the member that would decide
// restarts and is still starting (alive in gossip, waiting for a cluster,
// answering no call). The others take another for the one deciding, which
// counts the starting member toward the quorum and its loss at the reading
// it gathered before: one switch, the loss bounded by every member's lag.
func TestRunnerStartingMemberNeverDecides(t *testing.T) {
	ids := []int32{0, 1, 2}
	starting := Actor(ids)
	var others []int32
	for _, id := range ids {
		if id != starting {
			others = append(others, id)
		}
	}
	self := Actor(others)
	var voter int32
	for _, id := range others {
		if id != self {
			voter = id
		}
	}
	f := &fakeMember{st: serving(0, "primary"), down: map[string]bool{}, lag: 5}
	cfg := f.config(self)
	var mu sync.Mutex
	restarted := false
	cfg.Members = func() []Member {
		mu.Lock()
		defer mu.Unlock()
		return []Member{{ID: starting, Alive: true, Starting: restarted}, {ID: self, Alive: true}, {ID: voter, Alive: true}}
	}
	var r *Runner
	cfg.Views = func(context.Context) []View {
		mu.Lock()
		defer mu.Unlock()
		v := View{Member: voter, Active: "primary", Standby: "standby", StandbyUp: true, LagRecords: 10, LagKnown: true}
		if !restarted {
			return []View{r.View(), v, {Member: starting, Active: "primary", Standby: "standby", StandbyUp: true, LagRecords: 20, LagKnown: true}}
		}
		v.DownMillis = time.Hour.Milliseconds()
		return []View{r.View(), v} // the starting member answers no call
	}
	r = New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	waitFor(t, "the starting member's reading remembered", func() bool { return len(r.View().Known) == 3 })
	if a := r.Status().Actor; a != starting {
		t.Fatalf("the actor before the restart: %d, want %d", a, starting)
	}
	mu.Lock()
	restarted = true
	mu.Unlock()
	f.set("primary", true)
	waitFor(t, "the switch", func() bool { return len(f.requests()) == 1 })
	st := r.Status()
	if st.Actor != self || st.Verdict == nil || st.Verdict.Votes != 2 || st.Verdict.LossRecords != 35 {
		t.Fatalf("status %+v, verdict %+v: want member %d deciding, 2 votes, a loss of 35 records (5, 10 and 20 remembered)", st, st.Verdict, self)
	}
}
