package routing

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Phase is where a member stands in a switch of the active cluster.
type Phase string

const (
	// PhaseServing: traffic flows to the active cluster.
	PhaseServing Phase = "serving"
	// PhaseDraining: writes are held while the mirror drains.
	PhaseDraining Phase = "draining"
	// PhaseSwitching: the mirror has drained; the new generation is being
	// made durable and installed.
	PhaseSwitching Phase = "switching"
)

// Mode is how a switch treats the cluster it leaves.
type Mode string

const (
	// Planned holds writes, drains the mirror and loses nothing.
	Planned Mode = "planned"
	// Forced flips at once, with the old cluster unreachable; what the
	// mirror had not copied is reported as lost.
	Forced Mode = "forced"
)

// State is the routing state every Ferry member agrees on.
type State struct {
	// Generation increases at every switch of the active cluster.
	Generation uint32 `json:"generation"`
	// Active names the physical cluster client traffic goes to.
	Active string `json:"active"`
	// Phase is serving except while a switch runs.
	Phase Phase `json:"phase,omitempty"`
	// Last is the most recent switch, finished or not.
	Last *Switch `json:"last_switch,omitempty"`
	// History holds the switches before Last, oldest first, at most
	// MaxHistory of them; their lost ranges are counted, not listed.
	History []Switch `json:"history,omitempty"`
	// APIVersions are the API versions Ferry advertised when the state
	// was saved (key → [min, max]): what every configured cluster
	// supported then. A member that starts without reaching one of the
	// clusters advertises no more than this, so that a cluster that is
	// down (as after a forced failover from it) still narrows what
	// clients may use.
	APIVersions map[int16][2]int16 `json:"api_versions,omitempty"`
	// Features are the feature levels (KIP-584) Ferry advertised as
	// finalized when the state was saved, every configured cluster
	// reached then (name → max level): a member that starts without one
	// of the clusters advertises no more than these, rather than none,
	// so that clients keep the transaction protocol (transaction.version)
	// they had across a restart after a forced failover.
	Features map[string]int16 `json:"finalized_features,omitempty"`
	// Fences holds, for each generation that ended, every partition's
	// end offset at the flip: what OffsetForLeaderEpoch answers for an
	// epoch of that generation (KIP-320), so that a consumer positioned
	// beyond what the new cluster holds is brought back, not reset.
	Fences []Fence `json:"fences,omitempty"`
	// Voided are generations a switch tried to save and then rolled back
	// from, the save unconfirmed: one may still have landed on a cluster,
	// so a state of a voided generation is never taken (KafkaStore.Load),
	// and later switches number past them.
	Voided []uint32 `json:"voided,omitempty"`
	// FailoverPaused, when set, holds automatic failover off (package
	// failover): a person paused it, for maintenance, until they resume
	// it. Switches carry it into the states they make.
	FailoverPaused *FailoverPause `json:"failover_paused,omitempty"`
}

// FailoverPause is automatic failover held off by a person.
type FailoverPause struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// IsVoided reports whether s voids generation gen.
func (s State) IsVoided(gen uint32) bool { return slices.Contains(s.Voided, gen) }

// Previous is the generation s took over from and the cluster it was
// active on, when s is the state a planned switch made: that cluster
// stopped taking writes at the flip and still holds what its producers
// last wrote there. ok is false for any other state (a forced switch's old
// cluster may be gone; a rolled-back switch's Last is not what made s).
func (s State) Previous() (gen uint32, cluster string, ok bool) {
	l := s.Last
	if l == nil || l.Mode != Planned || l.Outcome != OutcomeSwitched || l.To != s.Active || l.From == s.Active ||
		l.FromGeneration == nil || *l.FromGeneration >= s.Generation {
		return 0, "", false
	}
	return *l.FromGeneration, l.From, true
}

// LostStart is, when s was made by a forced switch that lost offsets of
// the partition (s.Last's Lost), and epoch (a leader epoch a consumer
// committed with its offset, as clients see epochs) was issued under a
// generation before s's, the start of the partition's lost range: the
// consumer read on the old cluster, where the offsets from there on hold
// records the new active cluster never received. ok is false otherwise,
// and for an unknown epoch (-1): nothing tells where it read.
func (s State) LostStart(topic string, partition int32, epoch int32) (from int64, ok bool) {
	if epoch < 0 || EpochGeneration(epoch) >= s.Generation {
		return 0, false
	}
	r, ok := s.LostRangeOf(topic, partition)
	return r.From, ok
}

// LostRangeOf is the partition's lost range when s was made by a forced
// switch that lost offsets of it (s.Last's Lost).
func (s State) LostRangeOf(topic string, partition int32) (LostRange, bool) {
	l := s.Last
	if l == nil || l.Mode != Forced || l.Outcome != OutcomeSwitched || l.To != s.Active {
		return LostRange{}, false
	}
	for _, r := range l.Lost {
		if r.Topic == topic && r.Partition == partition {
			return r, true
		}
	}
	return LostRange{}, false
}

// ForcedFrom reports whether s, the state a member routes by, holds writes
// for a forced switch out of generation gen, or routes by a generation a
// forced switch made from gen. From then on what the old cluster answers to
// a write sent under gen may lie past where the switch stopped the mirror,
// beyond the ranges it reports lost: such an answer is not passed on as a
// success (the proxy answers it retriable, and the write goes to the new
// active cluster).
func (s State) ForcedFrom(gen uint32) bool {
	switch {
	case s.Generation < gen:
		return false
	case s.Generation == gen:
		return s.Phase != PhaseServing && s.Last != nil && s.Last.Mode == Forced
	}
	forcedFrom := func(sw *Switch) bool {
		return sw.Mode == Forced && sw.Outcome == OutcomeSwitched && sw.FromGeneration != nil && *sw.FromGeneration == gen
	}
	if s.Last != nil && forcedFrom(s.Last) {
		return true
	}
	for i := range s.History {
		if forcedFrom(&s.History[i]) {
			return true
		}
	}
	return false
}

// Switch describes one switch of the active cluster.
type Switch struct {
	// ID tells this switch from any other (random): members hold writes
	// for one switch at a time (Table.UpdateFor) and the store never
	// replaces one switch's state with another's of the same generation.
	ID   string `json:"id,omitempty"`
	Mode Mode   `json:"mode"`
	// Automatic: the fleet decided on this switch itself (package
	// failover), not a person.
	Automatic bool   `json:"automatic,omitempty"`
	From      string `json:"from"`
	// FromGeneration is the generation the switch ended (nil in states
	// saved before it was recorded).
	FromGeneration *uint32   `json:"from_generation,omitempty"`
	To             string    `json:"to"`
	Started        time.Time `json:"started"`
	// Deadline is when a planned switch gives up, on the switcher's wall
	// clock: for people to read. No member compares it with its own
	// clock; they count TimeoutMillis (lease.go).
	Deadline time.Time `json:"deadline,omitzero"`
	// TimeoutMillis is how long a planned switch may run: it never flips
	// later, counted on its own monotonic clock from before it saved its
	// draining state, so a member that has read that state for longer on
	// its own clock (and a margin) knows the switch died.
	TimeoutMillis int64     `json:"timeout_ms,omitempty"`
	Finished      time.Time `json:"finished,omitzero"`
	// Duration is Finished - Started, in the form "1.234s".
	Duration string `json:"duration,omitempty"`
	// Outcome is "switched", "rolled back: …" or "failed: …".
	Outcome string `json:"outcome,omitempty"`
	// Lost is, for a forced switch, what the old cluster acknowledged and
	// the new one never received.
	Lost []LostRange `json:"lost,omitempty"`
	// LostRanges is, in State.History, how many ranges Lost held.
	LostRanges int `json:"lost_ranges,omitempty"`
	// Steps is how long each step took, in order (the install and the
	// release of held writes come after the last).
	Steps []Step `json:"steps,omitempty"`
}

// OutcomeSwitched is a Switch's Outcome once it made its generation.
const OutcomeSwitched = "switched"

// SwitchID is the ID of the switch that saved s (its Last), or "".
func (s State) SwitchID() string {
	if s.Last == nil {
		return ""
	}
	return s.Last.ID
}

// timeout is the switch's timeout: TimeoutMillis, or for a state saved
// by a Ferry that did not write it, Deadline - Started (two readings of
// the switcher's own clock); 0 when unknown.
func (sw *Switch) timeout() time.Duration {
	if sw.TimeoutMillis > 0 {
		return time.Duration(sw.TimeoutMillis) * time.Millisecond
	}
	if !sw.Started.IsZero() && sw.Deadline.After(sw.Started) {
		return sw.Deadline.Sub(sw.Started)
	}
	return 0
}

// Step is one step of a switch and how long it took.
type Step struct {
	Step string `json:"step"`
	Took string `json:"took"`
}

// LostRange is the offsets [From, To) of a partition that the old active
// cluster held and the new one did not receive. To is UnknownEnd when the
// old cluster's end could not be read (it was down, and the mirror had
// not read the partition yet): anything it acknowledged from From on.
type LostRange struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
}

// UnknownEnd is a LostRange's To when the old cluster's end is unknown.
const UnknownEnd = -1

// Contains reports whether offset o of the range's partition is in it.
func (r LostRange) Contains(o int64) bool {
	return o >= r.From && (r.To == UnknownEnd || o < r.To)
}

// Fence is the end of a generation: each partition's end offset on the
// cluster that took over, at the flip.
type Fence struct {
	Generation uint32             `json:"generation"`
	Ends       map[string][]int64 `json:"ends"` // topic → end offset by partition (-1: unknown)
}

// MaxHistory is how many switches before the last a state remembers.
const MaxHistory = 16

// pushHistory is history with last added (its lost ranges only counted),
// the oldest dropped beyond MaxHistory.
func pushHistory(history []Switch, last *Switch) []Switch {
	if last == nil {
		return history
	}
	h := *last
	h.LostRanges, h.Lost = len(h.Lost), nil
	out := append(slices.Clone(history), h)
	if len(out) > MaxHistory {
		out = out[len(out)-MaxHistory:]
	}
	return out
}

// MaxFences is how many ended generations a state remembers the ends of.
// A consumer that slept through more switches than this validates its
// position against the oldest remembered one.
const MaxFences = 8

func (s State) String() string {
	phase := s.Phase
	if phase == "" {
		phase = PhaseServing
	}
	return fmt.Sprintf("generation %d, active %q, %s", s.Generation, s.Active, phase)
}

// FenceEnd returns the end offset recorded for a partition when generation
// gen ended, and whether one was.
func (s State) FenceEnd(gen uint32, topic string, partition int32) (int64, bool) {
	for i := range s.Fences {
		f := &s.Fences[i]
		if f.Generation != gen {
			continue
		}
		ends := f.Ends[topic]
		if int(partition) >= len(ends) || partition < 0 || ends[partition] < 0 {
			return 0, false
		}
		return ends[partition], true
	}
	return 0, false
}

// FenceBefore returns where generation gen began in a partition: the end
// recorded when the latest generation before it ended, and whether one
// was (generations voided or forgotten are skipped).
func (s State) FenceBefore(gen uint32, topic string, partition int32) (int64, bool) {
	found, best := false, uint32(0)
	var end int64
	for i := range s.Fences {
		g := s.Fences[i].Generation
		if g >= gen || found && g <= best {
			continue
		}
		if e, ok := s.FenceEnd(g, topic, partition); ok {
			found, best, end = true, g, e
		}
	}
	return end, found
}

// Table holds the current routing state; readers take a snapshot per
// request, and Changed tells them when it moves.
type Table struct {
	cur atomic.Pointer[State]

	mu      sync.Mutex                    // serialises changes
	changed atomic.Pointer[chan struct{}] // closed at the next change
}

// NewTable returns a table at the given state.
func NewTable(s State) *Table {
	t := new(Table)
	ch := make(chan struct{})
	t.changed.Store(&ch)
	if s.Phase == "" {
		s.Phase = PhaseServing
	}
	t.cur.Store(&s)
	return t
}

// Current returns the routing state in force.
func (t *Table) Current() State { return *t.cur.Load() }

// Changed returns a channel closed at the next change of the state. Take
// it before reading Current: a change between the two closes it.
func (t *Table) Changed() <-chan struct{} { return *t.changed.Load() }

// Advance installs next if its generation is newer than the current one, and
// reports whether it did: an older or equal state never replaces a newer one.
func (t *Table) Advance(next State) bool {
	return t.install(next, func(cur State) bool { return next.Generation > cur.Generation })
}

// Update installs next if its generation is at least the current one's: a
// phase change within a generation, or a newer generation.
func (t *Table) Update(next State) bool {
	return t.install(next, func(cur State) bool { return next.Generation >= cur.Generation })
}

// ErrOtherSwitch is what UpdateFor's refusal wraps.
var ErrOtherSwitch = errors.New("writes are held for another switch")

// UpdateFor is Update for a switch's hold and install: while the table
// holds writes for one switch (its phase is not serving), a state of the
// same generation from another switch (but a forced switch's hold over a
// planned one's, forcedOverPlanned) is refused with an *Error
// (ReasonRunning) naming the switch held for, wrapping ErrOtherSwitch.
// So a member holds for one switch at a time, and a switch's rollback
// releases only its own hold. A newer generation is always taken: it was
// saved, and routes by it are in force.
//
// A step of a switch that this table has passed (a hold arriving after the
// switch's next hold, or after its rollback released the writes) is
// refused too (ReasonSuperseded): a call that comes late must not hold
// writes again for a switch that ended.
func (t *Table) UpdateFor(next State) error {
	var held State
	ok := t.install(next, func(cur State) bool {
		held = cur
		if next.Generation < cur.Generation {
			return false
		}
		return next.Generation > cur.Generation || (!holdsForOther(cur, next) || forcedOverPlanned(cur, next)) && !passedStep(cur, next)
	})
	switch {
	case ok:
		return nil
	case next.Generation < held.Generation:
		return &Error{Reason: ReasonSuperseded, Msg: fmt.Sprintf("%s (%s) than %s of switch %s", newerStateText, held, next, next.SwitchID())}
	case passedStep(held, next):
		return &Error{Reason: ReasonSuperseded, Msg: fmt.Sprintf("switch %s's step to %s comes late: this member is past it (%s)", next.SwitchID(), next.Phase, held)}
	}
	return &Error{Reason: ReasonRunning, Switch: held.SwitchID(), err: ErrOtherSwitch,
		Msg: fmt.Sprintf("a switch is already running: writes are held for switch %s (%s); switch %s is refused", held.SwitchID(), held, next.SwitchID())}
}

// forcedOverPlanned reports whether next is a forced switch's hold and cur
// a planned switch's: the forced one takes the hold over (it is for an old
// cluster that is gone, which the planned one's drain waits on), so that
// the planned switch's rollback, refused here from then on, cannot release
// writes to that cluster while the forced switch saves.
func forcedOverPlanned(cur, next State) bool {
	return next.Phase != PhaseServing && next.Last != nil && next.Last.Mode == Forced &&
		cur.Phase != PhaseServing && cur.Last != nil && cur.Last.Mode == Planned
}

// passedStep reports whether next, of the same generation and switch as
// cur, is a step of that switch that cur is already past: the switch's
// phases within a generation run draining, switching, then serving (its
// rollback); none goes back. Either ID missing: no.
func passedStep(cur, next State) bool {
	id := cur.SwitchID()
	if id == "" || id != next.SwitchID() || cur.Generation != next.Generation {
		return false
	}
	return phaseOrder(next.Phase) < phaseOrder(cur.Phase)
}

func phaseOrder(p Phase) int {
	switch p {
	case PhaseDraining:
		return 1
	case PhaseSwitching:
		return 2
	}
	return 3 // serving: the switch is over
}

// holdsForOther reports whether cur holds writes for a switch other than
// next's. Either ID missing (a member of an older Ferry): no.
func holdsForOther(cur, next State) bool {
	if cur.Phase == PhaseServing || cur.Phase == "" {
		return false
	}
	h, n := cur.SwitchID(), next.SwitchID()
	return h != "" && n != "" && h != n
}

// SetFailoverPause sets the pause of automatic failover of the state in
// force, when it is of generation gen, and reports whether it did. Only
// that field changes: a state another switch holds writes for keeps its
// phase, whatever the pause's state says.
func (t *Table) SetFailoverPause(gen uint32, p *FailoverPause) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.cur.Load()
	if cur.Generation != gen || samePause(cur.FailoverPaused, p) {
		return false
	}
	cur.FailoverPaused = p
	t.storeLocked(cur)
	return true
}

func samePause(a, b *FailoverPause) bool {
	return a == nil && b == nil || a != nil && b != nil && a.At.Equal(b.At) && a.Reason == b.Reason
}

func (t *Table) install(next State, ok func(cur State) bool) bool {
	if next.Phase == "" {
		next.Phase = PhaseServing
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !ok(*t.cur.Load()) {
		return false
	}
	t.storeLocked(next)
	return true
}

// storeLocked puts next in force and wakes Changed's waiters; t.mu is
// held. The state first, then the channel: a reader that finds the new
// channel finds the new state.
func (t *Table) storeLocked(next State) {
	t.cur.Store(&next)
	ch := make(chan struct{})
	close(*t.changed.Swap(&ch))
}
