package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Re-framing an uncompressed batch the log cleaner left with holes inside
// it: a broker accepts only batches whose record count equals their offset
// range, so such a batch is split into runs of records with consecutive
// offsets, each its own batch at the source offset of its first record.
// Only the prefix of each record (length, attributes, timestampDelta,
// offsetDelta) is re-encoded; key, value and header bytes are copied as
// they are.

// ErrCompressedBatch means a batch that must be read record by record is
// compressed; Ferry never decompresses.
var ErrCompressedBatch = errors.New("protocol: batch is compressed")

// recordFrame is one record of an uncompressed batch: its prefix fields and
// the bytes after offsetDelta (key, value, headers), shared with the batch.
type recordFrame struct {
	attrs          byte
	timestampDelta int64
	offsetDelta    int64
	rest           []byte
}

// recordFrames parses the record framing of an uncompressed batch just far
// enough to find each record's prefix fields and byte range. It checks that
// the records fill the payload exactly, that there are NumRecords of them,
// and that their offset deltas increase within [0, LastOffsetDelta].
func recordFrames(b Batch) ([]recordFrame, error) {
	if b.Compression() != CompressionNone {
		return nil, ErrCompressedBatch
	}
	n := b.NumRecords()
	if n < 0 {
		return nil, fmt.Errorf("%w: record count %d", ErrBadRecord, n)
	}
	p := b.Payload()
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
// without holes comes back as a single run equal to it in every record.
//
// Each run keeps the batch's attributes, partition leader epoch and
// producer ID and epoch; its base sequence is the sequence of its first
// record (when the batch has one). Offset deltas are re-based to the run.
// Record timestamps stay the same: the run's base timestamp is its first
// record's timestamp (or the batch's delete horizon, kept as it is when the
// batch carries one) and its max timestamp is its records' largest (or the
// batch's, for LogAppendTime). The CRC is set.
func SplitRuns(b Batch) ([]Batch, error) {
	frames, err := recordFrames(b)
	if err != nil {
		return nil, err
	}
	var runs []Batch
	for i := 0; i < len(frames); {
		j := i + 1
		for j < len(frames) && frames[j].offsetDelta == frames[j-1].offsetDelta+1 {
			j++
		}
		runs = append(runs, appendRun(nil, b, frames[i:j]))
		i = j
	}
	return runs, nil
}

// appendRun appends one run of b's records, as a batch, to dst.
func appendRun(dst []byte, b Batch, run []recordFrame) Batch {
	start := len(dst)
	dst = append(dst, b[:BatchHeaderSize]...)
	first := run[0].offsetDelta
	srcBase := b.BaseTimestamp()
	base := srcBase + run[0].timestampDelta
	if b.HasDeleteHorizon() {
		base = srcBase
	}
	maxTS := int64(math.MinInt64)
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
	r := Batch(dst[start:])
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
	return r
}

// HasRecordAt reports whether the batch holds a record at offset. For a
// batch with consecutive offsets that is any offset in its range; for an
// uncompressed batch with holes the records are read; for a compressed
// batch with holes it answers true for its whole range (its records are
// not read).
func (b Batch) HasRecordAt(offset int64) bool {
	if offset < b.BaseOffset() || offset >= b.NextOffset() || b.NumRecords() == 0 {
		return false
	}
	if b.HasConsecutiveOffsets() || b.Compression() != CompressionNone {
		return true
	}
	frames, err := recordFrames(b)
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
