package protocol

import (
	"bytes"
	"testing"
)

func TestRewriteRecordsHidesFillers(t *testing.T) {
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

	out := bytes.Clone(blob)
	if n := RewriteRecords(out, BatchRewrite{HideFillers: true}); n != 1 {
		t.Fatalf("%d fillers hidden, want 1", n)
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
	if !bytes.Equal(got[0], real1) || !bytes.Equal(got[2], real2) {
		t.Fatal("real batches changed")
	}
	// The pad after them claims more than is left: a reader stops there.
	pad := out[len(real1)+BatchHeaderSize+len(real2):]
	if len(pad) != len(filler)-BatchHeaderSize {
		t.Fatalf("pad of %d bytes, the filler's records took %d", len(pad), len(filler)-BatchHeaderSize)
	}
	if _, _, err := ParseBatch(pad); err != ErrShortBatch {
		t.Fatalf("the pad parses as %v, want a partial batch", err)
	}
	same := bytes.Clone(real1)
	if RewriteRecords(same, BatchRewrite{HideFillers: true}); !bytes.Equal(same, real1) {
		t.Fatal("records without fillers must stay as they are")
	}
	if RewriteRecords(same, BatchRewrite{}); !bytes.Equal(same, real1) {
		t.Fatal("an empty rewrite changed the records")
	}
}
