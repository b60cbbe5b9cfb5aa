package mirror

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// Single writer per partition.
//
// Each partition has a transactional ID of its own on the standby,
// "<prefix>.<topic>.<partition>.w", whose producer appends the writer's plain
// (non-transactional) batches; it never opens a transaction, so it never
// writes a marker. A writer session takes ownership with InitProducerId on
// it, which bumps the producer epoch at the transaction coordinator.
//
// The epoch alone does not stop an older writer in time: a partition leader
// learns a producer's new epoch only from an append carrying it
// (ProducerAppendInfo.checkProducerEpoch), and a new epoch may start at any
// time at sequence 0 (checkSequence), so the old writer's plain appends are
// accepted until the new writer's first one lands — by then the new writer
// has read the standby's end, and an old append landing in between is a
// duplicate. No append of a stock broker is conditional on anything but
// the same producer's previous sequence, so the gap is closed in time, by
// the fence period (fencePeriod, 2 s) on the coordinator's epoch:
//
//   - a writer sends an append (or EndTxn, which writes a marker) only
//     within a quarter fence period of a successful check that the coordinator still holds
//     its producer ID and epoch for the partition's transactional ID
//     (DescribeTransactions); a check that sees another epoch halts the
//     writer with ErrFenced;
//   - a new writer, after its InitProducerId, waits a whole fence period before it
//     reads the standby's end or touches the transactional slots — less
//     when it directly succeeds an earlier session of this process
//     (predecessor), whose appends it knows: then until a fence period
//     after the last of them.
//
// So every append of the old writer was sent at least 3/4 of a fence period before
// the new writer looks at the standby. Its transactional work is fenced at
// the coordinator besides (slot epochs: a slot is initialised at the
// session's start, or, when the coordinator does not know its ID, before its
// first transaction, within a quarter fence period of a check as an append
// is), and from the new writer's first
// append on, the standby leader refuses the old epoch
// (INVALID_PRODUCER_EPOCH). What remains is an append that spends more than
// 3/4 of a fence period between the old writer's socket and the leader's log (a
// request stuck in a broker queue): the per-append offset check halts the
// new writer on it (ErrOffsetMismatch), never silently. Fence periods are
// measured on each process's monotonic clock; no clock agreement is needed.

// ownerTxnID is the partition's ownership transactional ID.
func (w *writer) ownerTxnID() string {
	return fmt.Sprintf("%s.%s.%d.w", w.m.cfg.idPrefix, w.topic, w.partition)
}

// takeOwnership initialises the plain producer under the partition's
// transactional ID, then waits out the fence period of any earlier holder and
// checks that no later writer took it meanwhile.
func (w *writer) takeOwnership(ctx context.Context) error {
	pred := w.pred
	w.pred, w.owned, w.lastSent, w.kept = nil, false, time.Time{}, nil
	id := w.ownerTxnID()
	p, err := w.m.initProducer(ctx, &id)
	if err != nil {
		return err
	}
	w.plain = p
	if pred.succeededBy(p) {
		w.kept = pred.unused
	}
	w.settled = pred.settledBy(p)
	if wait := fenceWait(pred, p, w.m.cfg.fencePeriod, time.Now()); wait > 0 {
		w.logger().Debug("mirror partition ownership taken, waiting out the previous fence period",
			zap.Int64("producer_id", p.id), zap.Int16("epoch", p.epoch), zap.Duration("wait", wait))
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
	w.lastPing = time.Time{}
	if err := w.checkFence(ctx); err != nil {
		return err
	}
	w.owned = true
	return nil
}

// fenceWait is how long a writer that took ownership as owner waits before
// it reads the standby, given its predecessor in this process (nil: none).
// Epoch 0 means the coordinator had never seen the ID: there is no previous
// owner to wait out. (Epoch exhaustion also restarts at 0, after 32767
// owners; not a case worth 2 s per start.)
func fenceWait(pred *predecessor, owner producer, period time.Duration, now time.Time) time.Duration {
	switch {
	case owner.epoch == 0:
		return 0
	case !pred.succeededBy(owner):
		return period
	case pred.lastSent.IsZero():
		return 0
	}
	return max(0, pred.lastSent.Add(period).Sub(now))
}

// predecessor is what a session leaves the partition's next session in this
// process (the writer's own, after an error, or a new writer's, on Restart).
//
// The fence period exists for writers this process cannot see. When the
// new owner epoch is the predecessor's plus one under the same producer ID,
// no InitProducerId came in between: every writer of an older epoch was
// waited out by the predecessor (its session had taken ownership), and the
// predecessor's own appends were all sent by lastSent. So the new session
// waits only until lastSent plus a fence period — not at all if the
// predecessor appended nothing — which keeps the guarantee above (every
// earlier append sent a fence period before the standby is read). Restarting
// a halted partition, or a session after a leader moved, costs no fence
// period on an idle partition.
//
// unused are the slot producers the predecessor initialised and never began
// a transaction with. No request was ever sent under their epochs, and any
// older epoch was fenced by that initialisation, so the next session keeps
// those whose ID and epoch the coordinator still holds with no transaction
// open (initSlots) instead of initialising them again: four InitProducerIds
// fewer per idle partition, which is what a thousand writers starting at
// once queue on at the transaction coordinator.
type predecessor struct {
	plain    producer
	lastSent time.Time
	unused   map[string]producer // by transactional ID
	// quiet: every append it sent was acknowledged and every marker it
	// asked for was seen on the standby, so nothing of it can still land
	// there (standbyEnd).
	quiet bool
}

// predecessor is what this session leaves the next one: nil if it never
// took ownership (a session that failed before that leaves its own
// predecessor's, which still holds).
func (w *writer) predecessor() *predecessor {
	if !w.owned {
		return w.pred
	}
	p := &predecessor{plain: w.plain, lastSent: w.lastSent, quiet: w.acked == w.next && !w.marking}
	for _, s := range w.slots {
		if s.unused {
			if p.unused == nil {
				p.unused = make(map[string]producer, len(w.slots))
			}
			p.unused[*s.txnID] = s.producer
		}
	}
	return p
}

// settledBy reports whether the standby's end is settled for owner, the
// ownership taken after p: owner succeeds p directly (no other writer took
// the partition in between) and p left nothing on its way to the standby.
// Its high watermark then needs no second reading (standbyEnd).
func (p *predecessor) settledBy(owner producer) bool {
	return p.succeededBy(owner) && p.quiet
}

// succeededBy reports whether owner is the next epoch of p's producer: no
// other writer took the partition in between.
func (p *predecessor) succeededBy(owner producer) bool {
	return p != nil && p.plain.id == owner.id && int(owner.epoch) == int(p.plain.epoch)+1 // int: no wrap at 32767
}

// waitGate waits while the member's write gate (WithWriteGate) is shut.
func (w *writer) waitGate(ctx context.Context) error {
	gate := w.m.cfg.gate
	if gate == nil || gate() {
		return nil
	}
	w.logger().Info("mirror partition writer waiting: this member may not write now")
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !gate() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// checkFence confirms ownership if the last confirmation is older than a
// quarter fence period. Call it before sending anything that appends to the
// standby partition.
func (w *writer) checkFence(ctx context.Context) error {
	if err := w.waitGate(ctx); err != nil {
		return err
	}
	if !w.lastPing.IsZero() && time.Since(w.lastPing) < w.m.cfg.fencePeriod/4 {
		return nil
	}
	id := *w.plain.txnID
	var sent time.Time
	var pid int64
	var epoch int16
	err := retryTxn(ctx, "DescribeTransactions", func() error {
		// The coalesced request leaves after this (coalesce.go): the
		// answer is no older than sent.
		sent = time.Now()
		ds, err := w.m.txnDescs.getAll(ctx, id)
		if err != nil {
			return err
		}
		d, ok := ds[id]
		if !ok {
			return fmt.Errorf("transactional ID %s not in the response", id)
		}
		if d.Err != nil {
			return d.Err
		}
		pid, epoch = d.ProducerID, d.ProducerEpoch
		return nil
	})
	if err != nil {
		return fmt.Errorf("checking partition ownership: %w", err)
	}
	if pid != w.plain.id || epoch != w.plain.epoch {
		return w.halt(ErrFenced, w.next,
			"another writer took the partition: transactional ID %s is now producer %d epoch %d, this writer holds epoch %d",
			id, pid, epoch, w.plain.epoch)
	}
	w.lastPing = sent
	return nil
}
