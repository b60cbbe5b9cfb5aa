package protocol

import "encoding/binary"

// What the record batches of a Fetch answer need on their way from a broker
// to a client, whether the answer is rewritten in a buffer (RewriteRecords)
// or as it streams (StreamFetchResponse): each batch's partition leader
// epoch made virtual (a header field outside the CRC), and the mirror's
// filler batches hidden. Both keep the records' size, so a streamed answer,
// whose sizes left before its records, is rewritten as an answer in a
// buffer is, to the same bytes.

// BatchRewrite says what each record batch of an answer needs.
type BatchRewrite struct {
	// Epoch maps a batch's partition leader epoch; nil leaves it.
	Epoch func(int32) int32
	// HideFillers empties filler batches (IsFillerBatch): the answer comes
	// from a cluster the mirror may have written into.
	HideFillers bool
	// Hidden, if set, is called for each filler hidden.
	Hidden func()
}

// Needed reports whether r changes anything.
func (r BatchRewrite) Needed() bool { return r.Epoch != nil || r.HideFillers }

// header rewrites a complete batch header in place.
func (r BatchRewrite) header(h Batch) {
	if r.Epoch != nil {
		h.SetPartitionLeaderEpoch(r.Epoch(h.PartitionLeaderEpoch()))
	}
}

// fillerProbe is how many bytes from a batch's start IsFillerBatch reads of
// a filler: the header, then the first record up to the end of its key.
const fillerProbe = BatchHeaderSize + 4*binary.MaxVarintLen32 + 1 + len("\x00ferry.filler")

// maybeFiller tells from its header alone whether a batch may be a filler
// (IsFillerBatch's checks before the first record's key). Clients give
// their batches real timestamps, so nearly every batch is ruled out here.
func maybeFiller(h Batch) bool {
	return !h.IsControl() && h.Compression() == CompressionNone && h.NumRecords() > 0 &&
		h.BaseTimestamp() == FillerTimestamp && h.MaxTimestamp() == FillerTimestamp && h.ProducerID() >= 0
}

// emptyHeader turns a batch header into an emptied batch's (AppendEmptied):
// no records, the same offsets, a fresh CRC.
func emptyHeader(h Batch) {
	binary.BigEndian.PutUint32(h[offBatchLength:], uint32(BatchHeaderSize-batchLengthPrefix))
	binary.BigEndian.PutUint32(h[offRecordCount:], 0)
	h[:BatchHeaderSize].UpdateCRC()
}

// putPad fills the bytes freed by hidden fillers with the start of a batch
// that claims more bytes than follow it (rest of them): clients stop there,
// as at the partial batch a broker may end an answer with. nextOffset is
// the offset after the last batch before it. A filler's records take at
// least 18 bytes, so a pad holds a batch's length and magic.
func putPad(pad []byte, rest int, nextOffset int64) {
	clear(pad)
	if len(pad) <= offMagic {
		return
	}
	binary.BigEndian.PutUint64(pad, uint64(nextOffset))
	// At least a batch header's worth too: Java refuses a batch length
	// below 14 as corrupt.
	binary.BigEndian.PutUint32(pad[offBatchLength:], uint32(min(int64(len(pad)+rest+BatchHeaderSize), 1<<31-1)))
	pad[offMagic] = byte(BatchMagic)
}

// RewriteRecords applies r to a partition's records in place and returns
// how many filler batches it hid. The records keep their length: a hidden
// filler keeps its header, emptied (its offsets are still stepped over, so
// a reader does not stall before them), the batches after it move up, and
// the bytes its records took are left after the last complete batch as one
// that never completes (putPad). What follows the pad (a trailing partial
// batch, bytes that are no v2 batch) is not read by clients.
func RewriteRecords(records []byte, r BatchRewrite) (hidden int) {
	if !r.Needed() {
		return 0
	}
	w, rd := 0, 0 // write and read positions
	next := int64(-1)
	for rd < len(records) {
		b, _, err := ParseBatch(records[rd:])
		if err != nil {
			break
		}
		n := len(b)
		filler := r.HideFillers && maybeFiller(b) && IsFillerBatch(b)
		if w != rd {
			copy(records[w:], b) // b is read before it is overwritten
		}
		h := Batch(records[w : w+n])
		r.header(h)
		next = h.NextOffset()
		rd += n
		if filler {
			emptyHeader(h)
			hidden++
			if r.Hidden != nil {
				r.Hidden()
			}
			w += BatchHeaderSize
		} else {
			w += n
		}
	}
	if w == rd {
		return hidden
	}
	// The rest (a partial batch, or what could not be parsed) stays where
	// it is, after the pad, where no client reads it.
	putPad(records[w:rd], len(records)-rd, next)
	return hidden
}
