package protocol

import (
	"bytes"
	"errors"
	"testing"
)

// addBatchSeeds seeds f with every fixture blob, every single batch in them,
// and a few cut and broken variants.
func addBatchSeeds(f *testing.F) {
	for _, fx := range allFixtures() {
		blob := loadFixture(f, fx)
		f.Add(blob)
		f.Add(blob[:len(blob)-7])
		for _, b := range walkAll(f, blob) {
			f.Add([]byte(b))
		}
	}
	f.Add([]byte{})
	f.Add([]byte(newTestBatch(0)))
	f.Add(withBadMagic(newTestBatch(3)))
}

// FuzzParseBatch checks that ParseBatch never panics, fails only with its
// sentinels, and that any batch it accepts round-trips every settable field.
func FuzzParseBatch(f *testing.F) {
	addBatchSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		data = bytes.Clone(data) // the round trip writes into the batch
		b, rest, err := ParseBatch(data)
		if err != nil {
			if err != ErrShortBatch && err != ErrBadMagic && err != ErrBadLength {
				t.Fatalf("unexpected error %v", err)
			}
			if b != nil || len(rest) != len(data) {
				t.Fatalf("on error: batch of %d bytes, %d of %d bytes left", len(b), len(rest), len(data))
			}
			return
		}
		if len(b)+len(rest) != len(data) || int64(len(b)) != 12+int64(b.BatchLength()) || b.Magic() != BatchMagic {
			t.Fatalf("batch %d bytes (length field %d) + %d left of %d", len(b), b.BatchLength(), len(rest), len(data))
		}
		roundTrip(t, b)
	})
}

// FuzzWalkBatches checks that WalkBatches never panics, visits batches that
// tile the input from its start, ends quietly or with a parse error, and that
// every batch it visits round-trips.
func FuzzWalkBatches(f *testing.F) {
	addBatchSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		data = bytes.Clone(data)
		pos := 0
		err := WalkBatches(data, func(b Batch) error {
			if &b[0] != &data[pos] {
				t.Fatalf("batch at byte %d does not follow the previous one", pos)
			}
			pos += len(b)
			roundTrip(t, b)
			return nil
		})
		tail := data[pos:]
		switch {
		case err == nil:
			if len(tail) > 0 {
				if _, _, perr := ParseBatch(tail); perr != ErrShortBatch {
					t.Fatalf("walk ended quietly before %d bytes that parse as %v", len(tail), perr)
				}
			}
		case errors.Is(err, ErrBadMagic) || errors.Is(err, ErrBadLength):
			if _, _, perr := ParseBatch(tail); !errors.Is(err, perr) {
				t.Fatalf("walk error %v, but the tail parses as %v", err, perr)
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
	})
}

// roundTrip sets every settable field of b, reads each back, checks that the
// bytes nothing set are unchanged, and that UpdateCRC makes b valid.
func roundTrip(t *testing.T, b Batch) {
	t.Helper()
	before := bytes.Clone(b)
	nextDelta := b.NextOffset() - b.BaseOffset()

	b.SetBaseOffset(^b.BaseOffset())
	b.SetPartitionLeaderEpoch(^b.PartitionLeaderEpoch())
	if b.BaseOffset() != ^Batch(before).BaseOffset() || b.PartitionLeaderEpoch() != ^Batch(before).PartitionLeaderEpoch() {
		t.Fatalf("base offset %d / epoch %d did not round-trip", b.BaseOffset(), b.PartitionLeaderEpoch())
	}
	if b.NextOffset()-b.BaseOffset() != nextDelta {
		t.Fatalf("NextOffset moved relative to BaseOffset")
	}
	if !bytes.Equal(b[offMagic:], before[offMagic:]) {
		t.Fatalf("fields outside the CRC touched the bytes after them")
	}
	crcBefore := b.CRC()
	origValid := Batch(before).CheckCRC() == nil

	attrs := b.Attributes() ^ 0x5a5a
	id, epoch, seq := ^b.ProducerID(), ^b.ProducerEpoch(), ^b.BaseSequence()
	b.SetAttributes(attrs)
	b.SetProducer(id, epoch, seq)
	if b.Attributes() != attrs || b.ProducerID() != id || b.ProducerEpoch() != epoch || b.BaseSequence() != seq {
		t.Fatalf("attributes/producer did not round-trip")
	}
	if b.CRC() != crcBefore {
		t.Fatalf("a setter wrote the CRC")
	}
	if origValid && b.CheckCRC() == nil {
		t.Fatalf("CRC still valid after changing covered fields")
	}
	if !bytes.Equal(b.Payload(), before[BatchHeaderSize:]) ||
		!bytes.Equal(b[offLastOffsetDelta:offProducerID], before[offLastOffsetDelta:offProducerID]) ||
		!bytes.Equal(b[offRecordCount:BatchHeaderSize], before[offRecordCount:BatchHeaderSize]) {
		t.Fatalf("setters touched fields they do not own")
	}

	b.UpdateCRC()
	if err := b.CheckCRC(); err != nil {
		t.Fatal(err)
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	if b.ComputeCRC() != b.CRC() {
		t.Fatalf("ComputeCRC %#x != CRC %#x", b.ComputeCRC(), b.CRC())
	}
}
