package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Re-framing a batch the log cleaner left with holes inside it: a broker
// accepts only batches whose record count equals their offset range, so
// such a batch is split into runs of records with consecutive offsets, each
// its own batch at the source offset of its first record. Only the prefix
// of each record (length, attributes, timestampDelta, offsetDelta) is
// re-encoded; key, value and header bytes are copied as they are. This file
// works on the records as they are laid out uncompressed; a compressed
// batch is decompressed first and each run compressed again with the same
// codec (batch_recompress.go).

// ErrCompressedBatch means a batch that must be read record by record is
// compressed and the caller asked for the uncompressed path (SplitRuns);
// RecompressRuns handles compressed batches.
var ErrCompressedBatch = errors.New("protocol: batch is compressed")

// recordFrame is one record of a batch: its prefix fields and the bytes
// after offsetDelta (key, value, headers), shared with the records payload.
type recordFrame struct {
	attrs          byte
	timestampDelta int64
	offsetDelta    int64
	rest           []byte
}

// recordFrames parses the record framing of b's records, p (b's payload, or
// its payload decompressed), just far enough to find each record's prefix
// fields and byte range. It checks that the records fill p exactly, that
// there are NumRecords of them, and that their offset deltas increase
// within [0, LastOffsetDelta].
func recordFrames(b Batch, p []byte) ([]recordFrame, error) {
	n := b.NumRecords()
	if n < 0 {
		return nil, fmt.Errorf("%w: record count %d", ErrBadRecord, n)
	}
	frames := make([]recordFrame, 0, min(int(n), len(p)/7+1))
	last := int64(-1)
	for i := int32(0); i < n; i++ {
		l, k := binary.Varint(p)
		if k <= 0 || l < 1 || l > int64(len(p)-k) {
			return nil, fmt.Errorf("%w: record %d length", ErrBadRecord, i)
		}
		body := p[k : k+int(l)]
		p = p[k+int(l):]
		var f recordFrame
		f.attrs = body[0]
		body = body[1:]
		if f.timestampDelta, k = binary.Varint(body); k <= 0 {
			return nil, fmt.Errorf("%w: record %d timestampDelta", ErrBadRecord, i)
		}
		body = body[k:]
		if f.offsetDelta, k = binary.Varint(body); k <= 0 {
			return nil, fmt.Errorf("%w: record %d offsetDelta", ErrBadRecord, i)
		}
		if f.offsetDelta <= last || f.offsetDelta > int64(b.LastOffsetDelta()) {
			return nil, fmt.Errorf("%w: record %d offsetDelta %d after %d, lastOffsetDelta %d", ErrBadRecord, i, f.offsetDelta, last, b.LastOffsetDelta())
		}
		last = f.offsetDelta
		f.rest = body[k:]
		frames = append(frames, f)
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last record", ErrBadRecord, len(p))
	}
	return frames, nil
}

// SplitRuns splits an uncompressed batch into runs of records with
// consecutive offsets and returns each run as a new batch (its own memory)
// whose BaseOffset is the source offset of its first record. A batch
// without holes comes back as a single run equal to it in every record. A
// compressed batch is refused with ErrCompressedBatch (see RecompressRuns).
//
// Each run keeps the batch's attributes, partition leader epoch and
// producer ID and epoch; its base sequence is the sequence of its first
// record (when the batch has one). Offset deltas are re-based to the run.
// Record timestamps stay the same: the run's base timestamp is its first
// record's timestamp (or the batch's delete horizon, kept as it is when the
// batch carries one) and its max timestamp is its records' largest (or the
// batch's, for LogAppendTime). The CRC is set.
func SplitRuns(b Batch) ([]Batch, error) {
	if b.Compression() != CompressionNone {
		return nil, ErrCompressedBatch
	}
	return splitRuns(b, b.Payload(), CompressionNone)
}

// splitRuns splits b, whose records uncompressed are p, into runs, each
// compressed with codec.
func splitRuns(b Batch, p []byte, codec int8) ([]Batch, error) {
	frames, err := recordFrames(b, p)
	if err != nil {
		return nil, err
	}
	var runs []Batch
	for i := 0; i < len(frames); {
		j := i + 1
		for j < len(frames) && frames[j].offsetDelta == frames[j-1].offsetDelta+1 {
			j++
		}
		r, err := appendRun(nil, b, frames[i:j], codec)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
		i = j
	}
	return runs, nil
}

// appendRun appends one run of b's records, as a batch whose records are
// compressed with codec, to dst.
func appendRun(dst []byte, b Batch, run []recordFrame, codec int8) (Batch, error) {
	start := len(dst)
	dst = append(dst, b[:BatchHeaderSize]...)
	var base, maxTS int64
	if codec == CompressionNone {
		dst, base, maxTS = appendRecords(dst, b, run)
	} else {
		var recs []byte
		recs, base, maxTS = appendRecords(nil, b, run)
		var err error
		if dst, err = appendCompressed(dst, codec, recs); err != nil {
			return nil, err
		}
	}
	r := Batch(dst[start:])
	first := run[0].offsetDelta
	r.SetBaseOffset(b.BaseOffset() + first)
	binary.BigEndian.PutUint32(r[offBatchLength:], uint32(len(r)-batchLengthPrefix))
	binary.BigEndian.PutUint32(r[offLastOffsetDelta:], uint32(len(run)-1))
	binary.BigEndian.PutUint64(r[offBaseTimestamp:], uint64(base))
	binary.BigEndian.PutUint64(r[offMaxTimestamp:], uint64(maxTS))
	if seq := b.BaseSequence(); seq >= 0 {
		s := (int64(seq) + first) % (math.MaxInt32 + 1)
		binary.BigEndian.PutUint32(r[offBaseSequence:], uint32(s))
	}
	binary.BigEndian.PutUint32(r[offRecordCount:], uint32(len(run)))
	r.UpdateCRC()
	return r, nil
}

// appendRecords appends the records of one run of b to dst, uncompressed,
// each with its prefix re-encoded for the run, and returns the run's base
// and max timestamps.
func appendRecords(dst []byte, b Batch, run []recordFrame) (_ []byte, base, maxTS int64) {
	first := run[0].offsetDelta
	srcBase := b.BaseTimestamp()
	base = srcBase + run[0].timestampDelta
	if b.HasDeleteHorizon() {
		base = srcBase
	}
	maxTS = math.MinInt64
	var prefix []byte
	for _, f := range run {
		ts := srcBase + f.timestampDelta
		maxTS = max(maxTS, ts)
		prefix = prefix[:0]
		prefix = append(prefix, f.attrs)
		prefix = binary.AppendVarint(prefix, ts-base)
		prefix = binary.AppendVarint(prefix, f.offsetDelta-first)
		dst = binary.AppendVarint(dst, int64(len(prefix)+len(f.rest)))
		dst = append(dst, prefix...)
		dst = append(dst, f.rest...)
	}
	if b.HasLogAppendTime() {
		maxTS = b.MaxTimestamp()
	}
	return dst, base, maxTS
}

// HasRecordAt reports whether the batch holds a record at offset. For a
// batch with consecutive offsets that is any offset in its range; for a
// batch with holes the records are read (a compressed one is decompressed,
// up to MaxDecompressedSize). When they cannot be read it answers true for
// the whole range.
func (b Batch) HasRecordAt(offset int64) bool {
	if offset < b.BaseOffset() || offset >= b.NextOffset() || b.NumRecords() == 0 {
		return false
	}
	if b.HasConsecutiveOffsets() {
		return true
	}
	p, err := DecompressPayload(b, MaxDecompressedSize)
	if err != nil {
		return true
	}
	frames, err := recordFrames(b, p)
	if err != nil {
		return true
	}
	d := offset - b.BaseOffset()
	for _, f := range frames {
		if f.offsetDelta == d {
			return true
		}
	}
	return false
}
