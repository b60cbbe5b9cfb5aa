package membership

import (
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// The fleet's table of members is kept here, from memberlist's events and
// the members' own messages, never read from memberlist's internals (an
// upgrade of memberlist cannot change it under Ferry). memberlist's events
// tell a member joining or coming back (NotifyJoin), changing its metadata
// (NotifyUpdate) and being declared dead or leaving (NotifyLeave); they
// tell neither a member turning suspect nor a dead member from one that
// left. So:
//
//   - Suspect: every member sends every other a heartbeat each quarter
//     probe interval (memberlist's best-effort messages, encrypted and
//     labelled as all of its gossip). A member not heard from for a probe
//     interval and the probe timeout (1.5 s on a LAN) is suspect until it
//     is heard again or memberlist declares it dead. memberlist suspects a
//     member that leaves one probe unanswered for about a probe interval
//     (direct, then indirect); the silence tolerated here is longer, and
//     the detection as quick (memberlist's is as slow as the next probe of
//     the dead member, by any member). Silence counts from when the member
//     is first seen if its metadata says it sends heartbeats; a member of a
//     Ferry from before heartbeats (a rolling upgrade) is alive until
//     memberlist declares it dead, or until it is heard once.
//   - Left: a member leaving on purpose (Close) tells every other first, by
//     a reliable message; one that goes without saying so is dead, which
//     is the safe reading (a dead member is never taken to hold nothing).
//   - Dead and left members are forgotten no sooner than memberlist
//     forgets them: GossipToTheDeadTime after they went (30 s on a LAN),
//     at the end of its probe round (a probe interval per member), so that
//     a member coming back at the same address is never new to the table
//     while memberlist still remembers it dead.
//
// Heartbeats are a second failure detector beside memberlist's probes,
// local to each member: two members may briefly disagree on whether a
// third is suspect, as they may under memberlist's own gossip.

// entry is one member of the table.
type entry struct {
	node  memberlist.Node // Meta and Addr copied
	state State
}

// viewEntry is a member as the events and messages last told it. The
// delegates run under memberlist's lock and cannot call it, so they decide
// on this too.
type viewEntry struct {
	node    memberlist.Node
	gone    bool      // dead or left
	goneAt  time.Time // when it went
	leaving bool      // it said it leaves on purpose
	heard   time.Time // its last heartbeat; zero: never
}

// liveness holds the timings of the heartbeats.
type liveness struct {
	every        time.Duration // a heartbeat to each member this often
	suspectAfter time.Duration // silence after which a member heard before is suspect
	forgetAfter  time.Duration // a dead or left member stays listed this long,
	probe        time.Duration // and a probe interval per member known
}

func newLiveness(mc *memberlist.Config) liveness {
	return liveness{
		every:        mc.ProbeInterval / 4,
		suspectAfter: mc.ProbeInterval + mc.ProbeTimeout,
		forgetAfter:  mc.GossipToTheDeadTime,
		probe:        mc.ProbeInterval,
	}
}

// see records an event of memberlist's about n.
func (f *Fleet) see(n *memberlist.Node, gone bool) {
	c := *n
	c.Addr = append([]byte(nil), n.Addr...)
	c.Meta = append([]byte(nil), n.Meta...)
	now := time.Now()
	f.mu.Lock()
	e := f.view[n.Name]
	e.node = c
	switch {
	case gone && !e.gone:
		e.gone, e.goneAt = true, now
	case !gone && e.gone:
		// Back: from now on it is judged afresh.
		e = viewEntry{node: c}
	}
	if !gone && e.heard.IsZero() {
		// A member that sends heartbeats is silent from the moment
		// it is seen until its first one arrives.
		if m, err := parseMeta(n.Name, c.Meta); err == nil && m.Heartbeats {
			e.heard = now
		}
	}
	f.view[n.Name] = e
	f.mu.Unlock()
	f.kickWatch()
}

// heard records a heartbeat of member id.
func (f *Fleet) heard(id int32) {
	name := strconv.Itoa(int(id))
	now := time.Now()
	f.mu.Lock()
	e, ok := f.view[name]
	wasSuspect := ok && !e.heard.IsZero() && now.Sub(e.heard) > f.live.suspectAfter
	if ok {
		e.heard = now
		f.view[name] = e
	}
	f.mu.Unlock()
	if wasSuspect {
		f.kickWatch()
	}
}

// leaving records that member id said it leaves the fleet on purpose.
func (f *Fleet) leaving(id int32) {
	name := strconv.Itoa(int(id))
	f.mu.Lock()
	e, ok := f.view[name]
	if ok {
		e.leaving = true
		f.view[name] = e
	}
	f.mu.Unlock()
	f.kickWatch()
}

func (f *Fleet) kickWatch() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// table is every member this member knows, in no order: alive, suspect,
// dead and left (until forgotten).
func (f *Fleet) table() []entry {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]entry, 0, len(f.view))
	forget := f.live.forgetAfter + time.Duration(len(f.view))*f.live.probe
	for name, e := range f.view {
		var st State
		switch {
		case e.gone && now.Sub(e.goneAt) > forget:
			delete(f.view, name)
			continue
		case e.gone && e.leaving:
			st = Left
		case e.gone:
			st = Dead
		case name != f.name && !e.heard.IsZero() && now.Sub(e.heard) > f.live.suspectAfter:
			st = Suspect
		default:
			st = Alive
		}
		n := e.node
		n.Addr = append([]byte(nil), n.Addr...)
		n.Meta = append([]byte(nil), n.Meta...)
		out = append(out, entry{node: n, state: st})
	}
	return out
}

// heartbeats sends a heartbeat to every other member not gone, each
// live.every, until the fleet closes.
func (f *Fleet) heartbeats() {
	hb := (&message{typ: msgHeartbeat, from: f.id}).encode()
	t := time.NewTicker(f.live.every)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		for _, n := range f.others() {
			// Best effort: a lost heartbeat is what the detector
			// tolerates. The error is a local one (no route).
			_ = f.ml.SendBestEffort(&n, hb)
		}
	}
}

// others are the nodes of the members not gone, this one left out.
func (f *Fleet) others() []memberlist.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []memberlist.Node
	for name, e := range f.view {
		if name != f.name && !e.gone {
			out = append(out, e.node)
		}
	}
	return out
}

// sayLeaving tells every other member, reliably and in parallel, that this
// one leaves on purpose; it waits at most timeout.
func (f *Fleet) sayLeaving(timeout time.Duration) {
	msg := (&message{typ: msgLeaving, from: f.id}).encode()
	var wg sync.WaitGroup
	for _, n := range f.others() {
		wg.Go(func() { _ = f.ml.SendReliable(&n, msg) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
	}
}
