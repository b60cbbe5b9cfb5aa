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
//     reads the standby's end or touches the transactional slots.
//
// So every append of the old writer was sent at least 3/4 of a fence period before
// the new writer looks at the standby. Its transactional work is fenced at
// the coordinator besides (slot epochs), and from the new writer's first
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
	id := w.ownerTxnID()
	p, err := w.m.initProducer(ctx, &id)
	if err != nil {
		return err
	}
	w.plain = p
	// Epoch 0 means the coordinator had never seen this ID: there is no
	// previous owner whose fence period to wait out. (Epoch exhaustion also
	// restarts at 0, after 32767 owners; not a case worth 2 s per start.)
	if p.epoch > 0 {
		w.logger().Debug("mirror partition ownership taken, waiting out the previous fence period",
			zap.Int64("producer_id", p.id), zap.Int16("epoch", p.epoch), zap.Duration("fence_period", w.m.cfg.fencePeriod))
		if err := sleep(ctx, w.m.cfg.fencePeriod); err != nil {
			return err
		}
	}
	w.lastPing = time.Time{}
	return w.checkFence(ctx)
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
		sent = time.Now()
		ds, err := w.m.dstAdm.DescribeTransactions(ctx, id)
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
