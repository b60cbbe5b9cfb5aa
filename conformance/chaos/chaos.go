// Package chaos is the randomized fault schedule run against a Ferry fleet
// on real Kafka (conformance's TestChaos): the faults a seed draws, and
// the report of a run — faults injected by kind, records checked, each
// invariant's result.
//
// A schedule is a pure function of its seed, the run's length and the
// fleet's size: a failing run prints its seed, and the same seed replays
// the same faults in the same order with the same pauses (the machine's
// timing, and so what each fault meets, still varies).
package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind string

// The kinds of fault drawn.
const (
	// PlannedSwitch: a planned switch to the other cluster, asked of a
	// random member.
	PlannedSwitch Kind = "planned_switch"
	// TwoSwitches: planned switches asked of two members at the same
	// moment; at most one may flip.
	TwoSwitches Kind = "two_switches"
	// KillMember: kill -9 of a member, restarted after Pause.
	KillMember Kind = "kill_member"
	// PauseMember: SIGSTOP of a member for Pause (up to twice the write
	// lease), then SIGCONT.
	PauseMember Kind = "pause_member"
	// PauseBroker: SIGSTOP of a cluster's broker for Pause, then SIGCONT.
	PauseBroker Kind = "pause_broker"
	// KillBroker: kill -9 of a cluster's broker, restarted after Pause.
	KillBroker Kind = "kill_broker"
	// CutGossip: a member cut off from the others' gossip and calls for
	// Pause while it still reaches its clients and the clusters (a
	// network partition), with a planned switch asked of member Other
	// halfway through: the switch cannot reach the member cut off.
	CutGossip Kind = "cut_gossip"
	// ForcedSwitch: the active cluster's broker stopped (SIGSTOP), a
	// forced switch to the other asked of member Member, the broker
	// continued after Pause, and the old cluster, now the standby,
	// repaired as the runbook says (its diverged topics deleted, copied
	// again). Drawn only with Config.Forced.
	ForcedSwitch Kind = "forced_switch"
)

// Kinds is every kind, in the order reports list them.
var Kinds = []Kind{PlannedSwitch, TwoSwitches, KillMember, PauseMember, PauseBroker, KillBroker, CutGossip, ForcedSwitch}

// Fault is one step of a schedule.
type Fault struct {
	Kind Kind
	// After is how long the schedule waits before injecting it, counted
	// from the end of the step before.
	After time.Duration
	// Member and Other are the members concerned (Other: TwoSwitches'
	// second member).
	Member, Other int
	// Cluster is PauseBroker's and KillBroker's cluster: 0 the one active
	// when the fault is injected, 1 the other.
	Cluster int
	// Pause is how long a member or broker stays stopped or dead.
	Pause time.Duration
}

func (f Fault) String() string {
	switch f.Kind {
	case PlannedSwitch:
		return fmt.Sprintf("%s via member %d", f.Kind, f.Member)
	case TwoSwitches:
		return fmt.Sprintf("%s via members %d and %d", f.Kind, f.Member, f.Other)
	case PauseBroker, KillBroker:
		which := "active"
		if f.Cluster == 1 {
			which = "standby"
		}
		return fmt.Sprintf("%s of the %s cluster's broker for %v", f.Kind, which, f.Pause.Round(time.Millisecond))
	case CutGossip:
		return fmt.Sprintf("%s of member %d for %v, a planned switch via member %d halfway", f.Kind, f.Member, f.Pause.Round(time.Millisecond), f.Other)
	case ForcedSwitch:
		return fmt.Sprintf("%s via member %d, the active cluster's broker stopped for %v", f.Kind, f.Member, f.Pause.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s of member %d for %v", f.Kind, f.Member, f.Pause.Round(time.Millisecond))
}

// Config shapes a schedule.
type Config struct {
	Seed     uint64
	Duration time.Duration // faults are drawn until their waits add up to it (the run stops at it on the wall)
	Members  int
	// WriteLease bounds PauseMember: up to twice it.
	WriteLease time.Duration
	// Gap is the range of the wait before each fault.
	MinGap, MaxGap time.Duration
	// Forced draws ForcedSwitch too (`make chaos`); without it the
	// other kinds are drawn as they were before it existed.
	Forced bool
}

// Draw returns the schedule cfg's seed draws: a fault after each wait in
// [MinGap, MaxGap) until the waits add up to Duration. Every kind is drawn
// once before any is drawn again, in an order the seed shuffles, so that
// a short run still meets each.
func Draw(cfg Config) []Fault {
	r := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed))
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(r.Int64N(int64(hi-lo)))
	}
	var out []Fault
	var bag []Kind
	for total := time.Duration(0); ; {
		f := Fault{After: between(cfg.MinGap, cfg.MaxGap)}
		if total+f.After > cfg.Duration {
			return out
		}
		total += f.After
		if len(bag) == 0 {
			bag = slices.Clone(Kinds)
			if !cfg.Forced {
				bag = slices.DeleteFunc(bag, func(k Kind) bool { return k == ForcedSwitch })
			}
			r.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
		}
		f.Kind, bag = bag[0], bag[1:]
		f.Member = r.IntN(cfg.Members)
		f.Other = (f.Member + 1 + r.IntN(cfg.Members-1)) % cfg.Members
		f.Cluster = r.IntN(2)
		switch f.Kind {
		case KillMember:
			f.Pause = between(time.Second, 5*time.Second)
		case PauseMember:
			f.Pause = between(cfg.WriteLease/4, 2*cfg.WriteLease)
		case PauseBroker:
			f.Pause = between(500*time.Millisecond, 3*time.Second)
		case KillBroker:
			f.Pause = between(time.Second, 5*time.Second)
		case CutGossip:
			// Long enough, at the top, for the others to find the
			// member dead (memberlist's LAN timings: a few seconds).
			f.Pause = between(2*time.Second, 10*time.Second)
		case ForcedSwitch:
			f.Pause = between(3*time.Second, 8*time.Second)
		}
		out = append(out, f)
	}
}

// DrawSkew returns the member whose wall clock a run takes as skewed, for
// the whole run, and by how much: from one minute to three hours, either
// way. It draws from the seed apart from Draw, so that a seed's faults are
// the same with it.
func DrawSkew(seed uint64, members int) (member int, skew time.Duration) {
	r := rand.New(rand.NewPCG(seed^0xc10c, seed))
	member = r.IntN(members)
	skew = time.Minute + time.Duration(r.Int64N(int64(3*time.Hour-time.Minute)))
	if r.IntN(2) == 0 {
		skew = -skew
	}
	return member, skew.Round(time.Second)
}

// Invariant is one property checked at the end of a run.
type Invariant struct {
	Name   string
	OK     bool
	Detail string
}

// Report is what a run did and found.
type Report struct {
	Seed     uint64
	Duration time.Duration
	// Faults counts the faults injected, by kind; Outcomes counts what
	// the switches asked answered ("switched", "refused: ...").
	Faults   map[Kind]int
	Outcomes map[string]int
	// Records is how many acknowledged records were checked.
	Records int
	// Skewed is the member whose wall clock the run took as Skew off.
	Skewed int
	Skew   time.Duration
	// Log is each fault as injected, with what it met.
	Log        []string
	Invariants []Invariant
}

// Check records an invariant's result; detail says what was found.
func (r *Report) Check(name string, ok bool, detail string) {
	r.Invariants = append(r.Invariants, Invariant{Name: name, OK: ok, Detail: detail})
}

// OK reports whether every invariant held.
func (r *Report) OK() bool {
	for _, inv := range r.Invariants {
		if !inv.OK {
			return false
		}
	}
	return true
}

// Markdown is the report as docs/CHAOS.md holds it.
func (r *Report) Markdown(command string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Chaos run\n\n")
	fmt.Fprintf(&b, "`%s` — seed %d, %v of faults; member %d's wall clock %v off throughout.\n\n", command, r.Seed, r.Duration.Round(time.Second), r.Skewed, r.Skew)
	fmt.Fprintf(&b, "## Faults injected\n\n| kind | count |\n|---|---|\n")
	for _, k := range Kinds {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.Faults[k])
	}
	if len(r.Outcomes) > 0 {
		fmt.Fprintf(&b, "\n## What the switches asked answered\n\n| answer | count |\n|---|---|\n")
		keys := make([]string, 0, len(r.Outcomes))
		for k := range r.Outcomes {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "| %s | %d |\n", k, r.Outcomes[k])
		}
	}
	fmt.Fprintf(&b, "\n## Invariants (%d acknowledged records checked)\n\n| invariant | result | found |\n|---|---|---|\n", r.Records)
	for _, inv := range r.Invariants {
		res := "holds"
		if !inv.OK {
			res = "**violated**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", inv.Name, res, strings.ReplaceAll(inv.Detail, "|", "\\|"))
	}
	fmt.Fprintf(&b, "\n## Schedule as run\n\n")
	for _, l := range r.Log {
		fmt.Fprintf(&b, "- %s\n", l)
	}
	return b.String()
}
