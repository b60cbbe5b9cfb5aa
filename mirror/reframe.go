package mirror

import (
	"bytes"
	"context"

	"github.com/ferry-gw/ferry/protocol"
)

// Batches with holes inside them. After a log-cleaner run a source batch
// may keep its base offset and lastOffsetDelta but hold fewer records than
// its offset range, which a broker refuses from a client. Such a batch is
// re-framed: each run of records with consecutive offsets becomes its own
// batch at the source offset of its first record, and the holes between
// the runs, before the first and after the last are filled like any other
// gap. An uncompressed one keeps its key, value and header bytes as they
// are (protocol.SplitRuns). A compressed one is decompressed and each run
// compressed again with the same codec (protocol.RecompressRuns): the one
// case where Ferry does not forward a source batch's payload as bytes. The
// source's cleaner already decompressed and recompressed that batch, and
// the alternative is halting the partition, which RecompressCompacted(false)
// chooses.

// reframe returns the runs of b when b is a data batch with holes inside
// it, nil when b goes as it is, or a halt. Runs the standby already holds
// (a session that stopped between the runs of b) are left out; the standby
// ending inside a run is a divergence.
func (w *writer) reframe(b protocol.Batch) ([]protocol.Batch, error) {
	if b.IsControl() || b.NumRecords() == 0 || b.HasConsecutiveOffsets() {
		return nil, nil
	}
	base := b.BaseOffset()
	if b.Compression() != protocol.CompressionNone && !w.m.cfg.recompress {
		return nil, w.halt(ErrUnsupportedBatch, base,
			"compacted batch %d..%d holds %d records: a broker accepts only batches with consecutive offsets, and recompressing such batches is turned off (codec %d)",
			base, b.NextOffset()-1, b.NumRecords(), b.Compression())
	}
	// An uncompressed batch goes through RecompressRuns as through
	// SplitRuns.
	runs, err := protocol.RecompressRuns(b, protocol.MaxDecompressedSize)
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

// startsRun reports whether the writer's copy of b, a source data batch,
// has a batch starting at offset: b itself, or, when b has holes inside, one
// of its runs.
func startsRun(b protocol.Batch, offset int64) bool {
	if b.BaseOffset() == offset {
		return true
	}
	if b.NumRecords() == 0 || b.HasConsecutiveOffsets() {
		return false
	}
	runs, err := protocol.RecompressRuns(b, protocol.MaxDecompressedSize)
	if err != nil {
		return false
	}
	for _, r := range runs {
		if r.BaseOffset() == offset {
			return true
		}
	}
	return false
}

// testHookRunWritten, if set, runs when the standby acknowledged run i of
// the n runs of b, re-framed, written inside a writer transaction when txn;
// an error it returns ends the session (tests: a writer stopped between the
// runs).
var testHookRunWritten func(topic string, b protocol.Batch, i, n int, txn bool) error

// send appends b, or, when runs is not nil, the runs of b with fillers in
// the holes around them, up to the end of b's offset range.
func (w *writer) send(ctx context.Context, b protocol.Batch, runs []protocol.Batch, slot *txnSlot, kind string) error {
	if runs == nil {
		return w.produce(ctx, b, slot, kind)
	}
	if b.Compression() == protocol.CompressionNone {
		w.m.metrics.reframed.Inc()
	} else {
		w.m.metrics.recompressed.Inc()
	}
	for i, r := range runs {
		if r.BaseOffset() > w.next {
			if err := w.fill(ctx, w.next, r.BaseOffset()); err != nil {
				return err
			}
		}
		if err := w.produce(ctx, r, slot, kind); err != nil {
			return err
		}
		if testHookRunWritten != nil {
			if err := w.drain(ctx); err != nil {
				return err
			}
			if err := testHookRunWritten(w.topic, b, i, len(runs), slot != nil); err != nil {
				return err
			}
		}
	}
	if end := b.NextOffset(); end > w.next {
		return w.fill(ctx, w.next, end)
	}
	return nil
}

// tailMatches reports whether sb, the standby's last data batch, is what
// the writer made of rb, the source data batch that covers its offsets: rb
// itself, or, for a batch with holes inside, the run of rb that starts
// where sb does.
//
// rb itself and a run of an uncompressed batch are compared byte for byte.
// A recompressed run is compared decompressed: its records are a function
// of the source batch alone (prefixes re-based, everything else copied),
// but its compressed bytes depend on the encoder's version and settings,
// which need not be those of the Ferry that wrote sb.
func tailMatches(rb, sb protocol.Batch) bool {
	if rb.IsControl() {
		return false
	}
	if rb.NumRecords() == 0 || rb.HasConsecutiveOffsets() {
		return rb.BaseOffset() == sb.BaseOffset() && rb.NextOffset() == sb.NextOffset() && bytes.Equal(rb.Payload(), sb.Payload())
	}
	runs, err := protocol.RecompressRuns(rb, protocol.MaxDecompressedSize)
	if err != nil {
		return false
	}
	for _, r := range runs {
		if r.BaseOffset() != sb.BaseOffset() {
			continue
		}
		if r.NextOffset() != sb.NextOffset() || r.Compression() != sb.Compression() {
			return false
		}
		if r.Compression() == protocol.CompressionNone {
			return bytes.Equal(r.Payload(), sb.Payload())
		}
		rp, err1 := protocol.DecompressPayload(r, protocol.MaxDecompressedSize)
		sp, err2 := protocol.DecompressPayload(sb, protocol.MaxDecompressedSize)
		return err1 == nil && err2 == nil && bytes.Equal(rp, sp)
	}
	return false
}
