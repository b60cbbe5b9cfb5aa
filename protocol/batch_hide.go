package protocol

import (
	"encoding/binary"
	"errors"
)

// AppendEmptied appends a copy of b without its records: the same base
// offset, last offset delta, producer fields and attributes, a record count
// of 0, and a fresh CRC. Clients step over an empty batch to its next
// offset (the log cleaner leaves such batches too), so it hides a batch's
// records without leaving the reader stuck before its offsets.
func AppendEmptied(dst []byte, b Batch) []byte {
	start := len(dst)
	dst = append(dst, b[:BatchHeaderSize]...)
	e := Batch(dst[start:])
	binary.BigEndian.PutUint32(e[8:], uint32(BatchHeaderSize-12)) // batchLength
	binary.BigEndian.PutUint32(e[57:], 0)                         // recordCount
	e.UpdateCRC()
	return dst
}

// HideFillers returns records with every filler batch (IsFillerBatch)
// emptied, and whether there were any. Records without fillers are returned
// as they are, without copying.
func HideFillers(records []byte) ([]byte, bool) {
	if !HasFillers(records) {
		return records, false
	}
	out := make([]byte, 0, len(records))
	rest := records
	for len(rest) > 0 {
		b, r, err := ParseBatch(rest)
		if err != nil {
			out = append(out, rest...) // a trailing partial batch, as it came
			break
		}
		if IsFillerBatch(b) {
			out = AppendEmptied(out, b)
		} else {
			out = append(out, b...)
		}
		rest = r
	}
	return out, true
}

// HasFillers reports whether records hold a filler batch, by batch header
// (and, for candidates, the first record's key) only.
func HasFillers(records []byte) bool {
	found := false
	WalkBatches(records, func(b Batch) error {
		if IsFillerBatch(b) {
			found = true
			return errFound
		}
		return nil
	})
	return found
}

var errFound = errors.New("found")
