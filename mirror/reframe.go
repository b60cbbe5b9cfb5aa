package mirror

import (
	"context"

	"github.com/ferry-gw/ferry/protocol"
)

// Batches with holes inside them. After a log-cleaner run a source batch
// may keep its base offset and lastOffsetDelta but hold fewer records than
// its offset range, which a broker refuses from a client. An uncompressed
// one is re-framed without touching key, value or header bytes: each run of
// records with consecutive offsets becomes its own batch at the source
// offset of its first record (protocol.SplitRuns), and the holes between
// the runs, before the first and after the last are filled like any other
// gap. A compressed one would need recompression, which Ferry never does:
// the partition halts.

// reframe returns the runs of b when b is a data batch with holes inside
// it, nil when b goes as it is, or a halt. Runs the standby already holds
// (a session that stopped between the runs of b) are left out; the standby
// ending inside a run is a divergence.
func (w *writer) reframe(b protocol.Batch) ([]protocol.Batch, error) {
	if b.IsControl() || b.NumRecords() == 0 || b.HasConsecutiveOffsets() {
		return nil, nil
	}
	base := b.BaseOffset()
	if b.Compression() != protocol.CompressionNone {
		return nil, w.halt(ErrUnsupportedBatch, base,
			"compacted batch %d..%d holds %d records: a broker accepts only batches with consecutive offsets, and Ferry does not recompress batches (codec %d)",
			base, b.NextOffset()-1, b.NumRecords(), b.Compression())
	}
	runs, err := protocol.SplitRuns(b)
	if err != nil {
		return nil, w.halt(ErrUnsupportedBatch, base, "compacted batch %d..%d: %v", base, b.NextOffset()-1, err)
	}
	for len(runs) > 0 && runs[0].NextOffset() <= w.next {
		runs = runs[1:]
	}
	if len(runs) > 0 && runs[0].BaseOffset() < w.next {
		return nil, w.halt(ErrDiverged, w.next, "standby ends at %d, inside the records %d..%d of the source batch %d..%d",
			w.next, runs[0].BaseOffset(), runs[0].NextOffset()-1, base, b.NextOffset()-1)
	}
	return runs, nil
}

// send appends b, or, when runs is not nil, the runs of b with fillers in
// the holes around them, up to the end of b's offset range.
func (w *writer) send(ctx context.Context, b protocol.Batch, runs []protocol.Batch, slot *txnSlot, kind string) error {
	if runs == nil {
		return w.produce(ctx, b, slot, kind)
	}
	w.m.metrics.reframed.Inc()
	for _, r := range runs {
		if r.BaseOffset() > w.next {
			if err := w.fill(ctx, w.next, r.BaseOffset()); err != nil {
				return err
			}
		}
		if err := w.produce(ctx, r, slot, kind); err != nil {
			return err
		}
	}
	if end := b.NextOffset(); end > w.next {
		return w.fill(ctx, w.next, end)
	}
	return nil
}

// tailBatch returns the part of the source batch rb that the standby's
// batch starting at base should equal: rb itself, or, for an uncompressed
// batch with holes, its run starting at base (nil if it has none).
func tailBatch(rb protocol.Batch, base int64) protocol.Batch {
	if rb.IsControl() || rb.NumRecords() == 0 || rb.HasConsecutiveOffsets() || rb.Compression() != protocol.CompressionNone {
		return rb
	}
	runs, err := protocol.SplitRuns(rb)
	if err != nil {
		return rb
	}
	for _, r := range runs {
		if r.BaseOffset() == base {
			return r
		}
	}
	return nil
}
