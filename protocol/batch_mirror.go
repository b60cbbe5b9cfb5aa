package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Helpers the offset-preserving mirror needs beyond the header view in
// batch.go: reading the type of a transaction marker, and building and
// recognising the filler batches that keep the standby's offsets equal to the
// source's where the source log holds no data record.

// Control record types, the "type" field of a control record's key.
const (
	ControlAbort  int16 = 0
	ControlCommit int16 = 1
)

// ErrBadRecord means a record inside an uncompressed batch could not be
// parsed.
var ErrBadRecord = errors.New("protocol: malformed record")

// FillerKey is the key of every record in a filler batch. It starts with a
// NUL byte so that it cannot be mistaken for a printable application key.
var FillerKey = []byte("\x00ferry.filler")

// FillerTimestamp is the base and max timestamp of a filler batch (and so the
// timestamp of each of its records): -1, "no timestamp", which the broker
// accepts under any timestamp bound.
const FillerTimestamp int64 = -1

// firstRecordKey returns the key of the first record of an uncompressed
// batch, or ok=false if the batch is compressed, empty or malformed.
func firstRecordKey(b Batch) (key []byte, ok bool) {
	if b.Compression() != CompressionNone || b.NumRecords() < 1 {
		return nil, false
	}
	p := b.Payload()
	var n int
	// length, attributes, timestampDelta, offsetDelta, keyLength
	if _, n = binary.Varint(p); n <= 0 {
		return nil, false
	}
	p = p[n:]
	if len(p) < 1 {
		return nil, false
	}
	p = p[1:]
	for range 2 {
		if _, n = binary.Varint(p); n <= 0 {
			return nil, false
		}
		p = p[n:]
	}
	kl, n := binary.Varint(p)
	if n <= 0 || kl < 0 || int64(len(p)-n) < kl {
		return nil, false
	}
	return p[n : n+int(kl)], true
}

// ControlType returns the type (ControlAbort or ControlCommit) of a control
// batch's marker record. Control batches are written uncompressed by the
// broker.
func ControlType(b Batch) (int16, error) {
	if !b.IsControl() {
		return 0, fmt.Errorf("%w: not a control batch", ErrBadRecord)
	}
	key, ok := firstRecordKey(b)
	if !ok || len(key) < 4 {
		return 0, fmt.Errorf("%w: control batch at offset %d has no readable marker key", ErrBadRecord, b.BaseOffset())
	}
	return int16(binary.BigEndian.Uint16(key[2:])), nil
}

// IsFillerBatch reports whether b is a filler batch written by Ferry's
// mirror: an uncompressed batch with a producer ID, FillerTimestamp as its
// timestamps and FillerKey as its first record's key.
func IsFillerBatch(b Batch) bool {
	if b.IsControl() || b.ProducerID() < 0 || b.BaseTimestamp() != FillerTimestamp || b.MaxTimestamp() != FillerTimestamp {
		return false
	}
	key, ok := firstRecordKey(b)
	return ok && bytes.Equal(key, FillerKey)
}

// AppendFillerBatch appends an uncompressed filler batch of n records to dst
// at base offset 0 and returns the extended slice. Every record has the key
// FillerKey, a null value (a tombstone) and no headers; the batch's
// timestamps are FillerTimestamp. The CRC is set.
func AppendFillerBatch(dst []byte, n int32, producerID int64, epoch int16, baseSequence int32, transactional bool) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, BatchHeaderSize)...)
	var rec []byte
	for i := int32(0); i < n; i++ {
		rec = rec[:0]
		rec = append(rec, 0)                     // attributes
		rec = binary.AppendVarint(rec, 0)        // timestampDelta
		rec = binary.AppendVarint(rec, int64(i)) // offsetDelta
		rec = binary.AppendVarint(rec, int64(len(FillerKey)))
		rec = append(rec, FillerKey...)
		rec = binary.AppendVarint(rec, -1) // null value
		rec = binary.AppendVarint(rec, 0)  // no headers
		dst = binary.AppendVarint(dst, int64(len(rec)))
		dst = append(dst, rec...)
	}
	b := Batch(dst[start:])
	binary.BigEndian.PutUint32(b[offBatchLength:], uint32(len(b)-batchLengthPrefix))
	binary.BigEndian.PutUint32(b[offPartitionLeaderEpoch:], 0xffffffff)
	b[offMagic] = byte(BatchMagic)
	var attrs int16
	if transactional {
		attrs |= BatchAttrTransactional
	}
	b.SetAttributes(attrs)
	binary.BigEndian.PutUint32(b[offLastOffsetDelta:], uint32(n-1))
	ts := FillerTimestamp
	binary.BigEndian.PutUint64(b[offBaseTimestamp:], uint64(ts))
	binary.BigEndian.PutUint64(b[offMaxTimestamp:], uint64(ts))
	b.SetProducer(producerID, epoch, baseSequence)
	binary.BigEndian.PutUint32(b[offRecordCount:], uint32(n))
	b.UpdateCRC()
	return dst
}

// HasConsecutiveOffsets reports whether the batch's record count matches its
// offset range (LastOffsetDelta+1), which a broker requires of a batch a
// client produces. Batches the log cleaner rewrote may hold fewer records
// than their range.
func (b Batch) HasConsecutiveOffsets() bool {
	return int64(b.NumRecords()) == int64(b.LastOffsetDelta())+1
}
