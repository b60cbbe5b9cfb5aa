package routing

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// The write lease of a fleet member.
//
// A member of a fleet forwards writes (the requests the switch holds) only
// while it holds a lease, and it renews the lease only by reading, from the
// active cluster itself, a routing state that says its own generation is
// still serving there. A planned switch writes a draining state to the
// active cluster before it holds anyone, and flips only a whole lease later
// (Switcher.SetWriteLease). So a member that the switch cannot reach — cut
// off by a gossip partition, or a paused process that wakes up after the
// flip — has stopped writing before the flip: its last renewal read the
// serving state before the draining one was written, and it measured its
// lease from before that read. The arbiter is the cluster the writes go to,
// not the gossip: a member that cannot read the active cluster cannot write
// to it either.
//
// Lease times are measured on the member's monotonic clock from the moment
// the read was sent; the switch waits on its own. Only the rates of the
// clocks have to agree, not their readings.

// LeaseStore is what the lease reads: the state saved on one cluster.
type LeaseStore interface {
	// LoadFrom returns the state saved on the named cluster, and false
	// when it holds none.
	LoadFrom(ctx context.Context, cluster string) (State, bool, error)
	// Load returns the highest generation saved on any cluster reached.
	Load(ctx context.Context) (State, bool, error)
	// Clusters names every cluster, each of which LoadFrom reads.
	Clusters() []string
}

// abandonedAfter is how much longer than its switch's timeout a draining
// state must have lasted, counted on this member's own monotonic clock
// from when it first read that state, before it is taken for one whose
// switch died. The switch never flips past its timeout, counted on its
// own clock from before it saved the state; so this member's count is the
// shorter, and the margin covers clock rates that differ and a save sent
// just before the switch's time ran out. No wall clock of one machine is
// compared with another's.
const abandonedAfter = time.Minute

// Lease is a member's write lease. Run renews it; Valid says whether it is
// in force.
type Lease struct {
	table *Table
	store LeaseStore
	ttl   time.Duration
	log   *zap.Logger
	now   func() time.Time

	base     time.Time    // monotonic origin of deadline
	deadline atomic.Int64 // nanoseconds after base; 0: never held

	mu      sync.Mutex
	changed chan struct{} // closed at the next renewal
	lastErr string        // the last renewal failure logged, to log changes only
	// draining is the switch whose draining state the renewals read, and
	// when (this member's clock) one first did.
	draining drainingSeen
	// forcedHold: this member's writes held for a forced switch (never
	// saved until it flips), and since when, on this member's clock.
	forcedHold drainingSeen
}

// drainingSeen identifies a switch's draining state and when it was first
// read.
type drainingSeen struct {
	key   string // drainingKey; "" when the last state read was serving
	since time.Time
}

// NewLease returns the lease of a member routing by table, renewed from
// store, each renewal good for ttl.
func NewLease(table *Table, store LeaseStore, ttl time.Duration, log *zap.Logger) *Lease {
	return &Lease{table: table, store: store, ttl: ttl, log: log, now: time.Now, base: time.Now(), changed: make(chan struct{})}
}

// TTL is how long one renewal holds.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Valid reports whether the lease is in force now.
func (l *Lease) Valid() bool { return l.Left() > 0 }

// Left is how long the lease stays in force from now: 0 or less when it
// is not. A write sent under it is given no longer to reach its broker
// (proxy: the upstream write's deadline).
func (l *Lease) Left() time.Duration {
	d := l.deadline.Load()
	if d == 0 {
		return 0
	}
	return time.Duration(d) - l.now().Sub(l.base)
}

// Changed returns a channel closed at the next renewal: what a write
// waiting for a lapsed lease waits on.
func (l *Lease) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Run renews the lease every quarter of its time until ctx ends, and at
// once when the routing state changes (a switch just installed a new
// generation: writes wait for the lease from the new active cluster). It
// also installs a newer generation that the clusters hold and this member
// missed (a member that was cut off when the switch installed it).
func (l *Lease) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { l.watchElsewhere(ctx) })
	t := time.NewTicker(l.ttl / 4)
	defer t.Stop()
	for {
		changed := l.table.Changed()
		l.renew(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
		}
	}
}

// renew reads the state on the active cluster once and extends the lease
// when it still serves this member's generation.
func (l *Lease) renew(ctx context.Context) {
	cur := l.table.Current()
	sent := l.now()
	rctx, cancel := context.WithTimeout(ctx, l.ttl/2)
	st, found, err := l.store.LoadFrom(rctx, cur.Active)
	cancel()
	switch {
	case err != nil:
		l.fail("the routing state could not be read from the active cluster", zap.String("cluster", cur.Active), zap.Error(err))
		return
	case !found:
		// Nothing was ever saved: generation 0, never switched.
		st = State{Generation: 0, Active: cur.Active, Phase: PhaseServing}
	}
	if st.Phase == "" {
		st.Phase = PhaseServing
	}
	if st.Generation == cur.Generation && st.Phase == PhaseServing && cur.Phase == PhaseServing {
		// A pause or resume of automatic failover this member missed.
		l.table.SetFailoverPause(st.Generation, st.FailoverPaused)
	}
	abandoned := l.abandoned(st)
	switch {
	case st.Generation > cur.Generation:
		// A switch this member missed. The other cluster is not read
		// here: the switch saves to the new active cluster first and to
		// the old one after, so the old one may not have it; Load reads
		// every cluster.
		l.adopt(ctx, st)
		return
	case st.Generation < cur.Generation || st.Active != cur.Active:
		l.fail("the active cluster holds an older routing state than this member's; not renewing the write lease",
			zap.Stringer("saved", st), zap.Stringer("routing", cur))
		return
	case st.Phase != PhaseServing && !abandoned:
		l.fail("a switch is running; the write lease is not renewed", zap.Stringer("saved", st))
		return
	case st.Phase != PhaseServing:
		// The switch that saved this died, or was cut off, and can no
		// longer flip. It may have saved the next generation on the
		// other cluster before it went, and that save may have missed
		// this one: only a read of every cluster can tell. Take the
		// newest if so; serve this generation again only when every
		// cluster was read and none holds a newer one.
		advanced, all := l.takeNewerOrServe(ctx, cur, "the switch that held writes was abandoned past its deadline; serving again")
		if advanced {
			return
		}
		if !all {
			l.fail("a switch's draining state outlived the switch, but not every cluster could be read to tell whether it flipped; the write lease is not renewed", zap.Stringer("saved", st))
			return
		}
	case l.forcedHoldAbandoned(cur):
		// The forced switch that holds this member's writes saves
		// nothing until it flips: held past any forced switch's run,
		// it died.
		if advanced, _ := l.takeNewerOrServe(ctx, cur, "the forced switch that held writes never flipped; serving again"); advanced {
			return
		}
	}
	l.extend(sent)
}

// takeNewerOrServe reads every cluster for a switch that can no longer
// flip. It may have saved the next generation somewhere before it went:
// a newer generation found on any cluster is installed (advanced).
// Otherwise, once every cluster was read (all), a member still holding
// writes for it serves its generation again, logged as why.
func (l *Lease) takeNewerOrServe(ctx context.Context, cur State, why string) (advanced, all bool) {
	newer, all := l.readEvery(ctx, cur)
	if newer.Generation > cur.Generation {
		if l.table.Advance(newer) {
			l.log.Warn("installed a newer routing state found on the clusters; this member missed the switch", zap.Stringer("routing", newer))
		}
		return true, all
	}
	if all && cur.Phase != PhaseServing {
		back := cur
		back.Phase = PhaseServing
		if l.table.Update(back) {
			l.log.Warn(why, zap.Stringer("routing", back))
		}
	}
	return false, all
}

// seenSince is when this member first saw key in seen (its own clock):
// now, if seen held another key, which key replaces.
func (l *Lease) seenSince(seen *drainingSeen, key string, now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if seen.key != key {
		*seen = drainingSeen{key: key, since: now}
	}
	return seen.since
}

// forcedHoldAbandonedAfter is how long a member holds writes for a forced
// switch before it takes the switch for dead: well past a forced switch's
// run (its hold's wait, the mirror's stop, a save and the install).
const forcedHoldAbandonedAfter = 2 * time.Minute

// forcedHoldAbandoned reports whether cur, this member's state, has held
// writes for the same forced switch for forcedHoldAbandonedAfter, on this
// member's clock.
func (l *Lease) forcedHoldAbandoned(cur State) bool {
	key := ""
	if cur.Phase != PhaseServing && cur.Last != nil && cur.Last.Mode == Forced {
		key = fmt.Sprintf("%d %s", cur.Generation, cur.SwitchID())
	}
	now := l.now()
	return key != "" && now.Sub(l.seenSince(&l.forcedHold, key, now)) > forcedHoldAbandonedAfter
}

// watchElsewhere reads every cluster once a lease, and installs a newer
// generation than this member's found on any (lookElsewhere). Renewals read
// the active cluster only, and a forced failover may not reach it to save
// the new generation there: a member cut off from the fleet that still
// reaches the old cluster would renew from it for good. The forced switch
// saves to the new active cluster first, so such a member, reading it
// here, moves over within about a lease of the save. One that reaches only
// the old cluster cannot learn of the switch (docs/ARCHITECTURE.md, "The
// fleet").
func (l *Lease) watchElsewhere(ctx context.Context) {
	t := time.NewTicker(l.ttl)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.lookElsewhere(ctx)
	}
}

// lookElsewhere installs the highest generation any cluster holds when it
// is newer than this member's (and not voided), and reports whether it did;
// only while the active cluster holds this member's generation serving,
// which is what a forced switch leaves there. A planned switch writes its
// draining state to the active cluster first and saves the next generation
// elsewhere only a whole lease later, and its rollback voids that
// generation there before anyone serves again: a member must not take a
// generation saved elsewhere that the switch may still roll back. The read
// of the active cluster and the load are bounded together by half a lease,
// so they cannot straddle a planned switch's draining save and its next
// save.
func (l *Lease) lookElsewhere(ctx context.Context) bool {
	cur := l.table.Current()
	ctx, cancel := context.WithTimeout(ctx, l.ttl/2)
	defer cancel()
	st, found, err := l.store.LoadFrom(ctx, cur.Active)
	if err != nil || found && (st.Generation != cur.Generation || st.Phase != "" && st.Phase != PhaseServing) {
		return false
	}
	return l.adopt(ctx, cur)
}

// abandoned reports whether st, a switch's draining state, was left by a
// switch that can no longer flip: this member has read it for longer than
// the switch's timeout and abandonedAfter, on its own clock. A member that
// (re)starts while it is there counts from then; a serving state ends the
// count.
func (l *Lease) abandoned(st State) bool {
	key, timeout := drainingKey(st)
	now := l.now()
	return key != "" && timeout > 0 && now.Sub(l.seenSince(&l.draining, key, now)) > timeout+abandonedAfter
}

// drainingKey identifies the switch that saved st (equal readings of the
// same switcher's clock, never compared with another's) and returns its
// timeout; "" for a state no switch is running in.
func drainingKey(st State) (string, time.Duration) {
	if st.Phase == PhaseServing || st.Phase == "" || st.Last == nil {
		return "", 0
	}
	sw := st.Last
	return fmt.Sprintf("%d %s %s>%s %d", st.Generation, sw.Mode, sw.From, sw.To, sw.Started.UnixNano()), sw.timeout()
}

// readEvery reads every cluster and returns the newest state any holds (of
// a generation that no state read voids, nor cur), and whether every
// cluster was read.
func (l *Lease) readEvery(ctx context.Context, cur State) (State, bool) {
	ctx, cancel := context.WithTimeout(ctx, l.ttl)
	defer cancel()
	results := readEach(ctx, l.store.Clusters(), l.store.LoadFrom)
	all := !slices.ContainsFunc(results, func(r readResult) bool { return r.err != nil })
	best := State{}
	for _, r := range results {
		if r.err != nil || !r.found || cur.IsVoided(r.st.Generation) || voidedIn(results, r.st.Generation) {
			continue
		}
		if r.st.Generation > best.Generation {
			best = r.st
		}
	}
	return best, all
}

// adopt installs the newest state the clusters hold if it is newer than
// this member's (at least seen, which was read from one of them), and
// reports whether it did. The highest of every cluster's is taken, so a
// state the switch saved is never passed over for an older one.
func (l *Lease) adopt(ctx context.Context, seen State) bool {
	rctx, cancel := context.WithTimeout(ctx, l.ttl)
	st, found, err := l.store.Load(rctx)
	cancel()
	if err != nil || !found || st.Generation < seen.Generation {
		st = seen
	}
	cur := l.table.Current()
	if st.Generation <= cur.Generation || cur.IsVoided(st.Generation) {
		return false
	}
	if l.table.Advance(st) {
		l.log.Warn("installed a newer routing state found on the clusters; this member missed the switch", zap.Stringer("routing", st))
		return true
	}
	return false
}

// extend moves the deadline to ttl after sent, never backwards.
func (l *Lease) extend(sent time.Time) {
	d := int64(sent.Sub(l.base) + l.ttl)
	for {
		old := l.deadline.Load()
		if d <= old {
			return
		}
		if l.deadline.CompareAndSwap(old, d) {
			break
		}
	}
	l.mu.Lock()
	if l.lastErr != "" {
		l.log.Info("write lease renewed")
		l.lastErr = ""
	}
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// fail logs why a renewal did not happen, once per reason.
func (l *Lease) fail(msg string, fields ...zap.Field) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastErr == msg {
		return
	}
	l.lastErr = msg
	l.log.Warn(msg, fields...)
}
