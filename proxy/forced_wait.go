package proxy

// Writes in flight when a forced switch leaves their generation. Their
// answers are refused whatever the old cluster says (forcedAway), so the
// writer does not wait for it: the old cluster is usually gone, and an
// answer it gives only when it returns (a stopped broker continued) would
// come after the same producer's next batches had been written to the new
// active cluster. An idempotent producer's refused batch, sent again then,
// meets OUT_OF_ORDER_SEQUENCE_NUMBER there for good, its successors already
// written (the 30-minute runs with forced switches: the Java producer
// stuck on one partition for up to two minutes). Answered at the hold, the
// refusal notes the batch unwritten (remappedPIDs.refused) before the
// switch installs the new generation, and the producer's later batches
// wait behind it (blocks); the hold's wait for writes in flight
// (Settled) ends at once instead of at its bound.

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ferry-gw/ferry/routing"
)

// writeWaits are a connection's contexts for waiting on the answers to its
// writes, one per generation: a forced switch that leaves a generation
// cancels its context (forcedLoop), and a write of a generation already
// left waits under one cancelled from the start. Made once per
// generation; at most maxWriteWaits are kept (the oldest cancelled: a
// write waiting under it fails as if its broker had gone, retriable).
type writeWaits struct {
	mu    sync.Mutex
	byGen []genWait
	// through: generations below it were left by a forced switch
	// (written under mu, read without it by forcedAway).
	through atomic.Uint32
}

// cancelled is the context of writes whose generation was already left.
var cancelled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

type genWait struct {
	gen    uint32
	ctx    context.Context
	cancel context.CancelFunc
}

const maxWriteWaits = 4

// writeCtx returns the context to wait for the answer to a write of gen
// under.
func (c *clientConn) writeCtx(gen uint32) context.Context {
	w := &c.writeWaits
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.forcedAway(gen) {
		return cancelled
	}
	for _, g := range w.byGen {
		if g.gen == gen {
			return g.ctx
		}
	}
	if len(w.byGen) == maxWriteWaits {
		w.byGen[0].cancel()
		w.byGen = append(w.byGen[:0], w.byGen[1:]...)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	w.byGen = append(w.byGen, genWait{gen, ctx, cancel})
	return ctx
}

// forcedFrom ends the waits for answers to writes of gen or older.
func (c *clientConn) forcedFrom(gen uint32) {
	w := &c.writeWaits
	w.mu.Lock()
	w.through.Store(max(w.through.Load(), gen+1))
	kept := w.byGen[:0]
	for _, g := range w.byGen {
		if g.gen <= gen {
			g.cancel()
			continue
		}
		kept = append(kept, g)
	}
	w.byGen = kept
	w.mu.Unlock()
	// A write of gen next in line, awaited from its broker, is the
	// writer's now (answers.go).
	c.kickAnswers()
}

// forcedAway says whether a forced switch left gen: its writes are
// answered without waiting for their broker.
func (c *clientConn) forcedAway(gen uint32) bool {
	return gen < c.writeWaits.through.Load()
}

// forcedLoop tells every connection when a forced switch leaves a
// generation, until the server closes: at its hold, or at its install on a
// member the hold missed.
func (s *Server) forcedLoop() {
	var told *routing.Switch
	for {
		changed := s.routes.Changed()
		st := s.routes.Current()
		if from, ok := forcedAwayFrom(st); ok && st.Last != told {
			told = st.Last
			s.mu.Lock()
			for c := range s.conns {
				c.forcedFrom(from)
			}
			s.mu.Unlock()
		}
		select {
		case <-s.ctx.Done():
			return
		case <-changed:
		}
	}
}

// forcedAwayFrom is the generation a forced switch in st leaves: st's own
// while the switch holds, the one it switched from once installed.
func forcedAwayFrom(st routing.State) (uint32, bool) {
	sw := st.Last
	switch {
	case sw == nil || sw.Mode != routing.Forced:
		return 0, false
	case st.Phase != routing.PhaseServing:
		return st.Generation, true
	case sw.Outcome == routing.OutcomeSwitched && sw.FromGeneration != nil:
		return *sw.FromGeneration, true
	}
	return 0, false
}
