package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
)

// switchRound is one planned switch across the three members, timed from
// the call.
type switchRound struct {
	to       string
	via      int32
	answer   time.Duration // call → the switch's answer (the flip is just before)
	serving  time.Duration // call → every member's /status routing.generation is the new one
	gossiped time.Duration // call → every member's /status lists every member at the new generation
	slowest  string        // whose view of whom was the last to show the new generation
	caughtUp time.Duration // call → the fleet's mirror caught up the other way (every writer restarted)
	waited   time.Duration // the wait before the call for the mirror caught up (after the previous phase)
	polls    []time.Duration
}

// statusSeen is, for one member, the first /status answer that showed the
// new generation (its own, and in its list of members for all of them).
type statusSeen struct {
	serving, gossiped time.Time
	each              map[int32]time.Time // member → first answer listing it at the new generation
	polls             []time.Duration
	err               error
}

// pollGeneration polls m's /status back to back (a 2 ms pause between
// answers) until it serves gen and lists every member at gen, or ctx ends.
// A status counts at the moment its answer was read.
func (b *bench) pollGeneration(ctx context.Context, m *member, gen uint32, members int) statusSeen {
	s := statusSeen{each: map[int32]time.Time{}}
	for ctx.Err() == nil {
		sent := time.Now()
		st, err := b.fleet.status(ctx, m)
		at := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				s.err = err
			}
			return s
		}
		s.polls = append(s.polls, at.Sub(sent))
		if s.serving.IsZero() && st.Routing.Generation >= gen {
			s.serving = at
		}
		n := 0
		for _, mm := range st.Members {
			if mm.State == "alive" && mm.GossipGeneration >= gen { // gossip's own view
				n++
				if _, ok := s.each[mm.NodeID]; !ok {
					s.each[mm.NodeID] = at
				}
			}
		}
		if s.gossiped.IsZero() && n == members {
			s.gossiped = at
		}
		if !s.serving.IsZero() && !s.gossiped.IsZero() {
			return s
		}
		time.Sleep(2 * time.Millisecond)
	}
	return s
}

// switchTo asks member via for a planned switch to cluster to.
func (b *bench) switchTo(ctx context.Context, via *member, to string) (time.Duration, error) {
	body, _ := json.Marshal(map[string]string{"to": to, "mode": "planned", "timeout": "60s"})
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+via.admin+"/switchover", bytes.NewReader(body))
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	took := time.Since(start)
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("switch to %s via member %d: %d %s", to, via.id, resp.StatusCode, out)
	}
	return took, nil
}

// measureGossip runs planned switches, alternating their direction and the
// member called, and times each member's view of the new generation.
func (b *bench) measureGossip(ctx context.Context) error {
	ms := b.fleet.members
	for r := range b.o.rounds {
		st, err := b.fleet.status(ctx, ms[0])
		if err != nil {
			return err
		}
		// A planned switch drains into the standby: the mirror must be
		// caught up (after the last switch, every writer restarted the
		// other way; after the death rounds, handed back).
		_, waited, err := b.waitCaughtUp(ctx, 5*time.Minute)
		if err != nil {
			return fmt.Errorf("before switch %d: %w", r+1, err)
		}
		gen := st.Routing.Generation + 1
		to := "standby"
		if st.Routing.Active == "standby" {
			to = "primary"
		}
		via := ms[r%len(ms)]
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		seen := make([]statusSeen, len(ms))
		var wg sync.WaitGroup
		for i, m := range ms {
			wg.Go(func() { seen[i] = b.pollGeneration(pctx, m, gen, len(ms)) })
		}
		time.Sleep(50 * time.Millisecond) // the pollers are polling
		call := time.Now()
		answer, err := b.switchTo(ctx, via, to)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		wg.Wait()
		cancel()
		sr := switchRound{to: to, via: via.id, answer: answer, waited: waited}
		for i, s := range seen {
			if s.err != nil || s.serving.IsZero() || s.gossiped.IsZero() {
				return fmt.Errorf("switch %d to %s: member %d did not show generation %d within 2 minutes (%v)", r+1, to, i, gen, s.err)
			}
			sr.serving = max(sr.serving, s.serving.Sub(call))
			if d := s.gossiped.Sub(call); d > sr.gossiped {
				sr.gossiped = d
				for id, at := range s.each {
					if at.Equal(s.gossiped) {
						sr.slowest = fmt.Sprintf("member %d's view of member %d", i, id)
					}
				}
			}
			sr.polls = append(sr.polls, s.polls...)
		}
		for i, s := range seen {
			var v []string
			for id, at := range s.each {
				v = append(v, fmt.Sprintf("%d@%v", id, ms2(at.Sub(call))))
			}
			step("  member %d: serving %v, views %v", i, ms2(s.serving.Sub(call)), v)
		}
		pm, _, _ := benchutil.Spread(sr.polls)
		step("switch %d → %s via member %d: answer %v; every member serving generation %d %v after the call (%v after the answer), all gossiped %v after the call (%v after the answer; last: %s); /status answered in %v (median)",
			r+1, to, via.id, ms2(answer), gen, ms2(sr.serving), ms2(sr.serving-answer), ms2(sr.gossiped), ms2(sr.gossiped-answer), sr.slowest, ms2(pm))
		// The next switch needs the mirror caught up the other way: timed
		// from this one's call.
		if _, _, err := b.waitCaughtUp(ctx, 5*time.Minute); err != nil {
			return fmt.Errorf("after switch %d: %w", r+1, err)
		}
		sr.caughtUp = time.Since(call)
		step("switch %d: the fleet's mirror caught up the other way %v after the call", r+1, ms2(sr.caughtUp))
		b.cur.switches = append(b.cur.switches, sr)
		time.Sleep(time.Second)
	}
	return nil
}

func ms2(d time.Duration) string { return d.Round(time.Millisecond).String() }
