package failover

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/routing"
)

// Config is what a Runner needs of its member.
type Config struct {
	Policy Policy
	Self   int32
	// Routes is the routing state the member serves.
	Routes func() routing.State
	// Standby names the cluster a switch from active goes to ("" none).
	Standby func(active string) string
	// Probe reports whether this member reaches the named cluster now
	// (an error says why not); it returns within ctx.
	Probe func(ctx context.Context, cluster string) error
	// Lag is the lag of the partitions this member mirrors (records
	// summed, seconds the largest); ok is false while no mirror runs.
	Lag func() (records int64, seconds float64, ok bool)
	// Members lists every member known that did not leave, this one
	// included; Views gathers each alive member's View (this one's
	// included). Both nil for a member alone.
	Members func() []Member
	Views   func(ctx context.Context) []View
	// LoadFrom reads the routing state saved on a cluster: the target's
	// is read once more before a switch, so that a pause this member has
	// not learnt yet stops it (the active cluster, gone, is not waited
	// for). Nil: not read.
	LoadFrom func(ctx context.Context, cluster string) (routing.State, bool, error)
	// Switch runs the forced switch (routing.Switcher's Switch).
	Switch func(ctx context.Context, req routing.Request) (routing.State, error)
	// Interval is how often the clusters are probed and the decision
	// taken. Default 500 ms.
	Interval   time.Duration
	Log        *zap.Logger
	Registerer prometheus.Registerer
}

// Status is the detector as /status shows it.
type Status struct {
	Enabled bool `json:"enabled"`
	// Stopped says why automatic failover stopped while the member runs
	// (a cluster retired), with Enabled false; "" otherwise.
	Stopped string `json:"stopped,omitempty"`
	// After, MinInterval and the loss budget, as configured.
	After          string  `json:"after"`
	MinInterval    string  `json:"min_interval"`
	MaxLossRecords int64   `json:"max_loss_records"`
	MaxLossSeconds float64 `json:"max_loss_seconds"`
	// View is this member's.
	View View `json:"view"`
	// Actor is the member that decides and acts.
	Actor int32 `json:"actor"`
	// Verdict is the last decision, on the actor (nil elsewhere).
	Verdict *Verdict `json:"verdict,omitempty"`
	// ActInSeconds is, while the votes are short only of time, how long
	// until the last vote needed would come.
	ActInSeconds *float64 `json:"act_in_seconds,omitempty"`
	// LastAttempt is this member's last automatic switch: when and how
	// it ended.
	LastAttempt *Attempt `json:"last_attempt,omitempty"`
}

// Attempt is an automatic switch this member ran.
type Attempt struct {
	At      time.Time `json:"at"`
	To      string    `json:"to"`
	Outcome string    `json:"outcome"`
}

// Runner probes the clusters, keeps this member's View, and on the actor
// decides and runs the automatic switch.
type Runner struct {
	cfg Config
	m   *metrics

	mu          sync.Mutex
	gen         uint32
	active      string
	lastReached time.Time // monotonic: the last probe that reached the active cluster (or when counting began)
	downErr     string
	standbyUp   bool
	lag         View // the lag fields, at the last reach
	known       map[int32]Reading
	gathered    time.Time // the last gathering of the others' views
	verdict     *Verdict
	actor       int32
	attempt     *Attempt
	retryAt     time.Time // no attempt before this, after one failed
}

// New returns a Runner; Run starts it.
func New(cfg Config) *Runner {
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	r := &Runner{cfg: cfg, m: newMetrics(cfg.Registerer), actor: -1, known: map[int32]Reading{}}
	st := cfg.Routes()
	r.gen, r.active, r.lastReached = st.Generation, st.Active, time.Now()
	return r
}

// Run probes and decides every Interval until ctx ends.
func (r *Runner) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		r.probe(ctx)
		r.decide(ctx)
		r.keepReadings(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probe reaches the active cluster and the standby, at once, each within
// the interval (a frozen broker counts as unreachable), and updates the
// view.
func (r *Runner) probe(ctx context.Context) {
	st := r.cfg.Routes()
	standby := r.cfg.Standby(st.Active)
	pctx, cancel := context.WithTimeout(ctx, r.callTimeout())
	defer cancel()
	var activeErr, standbyErr error
	var wg sync.WaitGroup
	wg.Go(func() { activeErr = r.cfg.Probe(pctx, st.Active) })
	if standby != "" {
		wg.Go(func() { standbyErr = r.cfg.Probe(pctx, standby) })
	} else {
		standbyErr = errors.New("no standby")
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.Generation != r.gen || st.Active != r.active {
		// A new generation: its active cluster is counted afresh, and
		// the lag read again.
		r.gen, r.active, r.lastReached, r.lag = st.Generation, st.Active, now, View{}
		clear(r.known)
	}
	r.standbyUp = standbyErr == nil
	if activeErr == nil {
		r.lastReached, r.downErr = now, ""
		if rec, sec, ok := r.cfg.Lag(); ok {
			r.lag = View{LagRecords: rec, LagSeconds: sec, LagKnown: true}
			r.known[r.cfg.Self] = Reading{Member: r.cfg.Self, Generation: r.gen, Records: rec, Seconds: sec}
		}
	} else {
		if r.downErr == "" {
			r.cfg.Log.Warn("the active cluster is unreachable", zap.String("cluster", st.Active), zap.Error(activeErr))
		}
		r.downErr = activeErr.Error()
	}
	r.m.down.Set(r.viewLocked(now).Down().Seconds())
}

// callTimeout bounds a probe and the gathering of views: a frozen
// cluster or member counts as not answering.
func (r *Runner) callTimeout() time.Duration { return max(r.cfg.Interval, 2*time.Second) }

// View is this member's view now.
func (r *Runner) View() View {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.viewLocked(time.Now())
}

func (r *Runner) viewLocked(now time.Time) View {
	v := r.lag
	v.Member, v.Generation, v.Active = r.cfg.Self, r.gen, r.active
	v.Standby, v.StandbyUp = r.cfg.Standby(r.active), r.standbyUp
	if r.downErr != "" {
		v.DownMillis = max(1, now.Sub(r.lastReached).Milliseconds())
		v.Error = r.downErr
	}
	for _, k := range r.known {
		if k.Generation == r.gen {
			v.Known = append(v.Known, k)
		}
	}
	slices.SortFunc(v.Known, func(a, b Reading) int { return cmp.Compare(a.Member, b.Member) })
	return v
}

// readingsEvery is how many probes apart a member gathers the others'
// views while the active cluster answers it (2 s at the default
// interval), to remember their lag readings: the member that decides
// after a failure may be one that restarted since (or took over from one
// that did), and the loss is bounded only with every member's last
// reading before the failure. Each member asks each other one: n² small
// calls per period, for fleets of a few members.
const readingsEvery = 4

// keepReadings gathers the others' views every readingsEvery probes while this
// member reaches the active cluster (while it does not, decide gathers
// them on the member deciding).
func (r *Runner) keepReadings(ctx context.Context) {
	if r.cfg.Views == nil {
		return
	}
	r.mu.Lock()
	due := r.downErr == "" && time.Since(r.gathered) >= readingsEvery*r.cfg.Interval
	r.mu.Unlock()
	if due {
		r.gather(ctx)
	}
}

// gather asks the alive members for their views and remembers the lag
// readings in them: a member's own reading replaces what was known of
// it; one another member remembers fills a gap only (never a reading
// this member had, which is as new).
func (r *Runner) gather(ctx context.Context) []View {
	vctx, cancel := context.WithTimeout(ctx, r.callTimeout())
	views := r.cfg.Views(vctx)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gathered = time.Now()
	for _, v := range views {
		if v.Generation == r.gen && v.LagKnown && !v.LagRemembered {
			r.known[v.Member] = Reading{Member: v.Member, Generation: v.Generation, Records: v.LagRecords, Seconds: v.LagSeconds}
		}
	}
	for _, v := range views {
		for _, k := range v.Known {
			if _, ok := r.known[k.Member]; !ok && k.Generation == r.gen {
				r.known[k.Member] = k
			}
		}
	}
	return views
}

// withRemembered fills in, for every view without its own lag reading,
// the last reading of it known here; and adds, for a member of st that did
// not answer (restarted, still waiting for a cluster), a view of its last
// reading alone: no vote, its partitions' loss bounded.
func (r *Runner) withRemembered(st routing.State, members []Member, views []View) []View {
	r.mu.Lock()
	defer r.mu.Unlock()
	heard := make(map[int32]bool, len(views))
	for i, v := range views {
		heard[v.Member] = true
		if k, ok := r.known[v.Member]; ok && !v.LagKnown && k.Generation == v.Generation {
			views[i].LagRecords, views[i].LagSeconds, views[i].LagKnown, views[i].LagRemembered = k.Records, k.Seconds, true, true
		}
	}
	for _, m := range members {
		if k, ok := r.known[m.ID]; ok && !heard[m.ID] && k.Generation == st.Generation {
			views = append(views, View{Member: m.ID, Generation: st.Generation, Active: st.Active,
				LagRecords: k.Records, LagSeconds: k.Seconds, LagKnown: true, LagRemembered: true})
		}
	}
	return views
}

// decide, on the actor, gathers the views and switches when Decide says
// so. A member that reaches the active cluster itself never acts on the
// others' word: it decides only while its own view is down.
func (r *Runner) decide(ctx context.Context) {
	self := r.View()
	members := []Member{{ID: r.cfg.Self, Alive: true}}
	if r.cfg.Members != nil {
		members = r.cfg.Members()
	}
	var alive []int32
	for _, m := range members {
		if m.Alive && !m.Starting {
			alive = append(alive, m.ID)
		}
	}
	actor := Actor(alive)
	r.mu.Lock()
	r.actor = actor
	r.mu.Unlock()
	if actor != r.cfg.Self {
		r.setVerdict(nil)
		return
	}
	st := r.cfg.Routes()
	if self.DownMillis == 0 || self.Generation != st.Generation {
		r.setVerdict(&Verdict{Reason: "the active cluster answers this member", Members: len(members), Needed: Quorum(len(members))})
		return
	}
	views := []View{self}
	if r.cfg.Views != nil {
		views = r.gather(ctx)
	}
	v := Decide(r.cfg.Policy, st, r.cfg.Standby(st.Active), members, r.withRemembered(st, members, views), time.Now())
	r.setVerdict(&v)
	if !v.Act {
		return
	}
	r.mu.Lock()
	wait := time.Until(r.retryAt)
	r.mu.Unlock()
	if wait > 0 {
		return
	}
	if r.cfg.LoadFrom != nil {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		saved, ok, err := r.cfg.LoadFrom(lctx, v.Target)
		cancel()
		switch {
		case err != nil:
			v.Act, v.Blocked, v.Reason = false, false, "the saved routing state could not be read before switching: "+err.Error()
			r.setVerdict(&v)
			return
		case ok && saved.Generation > st.Generation:
			return // switched already; this member learns it from its lease
		case ok && saved.Generation == st.Generation && saved.FailoverPaused != nil:
			v.Act, v.Blocked, v.Reason = false, true, "automatic failover is paused in the routing state saved on "+v.Target+" (this member has not taken the pause yet)"
			r.setVerdict(&v)
			return
		}
	}
	r.cfg.Log.Warn("automatic failover: switching by force", zap.String("from", st.Active), zap.String("to", v.Target),
		zap.Uint32("generation", st.Generation), zap.String("why", v.Reason))
	gen := st.Generation
	// The active cluster has not answered this member for after: the
	// save does not wait for it (it is written in the background).
	next, err := r.cfg.Switch(ctx, routing.Request{To: v.Target, Mode: routing.Forced, Automatic: true, OnlyFrom: &gen, FromUnreachable: true})
	a := &Attempt{At: time.Now().UTC(), To: v.Target, Outcome: routing.OutcomeSwitched}
	if err != nil {
		a.Outcome = "failed: " + err.Error()
		r.m.switches.WithLabelValues("failed").Inc()
		r.cfg.Log.Error("automatic failover failed; tried again after the policy's after", zap.Error(err))
		r.mu.Lock()
		r.retryAt = time.Now().Add(r.cfg.Policy.After)
		r.mu.Unlock()
	} else {
		r.m.switches.WithLabelValues("switched").Inc()
		r.cfg.Log.Warn("automatic failover: switched", zap.Stringer("routing", next))
	}
	r.mu.Lock()
	r.attempt = a
	r.mu.Unlock()
}

func (r *Runner) setVerdict(v *Verdict) {
	r.mu.Lock()
	r.verdict = v
	r.mu.Unlock()
	votes, needed, blocked := 0.0, 0.0, 0.0
	if v != nil {
		votes, needed = float64(v.Votes), float64(v.Needed)
		if v.Blocked {
			blocked = 1
		}
	}
	r.m.votes.Set(votes)
	r.m.needed.Set(needed)
	r.m.blocked.Set(blocked)
}

// Status is the detector now.
func (r *Runner) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.cfg.Policy
	s := Status{Enabled: true, After: p.After.String(), MinInterval: p.MinInterval.String(),
		MaxLossRecords: p.MaxLossRecords, MaxLossSeconds: p.MaxLossSeconds,
		View: r.viewLocked(time.Now()), Actor: r.actor, LastAttempt: r.attempt}
	if r.verdict != nil {
		v := *r.verdict
		s.Verdict = &v
		if !v.Act && v.ActIn > 0 {
			in := v.ActIn.Seconds()
			s.ActInSeconds = &in
		}
	}
	return s
}

type metrics struct {
	down, votes, needed, blocked prometheus.Gauge
	switches                     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		down: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Subsystem: "failover", Name: "active_unreachable_seconds",
			Help: "How long this member has failed to reach the active cluster (0: reached at its last probe)."}),
		votes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Subsystem: "failover", Name: "votes",
			Help: "On the member that decides: how many members see the active cluster gone for the policy's after, the standby answering."}),
		needed: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Subsystem: "failover", Name: "votes_needed",
			Help: "On the member that decides: the quorum, a majority of the members known."}),
		blocked: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Subsystem: "failover", Name: "blocked",
			Help: "1 while a quorum sees the active cluster gone but the policy refuses an automatic switch (loss over max_loss, a failback, within min_interval, lag unknown): a person must decide."}),
		switches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Subsystem: "failover", Name: "switches_total",
			Help: "Automatic switches this member ran, by outcome (switched, failed)."}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.down, m.votes, m.needed, m.blocked, m.switches)
	}
	return m
}
