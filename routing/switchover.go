package routing

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Members is how a switch reaches the members that serve clients: this
// member alone, or every live member of a fleet. Each step returns once
// every live member has done it, so that a fleet can acknowledge it.
type Members interface {
	// Hold makes every member hold new writes (produces, offset commits,
	// transactional calls; st's phase is draining) and returns once every
	// write each had already sent upstream has been answered.
	Hold(ctx context.Context, st State) error
	// Install makes every member route by st and release what it holds,
	// sending it where st says.
	Install(ctx context.Context, st State) error
}

// Mirror is the part of the mirror a switch drives.
type Mirror interface {
	// Halted lists the mirrored partitions that stopped on an error, as
	// "topic[partition]: reason".
	Halted() []string
	// Drain returns once the standby holds every offset the active
	// cluster holds (data, transaction markers, fillers), with no open
	// transaction left in between, or ctx's error with what still lags.
	Drain(ctx context.Context) error
	// SyncGroups copies every group's committed offsets to the standby.
	SyncGroups(ctx context.Context) error
	// Stop stops the mirror and returns where each partition stood.
	Stop() []Position
	// Follow starts the mirror the way st says (its active cluster to
	// the other), in the background.
	Follow(st State) error
}

// Position is where the mirror stood on a partition when it stopped.
type Position struct {
	Topic     string
	Partition int32
	// Standby is the standby's end offset: every offset below it is
	// there, at its source offset.
	Standby int64
	// Source is the source's end offset last seen.
	Source int64
	// Committed is the standby's last stable offset when below Standby
	// (nil: not read, or no transaction open): from there the standby
	// holds records of a source transaction whose end it never received.
	// A forced switch aborts that transaction (LeftOpenAborter), so they
	// count as lost.
	Committed *int64 `json:",omitempty"`
	// Matches, when set, is where the standby parts from the source: its
	// writer halted finding something else there (a stray marker, a
	// batch of another writer). Below it the standby holds what the
	// source does; from it the source's records are lost to a forced
	// switch, whatever the standby's end.
	Matches *int64 `json:",omitempty"`
}

// LeftOpenAborter is a Mirror that can abort, on the cluster a forced
// switch makes active, the transactions its stopped writers left open
// there: their source's outcome will never come, and until the broker's
// timeout every read_committed reader of those partitions would stop at
// them.
type LeftOpenAborter interface {
	AbortLeftOpen(ctx context.Context, cluster string) error
}

// Store keeps the routing state durable.
type Store interface {
	// Save writes st to every cluster it can reach; it fails unless the
	// cluster st makes active has it.
	Save(ctx context.Context, st State) error
	// Load returns the state of the highest generation found on the
	// clusters it can reach, and false when none holds one.
	Load(ctx context.Context) (State, bool, error)
}

// Request asks for a switch.
type Request struct {
	To      string        `json:"to"`
	Mode    Mode          `json:"mode,omitempty"`
	Timeout time.Duration `json:"-"`
	// SkipPrincipalCheck, for a forced switch only, flips even when some
	// mapped client principals cannot authenticate on the target.
	SkipPrincipalCheck bool `json:"-"`
	// Automatic marks a switch the fleet decided on itself (package
	// failover); it is recorded in the switch (Switch.Automatic).
	Automatic bool `json:"-"`
	// OnlyFrom, when set, refuses the switch unless the generation in
	// force is this one: a decision taken on views of one generation is
	// never carried out on another (ReasonSuperseded).
	OnlyFrom *uint32 `json:"-"`
	// FromUnreachable, for a forced switch, says the caller has found the
	// cluster it leaves unreachable for a while (automatic failover: for
	// its after): the save does not wait to read or write it, and writes
	// it in the background (WithUnreachable).
	FromUnreachable bool `json:"-"`
}

type unreachableKey struct{}

// WithUnreachable returns ctx carrying clusters a forced switch's save
// need not wait for (Request.FromUnreachable); Unreachable reads them.
func WithUnreachable(ctx context.Context, clusters []string) context.Context {
	if len(clusters) == 0 {
		return ctx
	}
	return context.WithValue(ctx, unreachableKey{}, slices.Clone(clusters))
}

// Unreachable is what WithUnreachable put in ctx.
func Unreachable(ctx context.Context) []string {
	c, _ := ctx.Value(unreachableKey{}).([]string)
	return c
}

// PrincipalCheck authenticates every mapped client principal on cluster
// and lists, "principal: why", those that failed.
type PrincipalCheck func(ctx context.Context, cluster string) ([]string, error)

// DefaultSwitchTimeout bounds a planned switch's drain when the request
// names none.
const DefaultSwitchTimeout = 30 * time.Second

// Refusal reasons; each is an *Error's Reason.
const (
	ReasonBadRequest     = "bad_request"
	ReasonUnknownCluster = "unknown_cluster"
	ReasonAlreadyActive  = "already_active"
	ReasonRunning        = "switch_running"
	ReasonHalted         = "mirror_halted"
	ReasonNoMirror       = "no_mirror"
	ReasonDrainTimeout   = "drain_timeout"
	ReasonSaveFailed     = "save_failed"
	// ReasonPrincipals: some client principals mapped to their own
	// credentials could not authenticate on the target (Error.Principals).
	ReasonPrincipals = "principals_unauthenticated"
	// ReasonSuperseded: a cluster (or a member) holds a newer routing
	// state, or another switch's state of the same generation, which
	// this switch must not replace (KafkaStore.Save, Table.UpdateFor).
	ReasonSuperseded = "superseded"
	// ReasonGenerationLimit: the next generation would be past
	// MaxGeneration, which virtual epochs cannot carry (identity.go).
	ReasonGenerationLimit = "generation_limit"
)

// Error is a switch refused or rolled back; nothing changed for clients.
type Error struct {
	Reason string
	Msg    string
	// Partitions names the partitions concerned (halted, still lagging).
	Partitions []string
	// Principals names the client principals that could not
	// authenticate on the target, each with why.
	Principals []string
	// Switch, with ReasonRunning, is the ID of the switch already
	// running, when known.
	Switch string

	err error // wrapped
}

// Unwrap returns the error e wraps, if any.
func (e *Error) Unwrap() error { return e.err }

func (e *Error) Error() string {
	switch {
	case len(e.Principals) > 0:
		return fmt.Sprintf("%s: %v", e.Msg, e.Principals)
	case len(e.Partitions) == 0:
		return e.Msg
	}
	return fmt.Sprintf("%s: %v", e.Msg, e.Partitions)
}

// Switcher runs switches of the active cluster, one at a time.
//
// Planned: hold writes on every member (EndTxn aside) → drain the mirror →
// hold EndTxn too → drain what ending transactions added → (in a fleet)
// wait out the write leases and drain again → copy the groups' committed
// offsets → stop the mirror → save the next generation
// durably → install it on every member (which releases the held writes to
// the new active cluster) → start the mirror the other way. A drain that
// times out rolls back: the writes are released to the old cluster.
//
// Forced: stop the mirror, record what it had not copied, save and install
// the next generation at once.
type Switcher struct {
	table   *Table
	members Members
	mirror  Mirror // nil when the mirror is disabled
	store   Store  // nil: not durable (tests)
	// clusters are those a switch may go to; Retire replaces the slice.
	clusters atomic.Pointer[[]string]
	log      *zap.Logger
	now      func() time.Time
	// skew is added to the wall-clock stamps a switch saves (SkewClock).
	skew time.Duration
	// advertised, when set, gives the API versions saved with each new
	// state (State.APIVersions).
	advertised func() map[int16][2]int16
	// features, when set, gives the finalized feature levels saved with
	// each new state (State.Features).
	features func() map[string]int16
	// lease is the fleet's write lease (lease.go); 0 when the member is
	// on its own and every member is reached by Members.
	lease time.Duration
	// principals, when set, is run against the target before a switch
	// holds or flips anything.
	principals PrincipalCheck

	mu      sync.Mutex             // one switch at a time (TryLock)
	running atomic.Pointer[string] // the ID of the switch mu is held for
}

// SkewClock makes this member stamp the switches it runs (Started,
// Deadline, Finished: the wall-clock times saved in the routing state,
// which other members read) as a machine whose wall clock is d off would;
// its durations and deadlines keep counting on the monotonic clock, as a
// skewed machine's do. For fault injection only (the chaos run): no
// member's decision may depend on two machines' wall clocks agreeing.
func (s *Switcher) SkewClock(d time.Duration) { s.skew = d }

// wall is t as this member's wall clock reads it, without the monotonic
// reading: what a switch saves.
func (s *Switcher) wall(t time.Time) time.Time { return t.Add(s.skew).UTC() }

// NewSwitcher returns a switcher over the given table and members. mirror
// and store may be nil.
func NewSwitcher(table *Table, members Members, mirror Mirror, store Store, clusters []string, log *zap.Logger) *Switcher {
	s := &Switcher{table: table, members: members, mirror: mirror, store: store, log: log, now: time.Now}
	s.clusters.Store(&clusters)
	return s
}

// Clusters names the clusters a switch may go to.
func (s *Switcher) Clusters() []string { return *s.clusters.Load() }

// Retire takes cluster out of those a switch may go to, running also (the
// member's own retiring of it) first, while no switch can start here:
// refused with ReasonRunning while a switch runs or another member's
// holds this one's writes, and refused when cluster is the active one.
// When also fails, nothing changes here.
func (s *Switcher) Retire(cluster string, also func() error) error {
	if !s.mu.TryLock() {
		return s.lockedOut()
	}
	defer s.mu.Unlock()
	names := s.Clusters()
	if !slices.Contains(names, cluster) {
		return &Error{Reason: ReasonUnknownCluster, Msg: fmt.Sprintf("cluster %q is not configured (clusters: %v)", cluster, names)}
	}
	cur := s.table.Current()
	if cur.Phase != PhaseServing {
		return heldBy(cur)
	}
	if cur.Active == cluster {
		return &Error{Reason: ReasonBadRequest, Msg: fmt.Sprintf("cluster %q is the active cluster (%s): switch away from it first", cluster, cur)}
	}
	if err := also(); err != nil {
		return err
	}
	next := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == cluster })
	s.clusters.Store(&next)
	return nil
}

// SaveVersions makes every state the switcher saves carry the API versions
// f returns: what the member advertises, so that one restarted while a
// cluster is down keeps to them.
func (s *Switcher) SaveVersions(f func() map[int16][2]int16) { s.advertised = f }

// SaveFeatures makes every state the switcher saves carry the finalized
// feature levels f returns (nil: keep the last saved), for the same reason.
func (s *Switcher) SaveFeatures(f func() map[string]int16) { s.features = f }

// CheckPrincipals makes every switch, planned or forced, first check that
// the mapped client principals authenticate on its target (f), and refuse
// with ReasonPrincipals, listing those that do not, before it holds any
// write. A forced switch asked with SkipPrincipalCheck goes on regardless.
func (s *Switcher) CheckPrincipals(f PrincipalCheck) { s.principals = f }

// SetWriteLease makes planned switches wait out the members' write leases
// (lease.go): the draining state is saved to the active cluster before
// anyone holds, and the flip comes a whole lease after, so that a member
// the switch did not reach has stopped writing to the old cluster by then.
func (s *Switcher) SetWriteLease(ttl time.Duration) { s.lease = ttl }

// Switch runs one switch and returns the state in force once it is done.
// Repeating a switch that finished answers the same state.
func (s *Switcher) Switch(ctx context.Context, req Request) (State, error) {
	if req.Mode == "" {
		req.Mode = Planned
	}
	if req.Mode != Planned && req.Mode != Forced {
		return State{}, &Error{Reason: ReasonBadRequest, Msg: fmt.Sprintf("mode %q: want planned or forced", req.Mode)}
	}
	if names := s.Clusters(); !slices.Contains(names, req.To) {
		return State{}, &Error{Reason: ReasonUnknownCluster, Msg: fmt.Sprintf("cluster %q is not configured (clusters: %v)", req.To, names)}
	}
	if !s.mu.TryLock() {
		return State{}, s.lockedOut()
	}
	defer s.mu.Unlock()
	if names := s.Clusters(); !slices.Contains(names, req.To) { // retired meanwhile
		return State{}, &Error{Reason: ReasonUnknownCluster, Msg: fmt.Sprintf("cluster %q is not configured (clusters: %v)", req.To, names)}
	}
	id := newSwitchID()
	s.running.Store(&id)
	cur := s.table.Current()
	if cur.Phase != PhaseServing {
		return State{}, heldBy(cur) // another member's switch holds this one
	}
	if req.OnlyFrom != nil && *req.OnlyFrom != cur.Generation {
		return State{}, &Error{Reason: ReasonSuperseded, Msg: fmt.Sprintf("decided in generation %d, and generation %d is in force (%s)", *req.OnlyFrom, cur.Generation, cur)}
	}
	if cur.Active == req.To {
		if l := cur.Last; l != nil && l.To == req.To && l.Mode == req.Mode && l.Outcome == OutcomeSwitched {
			return cur, nil // a repeat of the call that got us here
		}
		return State{}, &Error{Reason: ReasonAlreadyActive, Msg: fmt.Sprintf("cluster %q is already active (%s)", req.To, cur)}
	}
	if gen := nextGeneration(cur); gen > MaxGeneration {
		// Past it clients' leader epochs would wrap negative (or go
		// backwards): refused before anything is held.
		return State{}, &Error{Reason: ReasonGenerationLimit, Msg: fmt.Sprintf("the next generation, %d, is past %d, the last that clients' leader epochs can carry; nothing was held or switched (the routing state must be reset to generation 0 with every client restarted: docs/RUNBOOK.md)", gen, MaxGeneration)}
	}
	if req.Timeout <= 0 {
		req.Timeout = DefaultSwitchTimeout
	}
	if req.SkipPrincipalCheck && req.Mode != Forced {
		return State{}, &Error{Reason: ReasonBadRequest, Msg: "skipping the principals' check is for a forced switch only"}
	}
	if s.principals != nil && !req.SkipPrincipalCheck {
		failed, err := s.principals(ctx, req.To)
		if err != nil {
			return State{}, &Error{Reason: ReasonPrincipals, Msg: fmt.Sprintf("checking the mapped principals on %s: %v", req.To, err)}
		}
		if len(failed) > 0 {
			s.log.Warn("switch refused: mapped principals cannot authenticate on the target", zap.String("to", req.To), zap.Strings("principals", failed))
			return State{}, &Error{Reason: ReasonPrincipals, Principals: failed,
				Msg: fmt.Sprintf("%d mapped client principal(s) cannot authenticate on %s; nothing was held or switched (fix their credentials there, or switch forced with force_unauthenticated)", len(failed), req.To)}
		}
	}
	// start keeps the monotonic reading: the switch's own deadline is
	// counted on it, never on the wall clock (which may step).
	start := s.now()
	sw := &Switch{ID: id, Mode: req.Mode, Automatic: req.Automatic, From: cur.Active, To: req.To, Started: s.wall(start)}
	// Every state this switch installs, whatever its outcome, has sw as
	// Last and the switch before it in the history.
	cur.History = pushHistory(cur.History, cur.Last)
	log := s.log.With(zap.String("switch", sw.ID), zap.String("from", sw.From), zap.String("to", sw.To), zap.String("mode", string(sw.Mode)), zap.Uint32("generation", cur.Generation))
	log.Info("switch starting")
	var next State
	var err error
	if req.Mode == Planned {
		next, err = s.planned(ctx, cur, sw, start, req.Timeout, log)
	} else {
		var unreachable []string
		if req.FromUnreachable {
			unreachable = []string{cur.Active}
		}
		next, err = s.forced(ctx, cur, sw, unreachable, log)
	}
	if err != nil {
		log.Error("switch did not happen", zap.Error(err))
		return State{}, err
	}
	log.Info("switched", zap.Stringer("routing", next), zap.String("duration", sw.Duration), zap.Int("lost_ranges", len(sw.Lost)))
	return next, nil
}

func (s *Switcher) planned(ctx context.Context, cur State, sw *Switch, start time.Time, timeout time.Duration, log *zap.Logger) (State, error) {
	if s.mirror == nil {
		return State{}, &Error{Reason: ReasonNoMirror, Msg: "the mirror is disabled: the standby has not been kept in step, so a planned switch cannot lose nothing (a forced one can be asked for)"}
	}
	if h := s.mirror.Halted(); len(h) > 0 {
		return State{}, &Error{Reason: ReasonHalted, Msg: "mirror partitions are halted; fix them (or switch forced, losing what they lack)", Partitions: h}
	}
	// Hold installs the draining state on every member, this one's table
	// included.
	sw.Deadline = sw.Started.Add(timeout)
	sw.TimeoutMillis = timeout.Milliseconds()
	draining := cur
	draining.Phase = PhaseDraining
	draining.Last = sw
	voided := false     // a generation was voided: the clusters must learn it
	superseded := false // the clusters hold a newer state: nothing to save
	rollback := func(why error) (State, error) {
		back := cur
		back.Phase = PhaseServing
		sw.Outcome = "rolled back: " + why.Error()
		s.finish(sw)
		back.Last = sw
		if now := s.table.Current(); now.Generation > cur.Generation {
			// Another switch flipped meanwhile (its install reached
			// this member): that, not why, is what stopped this one,
			// and its state is not to be saved over.
			superseded = true
			why = &Error{Reason: ReasonSuperseded, err: why, Msg: fmt.Sprintf("another switch flipped meanwhile (this member routes by %s); this one did not: %v", now, why)}
		}
		if (s.lease > 0 || voided) && !superseded {
			// Leases renew only once the serving state is back; a
			// voided generation must reach the clusters.
			if sup := s.saveUntilDone(back, log); sup != nil {
				// Another switch flipped and saved, its install not
				// yet here (a forced one that stopped the mirror
				// under this one's drain): that is what stopped
				// this one.
				superseded = true
				why = &Error{Reason: ReasonSuperseded, err: why, Msg: fmt.Sprintf("another switch's routing state was saved meanwhile (%v); this one did not flip: %v", sup, why)}
			}
		}
		// A fresh context: the caller's may be what ended.
		ictx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.members.Install(ictx, back); err != nil {
			log.Error("releasing held writes after the rollback", zap.Error(err))
		}
		return State{}, why
	}
	dctx, cancel := context.WithDeadline(ctx, start.Add(timeout))
	defer cancel()
	mark := s.stepper(sw)
	var leaseEnds time.Time
	if s.lease > 0 {
		// From here on no member renews its write lease: every lease
		// still in force ends within one more.
		if err := s.save(dctx, draining); err != nil {
			if errors.Is(err, ErrSuperseded) {
				return State{}, &Error{Reason: ReasonSuperseded, err: err, Msg: "another switch's routing state is saved (nothing was held): " + err.Error()}
			}
			return State{}, &Error{Reason: ReasonSaveFailed, Msg: "saving the draining state on the active cluster (nothing was held): " + err.Error()}
		}
		leaseEnds = s.now().Add(s.lease)
		mark("save_draining")
	}
	// The flip's save writes to every cluster, the one switched to
	// first: the writes are readied while the mirror drains (each write
	// waits for its cluster's warm, within its own time).
	s.warm(dctx)
	if err := s.members.Hold(dctx, draining); err != nil {
		if e := otherSwitch(err); e != nil {
			return rollback(e)
		}
		return rollback(&Error{Reason: ReasonDrainTimeout, Msg: "writes already sent to the old cluster were not answered in time: " + err.Error()})
	}
	mark("hold")
	log.Info("writes held; draining the mirror")
	drain := func() error {
		err := s.mirror.Drain(dctx)
		if err == nil {
			return nil
		}
		e := &Error{Reason: ReasonDrainTimeout, Msg: "the mirror did not drain in time; rolled back to " + cur.Active}
		var lag *LagError
		if errors.As(err, &lag) {
			e.Partitions = lag.Partitions
		} else {
			e.Msg += ": " + err.Error()
		}
		return e
	}
	if err := drain(); err != nil {
		return rollback(err)
	}
	mark("drain")
	// Transactions could still end while the mirror drained (EndTxn is
	// let through then): hold EndTxn too, wait for those in flight, and
	// drain what their markers added.
	switching := draining
	switching.Phase = PhaseSwitching
	if err := s.members.Hold(dctx, switching); err != nil {
		if e := otherSwitch(err); e != nil {
			return rollback(e)
		}
		return rollback(&Error{Reason: ReasonDrainTimeout, Msg: "transactions ending on the old cluster were not answered in time: " + err.Error()})
	}
	if err := drain(); err != nil {
		return rollback(err)
	}
	mark("hold_endtxn_and_drain_again")
	if s.lease > 0 {
		// A member the hold did not reach may write until its lease
		// ends, and what it wrote must be copied too: drained once
		// more, and its commits synced below, after the lease. (Before,
		// the drains above came first, and a record such a member got
		// acknowledged in the lease's last moments was left on the old
		// cluster only.)
		if err := sleepUntil(dctx, leaseEnds, s.now); err != nil {
			return rollback(&Error{Reason: ReasonDrainTimeout, Msg: "the switch's time ran out waiting for the members' write leases to end"})
		}
		mark("wait_write_leases")
		if err := drain(); err != nil {
			return rollback(err)
		}
		mark("drain_after_leases")
	}
	if err := s.mirror.SyncGroups(dctx); err != nil {
		return rollback(&Error{Reason: ReasonDrainTimeout, Msg: "copying the groups' committed offsets: " + err.Error()})
	}
	mark("sync_groups")
	ends, _ := positions(s.mirror.Stop())
	mark("stop_mirror")
	next := s.nextState(cur, sw, ends)
	// Never flip past the deadline: a draining state read for longer than
	// the timeout (and a margin) is taken for an abandoned switch's
	// (lease.go).
	err := s.save(dctx, next)
	mark("save")
	if errors.Is(err, ErrSuperseded) {
		// Another switch flipped (a forced one, most likely): its
		// generation is in force, its mirror runs, and nothing of this
		// one was written. The held writes are released only where this
		// switch's hold is still what a member holds (Table.UpdateFor).
		superseded = true
		return rollback(&Error{Reason: ReasonSuperseded, err: err, Msg: "another switch's routing state was saved meanwhile; this one did not flip: " + err.Error()})
	}
	if err != nil {
		// The mirror is stopped and the new cluster did not confirm the
		// state: start the mirror again and release to the old cluster.
		// A write that was not answered may still land (Kafka cannot
		// say), so the generation is voided: the old cluster's state
		// names it, no member ever takes it from any cluster, and the
		// next switch skips it.
		s.follow(cur, log, "restarting the mirror after a failed save")
		cur.Voided = voidGeneration(cur.Voided, next.Generation)
		voided = true
		return rollback(&Error{Reason: ReasonSaveFailed, Msg: "saving the new routing state: " + err.Error()})
	}
	return s.install(next, log)
}

// forcedHoldWait bounds how long a forced switch waits for the writes the
// members had in flight to be answered before it stops the mirror: the old
// cluster is likely dead, and what it answers later is refused by the
// members (State.ForcedFrom).
const forcedHoldWait = 2 * time.Second

func (s *Switcher) forced(ctx context.Context, cur State, sw *Switch, unreachable []string, log *zap.Logger) (State, error) {
	// Writes are held on every member reached before the mirror stops:
	// an old cluster that comes back while the switch saves (a paused
	// broker, a partition healed) would otherwise acknowledge writes past
	// the mirror's position that no lost range names. What it answers
	// from here to a write sent before is refused by the member that sent
	// it (State.ForcedFrom), and the client sends it again, to the new
	// active cluster. A member the hold misses writes on until its write
	// lease, renewed from wherever the newest state is, ends.
	mark := s.stepper(sw)
	held := cur
	held.Phase = PhaseSwitching
	held.Last = sw
	hctx, cancel := context.WithTimeout(ctx, forcedHoldWait)
	if err := s.members.Hold(hctx, held); err != nil {
		log.Warn("writes held on the members reached; some had writes still in flight to the old cluster, or were not reached", zap.Error(err))
	}
	cancel()
	mark("hold") // released by the install, or on a failed save below
	var ends map[string][]int64
	if s.mirror != nil {
		ends, sw.Lost = positions(s.mirror.Stop())
		if a, ok := s.mirror.(LeftOpenAborter); ok {
			if err := a.AbortLeftOpen(ctx, sw.To); err != nil {
				log.Error("the transactions the mirror left open on the new active cluster could not all be aborted: read_committed readers of their partitions wait for the broker to time them out", zap.Error(err))
			}
		}
	}
	mark("stop_mirror")
	next := s.nextState(cur, sw, ends)
	err := s.save(WithUnreachable(ctx, unreachable), next)
	mark("save")
	if errors.Is(err, ErrSuperseded) {
		// Another switch's newer state is saved: it is in force, and
		// the mirror is that switch's to start; its install releases
		// the writes held here.
		sw.Outcome = "failed: " + err.Error()
		s.finish(sw)
		return State{}, &Error{Reason: ReasonSuperseded, err: err, Msg: "another switch's routing state is saved; this one did not flip: " + err.Error()}
	}
	if err != nil {
		s.follow(cur, log, "restarting the mirror after a failed save")
		sw.Outcome = "failed: " + err.Error()
		s.finish(sw)
		back := cur
		back.Last = sw
		// Not saved: the old cluster, which a forced switch leaves, is
		// likely gone. Should the new cluster take the generation
		// after all, a restarted member routes there, as was asked.
		back.Voided = voidGeneration(back.Voided, next.Generation)
		s.table.Update(back)
		// A fresh context: the caller's may be what ended.
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := s.members.Install(ictx, back); err != nil {
			log.Error("releasing held writes after the forced switch failed", zap.Error(err))
		}
		return State{}, &Error{Reason: ReasonSaveFailed, Msg: "saving the new routing state on " + sw.To + ": " + err.Error()}
	}
	return s.install(next, log)
}

// nextState is the generation after cur, active on sw.To, with the ends of
// cur's generation recorded.
func (s *Switcher) nextState(cur State, sw *Switch, ends map[string][]int64) State {
	sw.Outcome = OutcomeSwitched
	from := cur.Generation
	sw.FromGeneration = &from
	s.finish(sw)
	next := State{Generation: nextGeneration(cur), Active: sw.To, Phase: PhaseServing, Last: sw, History: cur.History,
		APIVersions: cur.APIVersions, Features: cur.Features, Voided: cur.Voided, FailoverPaused: cur.FailoverPaused}
	if s.advertised != nil {
		if v := s.advertised(); len(v) > 0 {
			next.APIVersions = v
		}
	}
	if s.features != nil {
		if f := s.features(); f != nil {
			next.Features = f
		}
	}
	next.Fences = append(next.Fences, cur.Fences...)
	if ends != nil {
		next.Fences = append(next.Fences, Fence{Generation: cur.Generation, Ends: ends})
	}
	if len(next.Fences) > MaxFences {
		next.Fences = next.Fences[len(next.Fences)-MaxFences:]
	}
	return next
}

// SetFailoverPause saves the state in force with automatic failover paused
// (p) or resumed (nil), and puts it in force on this member; the other
// members learn it from the caller (cmd/ferry calls them) or at their next
// lease renewal, a restarted one from the saved state. Refused while a
// switch runs: the state to save is the one it makes.
func (s *Switcher) SetFailoverPause(ctx context.Context, p *FailoverPause) (State, error) {
	if !s.mu.TryLock() {
		return State{}, &Error{Reason: ReasonRunning, err: ErrOtherSwitch, Msg: "a switch is running; pause or resume automatic failover after it"}
	}
	defer s.mu.Unlock()
	cur := s.table.Current()
	if cur.Phase != PhaseServing {
		return State{}, &Error{Reason: ReasonRunning, Switch: cur.SwitchID(), err: ErrOtherSwitch,
			Msg: fmt.Sprintf("a switch is running: writes are held for switch %s (%s)", cur.SwitchID(), cur)}
	}
	next := cur
	next.FailoverPaused = p
	if err := s.save(ctx, next); err != nil {
		if errors.Is(err, ErrSuperseded) {
			return State{}, &Error{Reason: ReasonSuperseded, err: err, Msg: err.Error()}
		}
		return State{}, &Error{Reason: ReasonSaveFailed, Msg: "saving the routing state on " + cur.Active + ": " + err.Error()}
	}
	s.table.SetFailoverPause(cur.Generation, p)
	return s.table.Current(), nil
}

// nextGeneration is the generation a switch from cur saves: past cur's and
// every voided one.
func nextGeneration(cur State) uint32 {
	gen := cur.Generation
	for _, v := range cur.Voided {
		gen = max(gen, v)
	}
	return gen + 1
}

// maxVoided is how many voided generations a state remembers.
const maxVoided = 8

// voidGeneration adds gen to voided, keeping the last maxVoided.
func voidGeneration(voided []uint32, gen uint32) []uint32 {
	out := append(slices.Clone(voided), gen)
	if len(out) > maxVoided {
		out = out[len(out)-maxVoided:]
	}
	return out
}

// warmer is a Store that can ready its writes to a cluster ahead of a
// Save, in the background (KafkaStore.Warm).
type warmer interface {
	Warm(ctx context.Context, cluster string)
}

// warm has the store ready its writes to every cluster, if it can.
func (s *Switcher) warm(ctx context.Context) {
	if w, ok := s.store.(warmer); ok {
		for _, c := range s.Clusters() {
			w.Warm(ctx, c)
		}
	}
}

// saveUntilDone saves st, trying again for up to a minute: with write
// leases, no member writes until the clusters hold a serving state again.
// Past that the draining state left behind is taken for an abandoned
// switch's, once a member has read it for a minute longer than the
// switch's timeout and read every cluster (lease.go). It returns the
// store's refusal when a cluster holds a state st must not replace, else
// nil.
func (s *Switcher) saveUntilDone(st State, log *zap.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err := s.save(ctx, st)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrSuperseded) {
			// A newer state is saved: the leases renew from it.
			log.Warn("the serving state of the rollback was not saved: the clusters hold a newer one", zap.Error(err))
			return err
		}
		if ctx.Err() != nil {
			log.Error("the serving state could not be saved after a rollback; members write again once the abandoned switch's draining state expires", zap.Error(err))
			return nil
		}
		log.Error("saving the serving state after a rollback; no member writes until it lands; retrying", zap.Int("attempt", attempt), zap.Error(err))
		if sleepUntil(ctx, s.now().Add(time.Second), s.now) != nil {
			return nil
		}
	}
}

// sleepUntil waits until t (by now) or ctx's end.
func sleepUntil(ctx context.Context, t time.Time, now func() time.Time) error {
	d := t.Sub(now())
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

func (s *Switcher) save(ctx context.Context, st State) error {
	if s.store == nil {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return s.store.Save(sctx, st)
}

// install puts next in force everywhere and starts the mirror from the new
// active cluster. Once next is saved there is no going back: a member that
// misses it reads it at its next start.
func (s *Switcher) install(next State, log *zap.Logger) (State, error) {
	ictx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.members.Install(ictx, next); err != nil {
		log.Error("installing the new routing state", zap.Error(err))
	}
	s.follow(next, log, "starting the mirror from the new active cluster")
	return s.table.Current(), nil
}

// stepper returns a function that records how long each step of sw took
// since the previous one (or the start).
func (s *Switcher) stepper(sw *Switch) func(step string) {
	last := s.now()
	return func(step string) {
		now := s.now()
		sw.Steps = append(sw.Steps, Step{Step: step, Took: now.Sub(last).Round(time.Microsecond).String()})
		last = now
	}
}

// follow starts the mirror the way st says, if there is one; a failure is
// logged as what.
func (s *Switcher) follow(st State, log *zap.Logger, what string) {
	if s.mirror == nil {
		return
	}
	if err := s.mirror.Follow(st); err != nil {
		log.Error(what, zap.Error(err))
	}
}

func (s *Switcher) finish(sw *Switch) {
	sw.Finished = s.wall(s.now())
	sw.Duration = sw.Finished.Sub(sw.Started).Round(time.Millisecond).String()
}

// positions turns where the mirror stood into each partition's end on the
// standby, and the ranges the source held beyond it.
func positions(ps []Position) (map[string][]int64, []LostRange) {
	ends := map[string][]int64{}
	var lost []LostRange
	for _, p := range ps {
		e := ends[p.Topic]
		for int32(len(e)) <= p.Partition {
			e = append(e, -1)
		}
		e[p.Partition] = p.Standby
		ends[p.Topic] = e
		from := p.Standby
		if p.Committed != nil && *p.Committed >= 0 && *p.Committed < from {
			from = *p.Committed // a transaction left open is aborted
		}
		if p.Matches != nil && *p.Matches >= 0 && *p.Matches < from {
			from = *p.Matches
		}
		switch {
		case p.Standby < 0:
		case p.Source < 0:
			// Neither listed nor read by the mirror: what the old
			// cluster acknowledged there is unknown, and may be lost.
			lost = append(lost, LostRange{Topic: p.Topic, Partition: p.Partition, From: from, To: UnknownEnd})
		case max(p.Source, p.Standby) > from:
			lost = append(lost, LostRange{Topic: p.Topic, Partition: p.Partition, From: from, To: max(p.Source, p.Standby)})
		}
	}
	sort.Slice(lost, func(i, j int) bool {
		if lost[i].Topic != lost[j].Topic {
			return lost[i].Topic < lost[j].Topic
		}
		return lost[i].Partition < lost[j].Partition
	})
	return ends, lost
}

// LagError is a drain that ended with partitions still behind.
type LagError struct {
	Partitions []string // "topic[partition]: standby N of M"
}

func (e *LagError) Error() string { return fmt.Sprintf("still lagging: %v", e.Partitions) }

// Local is Members for a member on its own: its table, and a proxy that
// reports when the writes it sent upstream have been answered.
type Local struct {
	Table *Table
	// Settled returns once no write is in flight to an upstream (the
	// table's phase already holds new ones), or ctx's error.
	Settled func(ctx context.Context) error
	// Clusters, when set, names the clusters this member serves: a
	// switch to another (one this member retired while a member that
	// still has it switches) is refused, at the hold and at the install,
	// rather than routed to a cluster the member has no connection to.
	Clusters func() []string
}

// serves refuses a state whose switch goes to a cluster the member does not
// serve.
func (l Local) serves(st State) error {
	if l.Clusters == nil {
		return nil
	}
	to := st.Active
	if st.Phase != PhaseServing && st.Last != nil {
		to = st.Last.To
	}
	if names := l.Clusters(); !slices.Contains(names, to) {
		return &Error{Reason: ReasonUnknownCluster, Msg: fmt.Sprintf("cluster %q is not configured on this member (clusters: %v)", to, names)}
	}
	return nil
}

// Hold implements Members. A member holds for one switch at a time
// (Table.UpdateFor).
func (l Local) Hold(ctx context.Context, st State) error {
	if err := l.serves(st); err != nil {
		return err
	}
	if err := l.Table.UpdateFor(st); err != nil {
		return err
	}
	if l.Settled == nil {
		return nil
	}
	return l.Settled(ctx)
}

// Install implements Members. A rollback releases only its own switch's
// hold (Table.UpdateFor).
func (l Local) Install(_ context.Context, st State) error {
	if err := l.serves(st); err != nil {
		return err
	}
	return l.Table.UpdateFor(st)
}

// lockedOut is the refusal while this switcher runs a switch (s.mu held).
func (s *Switcher) lockedOut() *Error {
	id := ""
	if p := s.running.Load(); p != nil {
		id = *p
	}
	return &Error{Reason: ReasonRunning, Switch: id, err: ErrOtherSwitch, Msg: fmt.Sprintf("a switch is already running: switch %s", id)}
}

// heldBy is the refusal while a switch holds the member's writes (cur, not
// serving), this member's or another's.
func heldBy(cur State) *Error {
	return &Error{Reason: ReasonRunning, Switch: cur.SwitchID(), err: ErrOtherSwitch,
		Msg: fmt.Sprintf("a switch is already running: writes are held for switch %s (%s)", cur.SwitchID(), cur)}
}

// newSwitchID returns a random switch ID.
func newSwitchID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// otherSwitch returns the refusal a member gave a hold because it holds
// for another switch, as a ReasonRunning *Error, or because it routes by a
// newer generation, as a ReasonSuperseded one; or nil. Between members
// the refusal arrives as text (membership.RemoteError), so the text is
// matched too.
func otherSwitch(err error) *Error {
	var e *Error
	if errors.As(err, &e) && (e.Reason == ReasonRunning || e.Reason == ReasonSuperseded) {
		return e
	}
	switch msg := err.Error(); {
	case errors.Is(err, ErrOtherSwitch) || strings.Contains(msg, otherSwitchText):
		return &Error{Reason: ReasonRunning, err: ErrOtherSwitch, Switch: heldSwitch(msg), Msg: msg}
	case strings.Contains(msg, newerStateText):
		return &Error{Reason: ReasonSuperseded, Msg: msg}
	}
	return nil
}

// newerStateText is in the text of UpdateFor's refusal of an older
// generation.
const newerStateText = "this member routes by a newer routing state"

// otherSwitchText starts the text of UpdateFor's refusal up to the ID of
// the switch held for.
const otherSwitchText = "writes are held for switch "

// heldSwitch is the switch ID in a refusal's text, or "".
func heldSwitch(msg string) string {
	_, after, ok := strings.Cut(msg, otherSwitchText)
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(after, " ")
	return id
}
