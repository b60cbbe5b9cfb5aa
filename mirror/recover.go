package mirror

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
)

// Writer transactions left open by an earlier writer (a crash, kill -9, a
// lost connection) are resumed, not aborted. InitProducerId on an open
// transactional ID would abort the transaction and put its ABORT marker at
// the standby's end — where the source rarely has that marker (it has the
// rest of the transaction, or a COMMIT). Instead the session:
//
//  1. describes the slots' transactional IDs (DescribeTransactions) and
//     waits while one is preparing to commit or abort (its markers are
//     being written);
//  2. initialises every slot that has no open transaction on the
//     partition, and keeps the producer ID and epoch of each one that has
//     (a slot whose transactional ID the coordinator does not know is
//     initialised only when a transaction first needs it: readySlot);
//  3. after reading the standby's end, asks the standby leader where each
//     open transaction starts and which sequence it reached
//     (DescribeProducers), and reads what is at that start: a filler batch
//     (the transaction fills a source gap, maybe a hole between the runs of
//     a re-framed batch: more fillers, then its ABORT takes the gap's last
//     offset) or a transactional batch of the source, or a run of one with
//     holes inside (the transaction mirrors that source producer's
//     transaction: its remaining runs and batches go in, and it ends with
//     the source's marker, at the source marker's offset).
//
// Whatever cannot be matched halts the partition with the exact offsets
// (ErrDiverged). An open transaction with the partition added but no batch
// appended yet is kept for the next transaction or gap; if none comes
// within the transaction timeout the coordinator aborts it, and the offset
// check halts on the stray marker.

// testHookEndTxn, if set, runs just before a writer sends EndTxn (tests
// kill the process there).
var testHookEndTxn func(commit bool)

// testHookEndedTxn, if set, runs once a writer's EndTxn for the marker at
// offset at is answered, before it waits for the marker (waited false)
// and once the marker is there (true): tests write the marker a second
// time there.
var testHookEndedTxn func(at int64, waited bool)

func (w *writer) slotTxnID(i int) string {
	return fmt.Sprintf("%s.%s.%d.%d", w.m.cfg.idPrefix, w.topic, w.partition, i)
}

// initSlots sets up the transactional slots (steps 1 and 2).
func (w *writer) initSlots(ctx context.Context) error {
	n := w.m.cfg.txnSlots
	ids := make([]string, n)
	for i := range ids {
		ids[i] = w.slotTxnID(i)
	}
	var ds kadm.DescribedTransactions
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		ds, err = w.m.txnDescs.getAll(ctx, ids...)
		if err != nil {
			return fmt.Errorf("describing writer transactions: %w", err)
		}
		busy := ""
		for _, id := range ids {
			d, ok := ds[id]
			switch {
			case !ok:
				busy = id + " missing from the response"
			case d.Err != nil && !errors.Is(d.Err, kerr.TransactionalIDNotFound):
				if !retriableTxnErr(d.Err) {
					return fmt.Errorf("describing writer transaction %s: %w", id, d.Err)
				}
				busy = id + ": " + d.Err.Error()
			case d.Err == nil && strings.HasPrefix(d.State, "Prepare"):
				busy = id + " is " + d.State
			}
		}
		if busy == "" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("writer transactions not settled after a minute: %s", busy)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	w.slots = w.slots[:0]
	for _, id := range ids {
		id := id
		d := ds[id]
		if d.Err == nil && d.State == "Ongoing" {
			if _, ok := d.Topics[w.topic][w.partition]; ok {
				w.slots = append(w.slots, &txnSlot{
					producer: producer{id: d.ProducerID, epoch: d.ProducerEpoch, seq: -1, txnID: &id},
					open:     true,
				})
				continue
			}
		}
		if p, ok := w.keptSlot(id, ds[id]); ok {
			w.slots = append(w.slots, &txnSlot{producer: p, unused: true})
			continue
		}
		if errors.Is(d.Err, kerr.TransactionalIDNotFound) {
			// No writer holds it (never initialised, or idle past the
			// coordinator's expiry): nothing to fence. It is initialised
			// when a transaction first needs it (readySlot); on an idle
			// partition, never.
			w.slots = append(w.slots, &txnSlot{producer: producer{id: -1, epoch: -1, txnID: &id}, lazy: true})
			continue
		}
		p, err := w.m.initProducer(ctx, &id)
		if err != nil {
			return err
		}
		w.slots = append(w.slots, &txnSlot{producer: p, unused: true})
	}
	return nil
}

// keptSlot returns the slot producer the session's direct predecessor left
// unused under transactional ID id (fence.go, predecessor), if the
// coordinator, as described in d, still holds its ID and epoch with no
// transaction open or ending.
func (w *writer) keptSlot(id string, d kadm.DescribedTransaction) (producer, bool) {
	p, ok := w.kept[id]
	if !ok || d.Err != nil || d.ProducerID != p.id || d.ProducerEpoch != p.epoch {
		return producer{}, false
	}
	switch d.State {
	case "Empty", "CompleteCommit", "CompleteAbort":
		p.txnID = &id // its own copy: the slot's, not the map entry's
		return p, true
	}
	return producer{}, false
}

// resumeOpen matches each transaction left open with what it mirrors (step
// 3). w.next is the standby's end.
func (w *writer) resumeOpen(ctx context.Context) error {
	var open []*txnSlot
	for _, s := range w.slots {
		if s.open && s.seq < 0 {
			open = append(open, s)
		}
	}
	if len(open) == 0 {
		return nil
	}
	dps, err := w.m.dstAdm.DescribeProducers(ctx, kadm.TopicsSet{w.topic: {w.partition: {}}})
	if err != nil {
		return fmt.Errorf("describing standby producers: %w", err)
	}
	dp, ok := dps[w.topic].Partitions[w.partition]
	if !ok {
		return errors.New("describing standby producers: partition missing from the response")
	}
	if dp.Err != nil {
		return fmt.Errorf("describing standby producers: %w", dp.Err)
	}
	for _, s := range open {
		ap, ok := dp.ActiveProducers[s.id]
		if !ok || ap.CurrentTxnStartOffset < 0 {
			// Added to the transaction, nothing appended.
			s.open, s.added, s.seq = false, true, 0
			if ok && ap.ProducerEpoch == s.epoch {
				s.seq = nextSeq(ap.LastSequence, 1)
			}
			w.logger().Warn("writer transaction left open with nothing appended: kept for the next transaction or gap",
				zap.String("transactional_id", *s.txnID))
			continue
		}
		if ap.ProducerEpoch != s.epoch {
			return fmt.Errorf("writer transaction %s: coordinator has epoch %d, standby leader %d", *s.txnID, s.epoch, ap.ProducerEpoch)
		}
		s.seq = nextSeq(ap.LastSequence, 1)
		first := ap.CurrentTxnStartOffset
		if first >= w.next {
			return w.halt(ErrDiverged, first, "writer transaction %s starts at %d, at or above the standby's end %d", *s.txnID, first, w.next)
		}
		sb, err := w.batchAt(ctx, w.dst, first)
		if err != nil {
			return err
		}
		if sb != nil && protocol.IsFillerBatch(sb) {
			if w.fillSlot != nil {
				return w.halt(ErrDiverged, first, "two filler transactions open (%s from %d)", *s.txnID, first)
			}
			s.srcPID = -1
			w.fillSlot = s
			w.m.metrics.resumedTxns.Inc()
			w.logger().Info("resuming a filler transaction an earlier writer left open",
				zap.String("transactional_id", *s.txnID), zap.Int64("first_offset", first), zap.Int64("standby_end", w.next))
			continue
		}
		rb, err := w.batchAt(ctx, w.src, first)
		if err != nil {
			return err
		}
		// The source batch that holds first: it starts there, or it has
		// holes inside and one of its runs starts there (reframe.go; its
		// first records were removed, or an earlier session wrote its first
		// runs plainly). The copy loop goes on from the next run.
		if rb == nil || rb.IsControl() || !rb.IsTransactional() || !startsRun(rb, first) {
			return w.halt(ErrDiverged, first,
				"writer transaction %s open on the standby from %d to %d, but no transactional source batch or run of one starts at %d", *s.txnID, first, w.next, first)
		}
		pid := rb.ProducerID()
		if w.open[pid] != nil {
			return w.halt(ErrDiverged, first, "two writer transactions open for source producer %d", pid)
		}
		s.srcPID = pid
		w.open[pid] = s
		w.m.metrics.resumedTxns.Inc()
		w.logger().Info("resuming a writer transaction an earlier writer left open",
			zap.String("transactional_id", *s.txnID), zap.Int64("source_producer_id", pid),
			zap.Int64("first_offset", first), zap.Int64("standby_end", w.next))
	}
	return nil
}

// batchAt returns the batch of c's log (read_uncommitted) that holds
// offset, or nil if there is none (a gap, or below the log start).
func (w *writer) batchAt(ctx context.Context, c *link, offset int64) (protocol.Batch, error) {
	epoch := w.epoch
	w.epoch = -1 // no divergence check on this look-up
	p, err := w.fetch(ctx, c, offset, 0, 0, oneBatch)
	w.epoch = epoch
	if err != nil {
		return nil, err
	}
	if p.ErrorCode == kerr.OffsetOutOfRange.Code {
		return nil, nil
	}
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		return nil, fmt.Errorf("fetch at %d: %w", offset, err)
	}
	b, err := firstBatchAt(p.RecordBatches, offset)
	if err != nil || b == nil || b.BaseOffset() > offset {
		return nil, err
	}
	return b, nil
}

// checkEpoch asks the source leader where the leader epoch of the last
// batch this writer mirrored ends now (OffsetForLeaderEpoch). Below the
// standby's end means the source lost offsets the standby holds — an
// unclean leader election elected a replica that never had them — and the
// partition halts with ErrSourceTruncated. Only known after this process
// mirrored something; a restarted process relies on the tail check.
func (w *writer) checkEpoch(ctx context.Context) error {
	if w.epoch < 0 || w.next == 0 {
		return nil
	}
	// Shared with the other writers starting now (m.srcEpochs): one
	// request per source leader.
	at := epochAt{topicPartition{w.topic, w.partition}, w.epoch}
	got, err := w.m.srcEpochs.getAll(ctx, at)
	if err != nil {
		return fmt.Errorf("OffsetForLeaderEpoch: %w", err)
	}
	rp, ok := got[at]
	switch {
	case !ok:
		return errors.New("OffsetForLeaderEpoch: the partition missing from the response")
	case rp.Err != nil:
		return fmt.Errorf("OffsetForLeaderEpoch: %w", rp.Err)
	}
	if rp.EndOffset >= 0 && rp.EndOffset < w.next {
		return w.halt(ErrSourceTruncated, w.next,
			"the source leader's epoch history ends epoch %d at offset %d (its latest epoch at or below is %d), but the standby holds offsets up to %d mirrored under epoch %d: the source lost offsets %d..%d (unclean leader election)",
			w.epoch, rp.EndOffset, rp.LeaderEpoch, w.next-1, w.epoch, rp.EndOffset, w.next-1)
	}
	return nil
}
