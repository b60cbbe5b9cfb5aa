package protocol

import (
	"testing"
)

func TestHideFillers(t *testing.T) {
	var blob []byte
	// A filler batch of 5 records between two real batches.
	real1 := AppendFillerBatch(nil, 2, 7, 0, 0, false)
	Batch(real1).SetProducer(-1, -1, -1) // not a filler: no producer ID
	Batch(real1).UpdateCRC()
	filler := AppendFillerBatch(nil, 5, 9, 0, 0, true)
	Batch(filler).SetBaseOffset(2)
	real2 := append([]byte(nil), real1...)
	Batch(real2).SetBaseOffset(7)
	blob = append(append(append(blob, real1...), filler...), real2...)

	out, changed := HideFillers(blob)
	if !changed {
		t.Fatal("filler not found")
	}
	var got []Batch
	if err := WalkBatches(out, func(b Batch) error { got = append(got, b); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d batches, want 3", len(got))
	}
	e := got[1]
	if e.NumRecords() != 0 || e.BaseOffset() != 2 || e.NextOffset() != 7 || e.ProducerID() != 9 || !e.IsTransactional() || len(e) != BatchHeaderSize {
		t.Fatalf("emptied filler: records %d base %d next %d pid %d txn %v len %d", e.NumRecords(), e.BaseOffset(), e.NextOffset(), e.ProducerID(), e.IsTransactional(), len(e))
	}
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	if got[2].BaseOffset() != 7 || got[0].NumRecords() != 2 {
		t.Fatal("real batches changed")
	}
	if same, changed := HideFillers(real1); changed || &same[0] != &real1[0] {
		t.Fatal("a blob without fillers must come back as it is")
	}
}
