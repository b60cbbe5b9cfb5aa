package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// A RecordBatch (magic v2) header, big-endian, as Kafka lays it out:
//
//	offset  size  field                 covered by CRC
//	     0     8  baseOffset            no
//	     8     4  batchLength           no   (bytes after this field)
//	    12     4  partitionLeaderEpoch  no
//	    16     1  magic                 no
//	    17     4  crc                   no   (CRC32C of bytes [21:])
//	    21     2  attributes            yes
//	    23     4  lastOffsetDelta       yes
//	    27     8  baseTimestamp         yes
//	    35     8  maxTimestamp          yes
//	    43     8  producerId            yes
//	    51     2  producerEpoch         yes
//	    53     4  baseSequence          yes
//	    57     4  recordCount           yes
//	    61        records               yes
//
// Only these fields are read or written here; the records themselves
// (compressed or not) are never decoded.
const (
	offBaseOffset           = 0
	offBatchLength          = 8
	offPartitionLeaderEpoch = 12
	offMagic                = 16
	offCRC                  = 17
	offAttributes           = 21
	offLastOffsetDelta      = 23
	offBaseTimestamp        = 27
	offMaxTimestamp         = 35
	offProducerID           = 43
	offProducerEpoch        = 51
	offBaseSequence         = 53
	offRecordCount          = 57

	// batchLengthPrefix is the part of a batch that batchLength does not
	// count: baseOffset and batchLength itself.
	batchLengthPrefix = 12
)

// BatchHeaderSize is the size of a v2 RecordBatch header: the records of a
// batch start at this offset.
const BatchHeaderSize = 61

// BatchMagic is the only RecordBatch format version Ferry handles.
const BatchMagic int8 = 2

// Bits of a RecordBatch's attributes.
const (
	BatchAttrCompressionMask int16 = 0x07 // bits 0-2: Compression* codec
	BatchAttrLogAppendTime   int16 = 0x08 // bit 3: timestamps set by the broker
	BatchAttrTransactional   int16 = 0x10 // bit 4: part of a transaction
	BatchAttrControl         int16 = 0x20 // bit 5: a transaction marker
	BatchAttrDeleteHorizon   int16 = 0x40 // bit 6: baseTimestamp is the delete horizon
)

// Compression codecs, as stored in the low bits of a batch's attributes.
const (
	CompressionNone   int8 = 0
	CompressionGzip   int8 = 1
	CompressionSnappy int8 = 2
	CompressionLZ4    int8 = 3
	CompressionZstd   int8 = 4
)

var (
	// ErrShortBatch means the bytes end before the batch does: fewer than
	// the batch's 12+batchLength bytes are present. A Fetch response may
	// legitimately end in such a partial batch.
	ErrShortBatch = errors.New("protocol: record batch truncated")

	// ErrBadMagic means the batch is not a v2 RecordBatch (magic byte 2);
	// message sets of format v0 and v1 are not handled.
	ErrBadMagic = errors.New("protocol: record batch magic is not 2")

	// ErrBadLength means the batchLength field is smaller than a v2 header,
	// or disagrees with the number of bytes the batch occupies.
	ErrBadLength = errors.New("protocol: record batch length invalid")

	// ErrBadCRC means the CRC32C stored in the batch does not match the
	// checksum of its attributes, header fields and records.
	ErrBadCRC = errors.New("protocol: record batch CRC mismatch")
)

// castagnoli is the CRC32C table; crc32 uses the CPU's instructions for it
// where there are some.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Batch is a zero-copy view of exactly one v2 RecordBatch: len(b) is
// 12+BatchLength. Getters read the header in place and setters write it in
// place; neither allocates. Obtain a Batch from ParseBatch or WalkBatches:
// the accessors assume at least BatchHeaderSize bytes.
//
// Fields covered by the CRC (everything from the attributes on) leave the
// batch with a stale CRC when set; call UpdateCRC after the last of them.
// BaseOffset and PartitionLeaderEpoch are outside the CRC.
type Batch []byte

// ParseBatch splits the first RecordBatch off b and returns it with the
// bytes that follow it. It checks the magic byte and the batch length, not
// the CRC (see Validate). When b ends before its first batch does, as a
// Fetch response may, it returns ErrShortBatch.
//
// The returned Batch shares memory with b, and its capacity is cut at its
// end so that appending to it cannot overwrite the rest.
func ParseBatch(b []byte) (Batch, []byte, error) {
	if len(b) < batchLengthPrefix {
		return nil, b, ErrShortBatch
	}
	// The magic byte is at the same offset in the old message formats,
	// so it is checked first: their length field means something else.
	if len(b) > offMagic && int8(b[offMagic]) != BatchMagic {
		return nil, b, ErrBadMagic
	}
	n := int32(binary.BigEndian.Uint32(b[offBatchLength:]))
	if n < BatchHeaderSize-batchLengthPrefix {
		return nil, b, ErrBadLength
	}
	total := batchLengthPrefix + int64(n)
	if int64(len(b)) < total {
		return nil, b, ErrShortBatch
	}
	return Batch(b[:total:total]), b[total:], nil
}

// WalkBatches calls fn for each RecordBatch in records, in order, and stops
// at the first error fn returns, returning it unchanged. A trailing partial
// batch ends the walk quietly (Fetch responses may end mid-batch). A batch
// that cannot be parsed ends it with an error wrapping ErrBadMagic or
// ErrBadLength that gives the batch's byte position.
func WalkBatches(records []byte, fn func(Batch) error) error {
	pos := 0
	for len(records) > 0 {
		b, rest, err := ParseBatch(records)
		if err != nil {
			if err == ErrShortBatch {
				return nil
			}
			return fmt.Errorf("record batch at byte %d: %w", pos, err)
		}
		if err := fn(b); err != nil {
			return err
		}
		pos += len(b)
		records = rest
	}
	return nil
}

// BaseOffset is the offset of the batch's first record.
func (b Batch) BaseOffset() int64 { return int64(binary.BigEndian.Uint64(b[offBaseOffset:])) }

// SetBaseOffset sets the offset of the batch's first record. The field is
// outside the CRC.
func (b Batch) SetBaseOffset(offset int64) {
	binary.BigEndian.PutUint64(b[offBaseOffset:], uint64(offset))
}

// LastOffsetDelta is the offset of the batch's last record relative to
// BaseOffset. After compaction it may exceed NumRecords-1.
func (b Batch) LastOffsetDelta() int32 {
	return int32(binary.BigEndian.Uint32(b[offLastOffsetDelta:]))
}

// NextOffset is the offset just past the batch: BaseOffset +
// LastOffsetDelta + 1.
func (b Batch) NextOffset() int64 { return b.BaseOffset() + int64(b.LastOffsetDelta()) + 1 }

// BatchLength is the batchLength field: the size of the batch after the
// field itself, so len(b) == 12 + BatchLength for a valid batch.
func (b Batch) BatchLength() int32 { return int32(binary.BigEndian.Uint32(b[offBatchLength:])) }

// PartitionLeaderEpoch is the leader epoch stamped by the broker that
// appended the batch.
func (b Batch) PartitionLeaderEpoch() int32 {
	return int32(binary.BigEndian.Uint32(b[offPartitionLeaderEpoch:]))
}

// SetPartitionLeaderEpoch sets the partition leader epoch. The field is
// outside the CRC.
func (b Batch) SetPartitionLeaderEpoch(epoch int32) {
	binary.BigEndian.PutUint32(b[offPartitionLeaderEpoch:], uint32(epoch))
}

// Magic is the format version, 2 for every batch ParseBatch accepts.
func (b Batch) Magic() int8 { return int8(b[offMagic]) }

// CRC is the checksum stored in the batch.
func (b Batch) CRC() uint32 { return binary.BigEndian.Uint32(b[offCRC:]) }

// ComputeCRC computes the CRC32C (Castagnoli) of the batch from its
// attributes to its end, the value CRC should hold.
func (b Batch) ComputeCRC() uint32 { return crc32.Checksum(b[offAttributes:], castagnoli) }

// CheckCRC returns an error wrapping ErrBadCRC if the stored CRC does not
// match the computed one.
func (b Batch) CheckCRC() error {
	if stored, computed := b.CRC(), b.ComputeCRC(); stored != computed {
		return fmt.Errorf("%w: stored %#08x, computed %#08x", ErrBadCRC, stored, computed)
	}
	return nil
}

// UpdateCRC stores the computed CRC, making the batch consistent after its
// attributes, producer fields or records were changed.
func (b Batch) UpdateCRC() { binary.BigEndian.PutUint32(b[offCRC:], b.ComputeCRC()) }

// Attributes is the batch's attribute bits (see the BatchAttr* constants).
func (b Batch) Attributes() int16 { return int16(binary.BigEndian.Uint16(b[offAttributes:])) }

// SetAttributes sets the attribute bits. The field is covered by the CRC:
// call UpdateCRC afterwards.
func (b Batch) SetAttributes(attrs int16) {
	binary.BigEndian.PutUint16(b[offAttributes:], uint16(attrs))
}

// Compression is the codec of the records (one of the Compression*
// constants, or an unknown value up to 7).
func (b Batch) Compression() int8 { return int8(b.Attributes() & BatchAttrCompressionMask) }

// HasLogAppendTime reports whether the broker set the batch's timestamps.
func (b Batch) HasLogAppendTime() bool { return b.Attributes()&BatchAttrLogAppendTime != 0 }

// IsTransactional reports whether the batch belongs to a transaction.
func (b Batch) IsTransactional() bool { return b.Attributes()&BatchAttrTransactional != 0 }

// IsControl reports whether the batch is a control batch (a transaction
// commit or abort marker).
func (b Batch) IsControl() bool { return b.Attributes()&BatchAttrControl != 0 }

// HasDeleteHorizon reports whether BaseTimestamp holds the delete horizon
// the log cleaner set.
func (b Batch) HasDeleteHorizon() bool { return b.Attributes()&BatchAttrDeleteHorizon != 0 }

// BaseTimestamp is the timestamp that record timestamp deltas are relative to
// (or the delete horizon, see HasDeleteHorizon).
func (b Batch) BaseTimestamp() int64 { return int64(binary.BigEndian.Uint64(b[offBaseTimestamp:])) }

// MaxTimestamp is the largest timestamp in the batch.
func (b Batch) MaxTimestamp() int64 { return int64(binary.BigEndian.Uint64(b[offMaxTimestamp:])) }

// ProducerID is the idempotent or transactional producer's ID, -1 for none.
func (b Batch) ProducerID() int64 { return int64(binary.BigEndian.Uint64(b[offProducerID:])) }

// ProducerEpoch is the producer's epoch, -1 for none.
func (b Batch) ProducerEpoch() int16 { return int16(binary.BigEndian.Uint16(b[offProducerEpoch:])) }

// BaseSequence is the sequence number of the batch's first record, -1 for
// none.
func (b Batch) BaseSequence() int32 { return int32(binary.BigEndian.Uint32(b[offBaseSequence:])) }

// SetProducer sets the producer ID, producer epoch and base sequence. These
// fields are covered by the CRC: call UpdateCRC afterwards.
func (b Batch) SetProducer(id int64, epoch int16, baseSequence int32) {
	binary.BigEndian.PutUint64(b[offProducerID:], uint64(id))
	binary.BigEndian.PutUint16(b[offProducerEpoch:], uint16(epoch))
	binary.BigEndian.PutUint32(b[offBaseSequence:], uint32(baseSequence))
}

// NumRecords is the recordCount field: the number of records in the batch.
func (b Batch) NumRecords() int32 { return int32(binary.BigEndian.Uint32(b[offRecordCount:])) }

// Payload is the records after the header, compressed as Compression says.
// It shares memory with b.
func (b Batch) Payload() []byte { return b[BatchHeaderSize:] }

// Validate checks that b is a complete v2 batch: magic 2, a batchLength that
// matches len(b) and fits a header, and a matching CRC. The errors wrap
// ErrShortBatch, ErrBadMagic, ErrBadLength or ErrBadCRC.
func (b Batch) Validate() error {
	if len(b) < BatchHeaderSize {
		return fmt.Errorf("%w: %d bytes, a header alone is %d", ErrShortBatch, len(b), BatchHeaderSize)
	}
	if m := b.Magic(); m != BatchMagic {
		return fmt.Errorf("%w: magic %d", ErrBadMagic, m)
	}
	if n := b.BatchLength(); int64(n)+batchLengthPrefix != int64(len(b)) {
		return fmt.Errorf("%w: batchLength %d, batch is %d bytes", ErrBadLength, n, len(b))
	}
	return b.CheckCRC()
}
