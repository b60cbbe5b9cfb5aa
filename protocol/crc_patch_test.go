package protocol

import (
	"math/rand/v2"
	"testing"
)

// TestPatchCRC: for batches of every size from an empty body to 300 KiB,
// and every header field a rewrite changes, alone and together, the
// patched CRC is the one computed over the whole batch; and it is found
// with the body's bytes gone (overwritten after the header was saved).
func TestPatchCRC(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	sizes := []int{0, 1, 7, 61, 1000, 4096, 32 << 10, 300 << 10}
	for i := 0; i < 200; i++ {
		sizes = append(sizes, rng.IntN(70<<10))
	}
	for _, n := range sizes {
		b := newTestBatch(n)
		b.UpdateCRC()
		old := append([]byte(nil), b[:BatchHeaderSize]...)
		switch rng.IntN(4) {
		case 0:
			b.SetProducer(rng.Int64(), int16(rng.Uint32()), int32(rng.Uint32()))
		case 1:
			b.SetAttributes(int16(rng.Uint32()))
		case 2:
			b.SetProducer(b.ProducerID()+1, b.ProducerEpoch(), b.BaseSequence())
		default:
			b.SetProducer(rng.Int64(), int16(rng.Uint32()), int32(rng.Uint32()))
			b.SetAttributes(int16(rng.Uint32()))
			b.SetBaseOffset(rng.Int64()) // outside the CRC
			b.SetPartitionLeaderEpoch(int32(rng.Uint32()))
		}
		want := b.ComputeCRC()
		b.PatchCRC(old)
		if got := b.CRC(); got != want {
			t.Fatalf("body of %d bytes: patched CRC %08x, computed %08x", n, got, want)
		}
		// Unchanged: the CRC stays.
		again := append([]byte(nil), b[:BatchHeaderSize]...)
		b.PatchCRC(again)
		if b.CRC() != want {
			t.Fatalf("body of %d bytes: a header patched against itself changed the CRC", n)
		}
	}
	// Without the body: the header alone, in a buffer whose body bytes
	// are stale, patches to what the whole batch computes.
	b := newTestBatch(100 << 10)
	old := append([]byte(nil), b[:BatchHeaderSize]...)
	b.SetProducer(42, 3, 1000)
	want := b.ComputeCRC()
	stale := append(Batch(nil), b...)
	for i := BatchHeaderSize; i < len(stale); i++ {
		stale[i] = 0xEE
	}
	stale.PatchCRC(old)
	if stale.CRC() != want {
		t.Fatalf("patched without the body: %08x, want %08x", stale.CRC(), want)
	}
	// A batch whose CRC was wrong stays wrong.
	bad := newTestBatch(5000)
	bad[offCRC] ^= 1
	old = append([]byte(nil), bad[:BatchHeaderSize]...)
	bad.SetProducer(7, 7, 7)
	bad.PatchCRC(old)
	if bad.CheckCRC() == nil {
		t.Fatal("a batch with a wrong CRC was patched right")
	}
}

func BenchmarkPatchCRC(b *testing.B) {
	batch := newTestBatch(256 << 10)
	old := append([]byte(nil), batch[:BatchHeaderSize]...)
	b.Run("patch", func(b *testing.B) {
		for b.Loop() {
			batch.PatchCRC(old)
		}
	})
	b.Run("update", func(b *testing.B) {
		for b.Loop() {
			batch.UpdateCRC()
		}
	})
}
