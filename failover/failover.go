// Package failover decides, for a fleet of Ferry members, when to switch
// the active cluster by force without a person: when a quorum of the
// members has failed to reach the active cluster for a set time while the
// standby answers them, the mirror's lag at the failure is within the loss
// the operator accepts, and the switch would not return to a cluster a
// forced switch left, nor follow another switch within a set interval. One
// member acts: the one the alive members' IDs elect by hashing (Actor), so
// that two members never race to switch; the switch itself is the forced
// switch an operator would run (routing.Switcher), which records what it
// lost.
//
// Why a quorum of all the members known, alive or not: a member cut off
// from the others and from the active cluster sees itself alone, and
// alone it must not act (its lease lapses and it stops writing; the
// cluster is its problem, not the fleet's). The members that left on
// purpose do not count.
//
// Each member measures on its own monotonic clock how long it has failed
// to reach the active cluster (Detector); the member that acts gathers
// the others' views over the fleet's acknowledged calls at each decision,
// not from gossip, which can lag by seconds. Decide is the decision
// itself, with no I/O.
package failover

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"github.com/ferry-gw/ferry/routing"
)

// Policy is the operator's automatic failover policy.
type Policy struct {
	// After is how long a member must have failed to reach the active
	// cluster, with the standby answering, before it votes to switch.
	After time.Duration
	// MaxLossRecords and MaxLossSeconds bound the mirror's lag at the
	// failure (the recovery point): above either, no automatic switch.
	// A negative bound is no bound.
	MaxLossRecords int64
	MaxLossSeconds float64
	// MinInterval is how long after the last switch (any) no automatic
	// one is made: a cluster that comes back and fails again does not
	// make the fleet flap.
	MinInterval time.Duration
}

// View is one member's view of the clusters, as it answers the member
// that decides.
type View struct {
	Member     int32  `json:"member"`
	Generation uint32 `json:"generation"` // the routing generation it serves
	Active     string `json:"active"`
	// DownMillis is how long the member has failed to reach the active
	// cluster (0: reached at its last probe), on its own clock.
	DownMillis int64  `json:"down_ms"`
	Standby    string `json:"standby"`
	StandbyUp  bool   `json:"standby_up"`
	// LagRecords and LagSeconds are the lag of the partitions this
	// member mirrors, at its last read of the active cluster (records
	// summed, seconds the largest); LagKnown is false while it has not
	// read the lag since it last served a new generation.
	LagRecords int64   `json:"lag_records"`
	LagSeconds float64 `json:"lag_seconds"`
	LagKnown   bool    `json:"lag_known"`
	// LagRemembered: the lag is not the member's own reading but the
	// last one another member had of it (this generation), the member
	// restarted since and not yet able to read the active cluster.
	LagRemembered bool   `json:"lag_remembered,omitempty"`
	Error         string `json:"error,omitempty"` // why the active cluster was not reached
	// Known are the lag readings this member has of the others (their
	// own, gathered while the active cluster answered), of the
	// generation it serves: a member restarted while the active cluster
	// is gone has lost its own, and the one deciding takes it from here.
	Known []Reading `json:"known,omitempty"`
}

// Reading is one member's lag as it last read it itself.
type Reading struct {
	Member     int32   `json:"member"`
	Generation uint32  `json:"generation"`
	Records    int64   `json:"records"`
	Seconds    float64 `json:"seconds"`
}

// Down reports how long v says the active cluster has been unreachable.
func (v View) Down() time.Duration { return time.Duration(v.DownMillis) * time.Millisecond }

// Member is a fleet member as Decide counts it.
type Member struct {
	ID    int32
	Alive bool // alive or suspect; dead members count toward the quorum, unheard
	// Starting: alive in gossip but not running its runner (still
	// waiting for a cluster at start, or automatic failover off there):
	// it counts toward the quorum and never decides.
	Starting bool
}

// Verdict is one decision.
type Verdict struct {
	// Act: switch now, by force, to Target.
	Act    bool   `json:"act"`
	Target string `json:"target,omitempty"`
	// Reason says why not (or why), for people.
	Reason string `json:"reason"`
	// Blocked: a quorum sees the active cluster gone, but the policy
	// refuses (loss over the budget, a failback, too soon after the
	// last switch): waits for a person, and is alerted on.
	Blocked bool `json:"blocked"`
	// Votes of Members agree the active cluster is gone; Needed is the
	// quorum.
	Votes   int `json:"votes"`
	Members int `json:"members"`
	Needed  int `json:"needed"`
	// LossRecords and LossSeconds are the lag summed over the views,
	// what a switch now would lose at most (as last read).
	LossRecords int64   `json:"loss_records"`
	LossSeconds float64 `json:"loss_seconds"`
	// ActIn is, while the votes are short only of time, how long until
	// the last vote needed would come.
	ActIn time.Duration `json:"-"`
}

// Decide is the fleet's verdict on the routing state st, at now (wall
// clock, for the interval since the last switch), from the views gathered
// of the members (every member known that did not leave).
func Decide(p Policy, st routing.State, standby string, members []Member, views []View, now time.Time) Verdict {
	v := Verdict{Target: standby, Members: len(members), Needed: Quorum(len(members))}
	if st.Phase != "" && st.Phase != routing.PhaseServing {
		v.Reason = "a switch is running"
		return v
	}
	if standby == "" || standby == st.Active {
		v.Reason = "no standby cluster"
		return v
	}
	byID := make(map[int32]View, len(views))
	for _, w := range views {
		byID[w.Member] = w
	}
	var waits []time.Duration
	for _, m := range members {
		w, ok := byID[m.ID]
		if !ok || !m.Alive || w.Generation != st.Generation || w.Active != st.Active {
			continue // unheard, or of another generation: no vote
		}
		switch {
		case w.Down() >= p.After && w.StandbyUp && w.Standby == standby:
			v.Votes++
		case w.DownMillis > 0 && w.StandbyUp:
			waits = append(waits, p.After-w.Down())
		}
		if w.LagKnown {
			v.LossRecords += w.LagRecords
			v.LossSeconds = max(v.LossSeconds, w.LagSeconds)
		}
	}
	if v.Votes < v.Needed {
		v.Reason = fmt.Sprintf("%d of %d members see %s unreachable for %v with %s answering; %d needed",
			v.Votes, v.Members, st.Active, p.After, standby, v.Needed)
		if short := v.Needed - v.Votes; short <= len(waits) {
			// The soonest the short votes can all come.
			slices.Sort(waits)
			v.ActIn = max(0, waits[short-1])
		}
		return v
	}
	v.Blocked = true
	if pp := st.FailoverPaused; pp != nil {
		v.Reason = fmt.Sprintf("automatic failover is paused (since %s", pp.At.UTC().Format(time.RFC3339))
		if pp.Reason != "" {
			v.Reason += ": " + pp.Reason
		}
		v.Reason += ")"
		return v
	}
	if l := st.Last; l != nil && l.Mode == routing.Forced && l.Outcome == routing.OutcomeSwitched && l.From == standby {
		v.Reason = fmt.Sprintf("%s is the cluster a forced switch left: the return to it is planned, by a person", standby)
		return v
	}
	if l := st.Last; l != nil {
		at := l.Finished
		if at.IsZero() {
			at = l.Started
		}
		if since := now.Sub(at); since < p.MinInterval {
			v.Reason = fmt.Sprintf("the last switch was %v ago, within min_interval %v", since.Round(time.Second), p.MinInterval)
			return v
		}
	}
	for _, m := range members {
		if w, ok := byID[m.ID]; m.Alive && (!ok || !w.LagKnown) {
			v.Reason = fmt.Sprintf("member %d's mirror lag at the failure is unknown: the loss cannot be bounded", m.ID)
			return v
		}
	}
	if p.MaxLossRecords >= 0 && v.LossRecords > p.MaxLossRecords || p.MaxLossSeconds >= 0 && v.LossSeconds > p.MaxLossSeconds {
		v.Reason = fmt.Sprintf("the mirror's lag at the failure, %d records and %.1f s, exceeds max_loss (%s)",
			v.LossRecords, v.LossSeconds, p.lossBudget())
		return v
	}
	v.Blocked, v.Act = false, true
	v.Reason = fmt.Sprintf("%d of %d members see %s unreachable for %v with %s answering; lag %d records, %.1f s",
		v.Votes, v.Members, st.Active, p.After, standby, v.LossRecords, v.LossSeconds)
	return v
}

func (p Policy) lossBudget() string {
	s := ""
	if p.MaxLossRecords >= 0 {
		s = strconv.FormatInt(p.MaxLossRecords, 10) + " records"
	}
	if p.MaxLossSeconds >= 0 {
		if s != "" {
			s += ", "
		}
		s += strconv.FormatFloat(p.MaxLossSeconds, 'f', -1, 64) + " s"
	}
	return s
}

// Quorum is the majority of n members known.
func Quorum(n int) int { return n/2 + 1 }

// Actor is the member, of the alive ones, that decides and acts: the one
// whose ID hashes highest with a fixed key (rendezvous hashing), so that
// every member that sees the same alive members names the same one, and
// the choice moves only when that member goes. -1 when none is alive.
func Actor(alive []int32) int32 {
	best, bestHash := int32(-1), uint64(0)
	for _, id := range alive {
		h := fnv.New64a()
		h.Write([]byte("ferry/failover/" + strconv.Itoa(int(id))))
		if s := h.Sum64(); best < 0 || s > bestHash || s == bestHash && id < best {
			best, bestHash = id, s
		}
	}
	return best
}
