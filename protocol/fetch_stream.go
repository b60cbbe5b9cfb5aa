package protocol

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
)

// Streaming a Fetch response from a broker to a client. The small fields
// around the records are read through src's buffer, rewritten like
// WalkFetchResponse's windows, and written to dst; the records themselves,
// nearly all of the bytes, are handed to a function that can move them
// from socket to socket without reading them (splice(2)). A streamed
// response keeps its size: every rewrite is in place.

// FetchStreamHooks are the rewrites and the record mover of
// StreamFetchResponse. Windows in the FetchTopic and FetchPartition passed
// to the hooks are valid only during the call.
type FetchStreamHooks struct {
	// Topic is called before a topic's partitions; it may rewrite t.ID.
	Topic func(t *FetchTopic)
	// Head is called for each partition before its records, with
	// p.Records nil and no tagged windows; it may rewrite
	// p.PreferredReadReplica.
	Head func(t *FetchTopic, p *FetchPartition)
	// Tail is called after each partition's tagged fields were read, with
	// the Head fields repeated and p.Records nil; it may rewrite
	// p.DivergingEpoch and p.CurrentLeader.
	Tail func(t *FetchTopic, p *FetchPartition)
	// Records moves the next n record bytes from src's underlying reader
	// to dst's underlying writer; src's buffer is empty when it is called,
	// and dst may hold bytes it must flush first. Nil copies through the
	// buffers, as does a run shorter than MinRecords.
	Records    func(n int64) error
	MinRecords int64
	// Batches is what each record batch needs (BatchRewrite). When it
	// changes anything, each batch's header is read through the buffers
	// and rewritten, and only the rest of the batch goes to Records.
	Batches BatchRewrite
}

// FetchPaddingTag replaces the tag of KIP-951 node endpoints (top-level tag
// 0) in a streamed response: the endpoints name physical brokers and cannot
// be rewritten in place (their size would change), so their bytes are
// zeroed under a tag number no Fetch version defines, which clients skip.
// The partitions' leader hints still name a virtual broker the client
// knows from Metadata.
const FetchPaddingTag = 127

// StreamFetchResponse copies the rest of a Fetch response of the given
// version (v4 and up) after its correlation ID — size bytes, response
// header tags included — from src to dst, through the hooks. src must not
// hold bytes beyond the response. It returns the top-level error code.
func StreamFetchResponse(src *bufio.Reader, dst *bufio.Writer, version int16, size int64, h FetchStreamHooks) (errorCode int16, err error) {
	if version < 4 {
		return 0, fmt.Errorf("%w: Fetch v%d is not streamed", ErrMalformedResponse, version)
	}
	s := streams.Get().(*fetchStream)
	*s = fetchStream{src: src, dst: dst, left: size, buf: s.buf[:0], tagAt: s.tagAt[:0]}
	defer func() {
		s.src, s.dst = nil, nil
		if cap(s.buf) <= 64<<10 { // an outsized one is not kept
			streams.Put(s)
		}
	}()
	flex := version >= 12
	if flex {
		s.tags(nil) // response header
	}
	s.take(4) // throttle
	if version >= 7 {
		if w := s.window(s.take(2), 2); w != nil {
			errorCode = int16(binary.BigEndian.Uint16(w))
		}
		s.take(4) // session ID
	}
	var t FetchTopic
	var p FetchPartition
	for nt := s.arrayLen(flex); nt > 0 && s.err == nil; nt-- {
		t = FetchTopic{}
		if version >= 13 {
			at := s.take(16)
			if t.ID = s.window(at, 16); t.ID != nil && h.Topic != nil {
				h.Topic(&t)
			}
		} else {
			n := s.stringLen(flex)
			at := s.take(n)
			t.Name = string(s.window(at, n))
			if s.err == nil && h.Topic != nil {
				h.Topic(&t)
			}
		}
		s.flush()
		for np := s.arrayLen(flex); np > 0 && s.err == nil; np-- {
			p = FetchPartition{}
			fixed := 30 // partition, error, high watermark, last stable and log start offsets
			if version < 5 {
				fixed = 22
			}
			if w := s.window(s.take(fixed), fixed); w != nil {
				p.Partition = int32(binary.BigEndian.Uint32(w))
				p.ErrorCode = int16(binary.BigEndian.Uint16(w[4:]))
				p.HighWatermark = int64(binary.BigEndian.Uint64(w[6:]))
				p.LastStableOffset = int64(binary.BigEndian.Uint64(w[14:]))
				if version >= 5 {
					p.LogStartOffset = int64(binary.BigEndian.Uint64(w[22:]))
				}
			}
			for na := s.arrayLen(flex); na > 0 && s.err == nil; na-- {
				s.take(16) // producer ID, first offset
				if flex {
					s.tags(nil)
				}
			}
			rr := -1
			if version >= 11 {
				rr = s.take(4)
			}
			if s.err == nil && h.Head != nil {
				p.PreferredReadReplica = s.window(rr, 4)
				h.Head(&t, &p)
			}
			s.records(flex, h.Records, h.MinRecords, h.Batches)
			if flex {
				s.tags(func(tag uint64, data []byte) {
					switch {
					case tag == 0 && len(data) >= 4:
						p.DivergingEpoch = data[:4]
					case tag == 1 && len(data) >= 8:
						p.CurrentLeader = data[:8]
					}
				})
			}
			if s.err == nil && h.Tail != nil {
				p.PreferredReadReplica = nil
				h.Tail(&t, &p)
			}
			s.flush()
		}
		if flex {
			s.tags(nil)
		}
	}
	if flex {
		endpoints := version >= 16
		s.tags(func(tag uint64, data []byte) {
			if tag == 0 && endpoints {
				clear(data)
			}
		})
		if endpoints {
			// The tag numbers were read into buf; rename there.
			s.renameTag(0, FetchPaddingTag)
		}
	}
	s.flush()
	if s.err == nil && s.left != 0 {
		s.err = fmt.Errorf("%w: %d bytes left over", ErrMalformedResponse, s.left)
	}
	return errorCode, s.err
}

// streams reuses fetchStreams, and their buffers, across responses.
var streams = sync.Pool{New: func() any { return &fetchStream{buf: make([]byte, 0, 512)} }}

// fetchStream reads a response field by field into buf, where hooks
// rewrite it, and writes buf out before records and after each partition.
type fetchStream struct {
	src  *bufio.Reader
	dst  *bufio.Writer
	left int64  // bytes of the response not yet read
	buf  []byte // read, not yet written
	err  error
	// tagAt are the positions in buf of the tag numbers of the last tags
	// call, for renameTag.
	tagAt []tagPos
	// head holds a batch header, and a filler's first record, while
	// batches rewrites it.
	head [fillerProbe]byte
}

type tagPos struct {
	at  int
	tag uint64
}

// take reads the next n bytes into buf and returns where they start, or -1.
func (s *fetchStream) take(n int) int {
	if s.err != nil {
		return -1
	}
	if n < 0 || int64(n) > s.left {
		s.err = fmt.Errorf("%w: field of %d bytes with %d left", ErrMalformedResponse, n, s.left)
		return -1
	}
	at := len(s.buf)
	s.buf = grow(s.buf, n)
	if _, err := io.ReadFull(s.src, s.buf[at:]); err != nil {
		s.err = fmt.Errorf("%w: %v", ErrMalformedResponse, err)
		s.buf = s.buf[:at]
		return -1
	}
	s.left -= int64(n)
	return at
}

// window returns n bytes of buf from at, or nil after an error.
func (s *fetchStream) window(at, n int) []byte {
	if at < 0 || s.err != nil {
		return nil
	}
	return s.buf[at : at+n]
}

func (s *fetchStream) flush() {
	if s.err == nil && len(s.buf) > 0 {
		if _, err := s.dst.Write(s.buf); err != nil {
			s.err = err
		}
	}
	s.buf = s.buf[:0]
}

func (s *fetchStream) uvarint() uint64 {
	var x uint64
	for shift := 0; shift < 35; shift += 7 {
		at := s.take(1)
		if at < 0 {
			return 0
		}
		b := s.buf[at]
		x |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return x
		}
	}
	s.err = fmt.Errorf("%w: varint too long", ErrMalformedResponse)
	return 0
}

func (s *fetchStream) arrayLen(flex bool) int {
	if flex {
		return int(s.uvarint()) - 1
	}
	if at := s.take(4); at >= 0 {
		return int(int32(binary.BigEndian.Uint32(s.buf[at:])))
	}
	return 0
}

func (s *fetchStream) stringLen(flex bool) int {
	if flex {
		return max(int(s.uvarint())-1, 0)
	}
	if at := s.take(2); at >= 0 {
		return max(int(int16(binary.BigEndian.Uint16(s.buf[at:]))), 0)
	}
	return 0
}

// tags reads a tagged-field section, calling fn with each field's data.
func (s *fetchStream) tags(fn func(tag uint64, data []byte)) {
	s.tagAt = s.tagAt[:0]
	type field struct {
		tag    uint64
		at, sz int
	}
	var fields [4]field
	seen := fields[:0]
	for n := s.uvarint(); n > 0 && s.err == nil; n-- {
		tagAt := len(s.buf)
		tag := s.uvarint()
		s.tagAt = append(s.tagAt, tagPos{tagAt, tag})
		sz := int(s.uvarint())
		at := s.take(sz)
		seen = append(seen, field{tag, at, sz})
	}
	if fn == nil || s.err != nil {
		return
	}
	// Windows are taken once buf stops growing.
	for _, f := range seen {
		fn(f.tag, s.buf[f.at:f.at+f.sz])
	}
}

// renameTag changes the number of a tag of the last tags call, when both
// numbers take one byte.
func (s *fetchStream) renameTag(from, to uint64) {
	if s.err != nil || from > 127 || to > 127 {
		return
	}
	for _, t := range s.tagAt {
		if t.tag == from {
			s.buf[t.at] = byte(to)
		}
	}
}

// records passes a partition's records: the length through buf, then what
// src already buffered, then the rest through move; batch by batch when
// their headers need rewriting.
func (s *fetchStream) records(flex bool, move func(int64) error, minMove int64, rw BatchRewrite) {
	var n int64
	if flex {
		n = int64(s.uvarint()) - 1
	} else if at := s.take(4); at >= 0 {
		n = int64(int32(binary.BigEndian.Uint32(s.buf[at:])))
	}
	if n <= 0 || s.err != nil {
		return
	}
	if n > s.left {
		s.err = fmt.Errorf("%w: records of %d bytes with %d left", ErrMalformedResponse, n, s.left)
		return
	}
	s.flush()
	if s.err != nil {
		return
	}
	s.left -= n
	if rw.Needed() {
		s.err = s.batches(n, rw, move, minMove)
		return
	}
	s.err = s.pass(n, move, minMove)
}

// pass passes the next n record bytes on unread: what src already buffered,
// then the rest through move, or through the buffers when it is short.
func (s *fetchStream) pass(n int64, move func(int64) error, minMove int64) error {
	k := min(n, int64(s.src.Buffered()))
	if k > 0 {
		b, _ := s.src.Peek(int(k))
		if _, err := s.dst.Write(b); err != nil {
			return err
		}
		s.src.Discard(int(k))
	}
	if rest := n - k; rest > 0 {
		if move != nil && rest >= minMove {
			return move(rest)
		}
		_, err := io.CopyN(s.dst, s.src, rest)
		return err
	}
	return nil
}

// batches passes n record bytes batch by batch: each header is read and
// rewritten as RewriteRecords would, and the rest of the batch passed on
// unread; a filler is read (it is small) and emptied, and the bytes it
// freed are written as RewriteRecords's pad after the last complete batch.
func (s *fetchStream) batches(n int64, rw BatchRewrite, move func(int64) error, minMove int64) error {
	h := s.head[:]
	var pad int64
	next := int64(-1)
	for n >= BatchHeaderSize {
		if _, err := io.ReadFull(s.src, h[:BatchHeaderSize]); err != nil {
			return fmt.Errorf("%w: %v", ErrMalformedResponse, err)
		}
		n -= BatchHeaderSize
		b := Batch(h[:BatchHeaderSize])
		length := int64(int32(binary.BigEndian.Uint32(h[offBatchLength:])))
		body := length + batchLengthPrefix - BatchHeaderSize
		if b.Magic() != BatchMagic || body < 0 || body > n {
			// A trailing partial batch, or no v2 batch: passed on as
			// it is, after the pad, where no client reads.
			if err := s.writePad(pad, n+BatchHeaderSize, next); err != nil {
				return err
			}
			if _, err := s.dst.Write(h[:BatchHeaderSize]); err != nil {
				return err
			}
			return s.pass(n, move, minMove)
		}
		rw.header(b)
		next = b.NextOffset()
		head := int64(BatchHeaderSize)
		if rw.HideFillers && maybeFiller(b) {
			probe := min(body, int64(fillerProbe-BatchHeaderSize))
			if _, err := io.ReadFull(s.src, h[BatchHeaderSize:BatchHeaderSize+probe]); err != nil {
				return fmt.Errorf("%w: %v", ErrMalformedResponse, err)
			}
			n -= probe
			if IsFillerBatch(Batch(h[:BatchHeaderSize+probe])) {
				emptyHeader(b)
				if rw.Hidden != nil {
					rw.Hidden()
				}
				if _, err := s.dst.Write(b); err != nil {
					return err
				}
				if _, err := io.CopyN(io.Discard, s.src, body-probe); err != nil {
					return fmt.Errorf("%w: %v", ErrMalformedResponse, err)
				}
				n -= body - probe
				pad += body
				continue
			}
			head += probe
		}
		if _, err := s.dst.Write(h[:head]); err != nil {
			return err
		}
		rest := body - (head - BatchHeaderSize)
		if err := s.pass(rest, move, minMove); err != nil {
			return err
		}
		n -= rest
	}
	if err := s.writePad(pad, n, next); err != nil {
		return err
	}
	if n > 0 {
		_, err := io.CopyN(s.dst, s.src, n)
		return err
	}
	return nil
}

// writePad writes n bytes of pad (putPad) followed by rest bytes.
func (s *fetchStream) writePad(n, rest, nextOffset int64) error {
	if n == 0 {
		return nil
	}
	var head [offMagic + 1]byte
	first := head[:min(n, int64(len(head)))]
	putPad(first, int(min(rest+n-int64(len(first)), 1<<31-1)), nextOffset)
	if _, err := s.dst.Write(first); err != nil {
		return err
	}
	var zeros [512]byte
	for left := n - int64(len(first)); left > 0; {
		k := min(left, int64(len(zeros)))
		if _, err := s.dst.Write(zeros[:k]); err != nil {
			return err
		}
		left -= k
	}
	return nil
}
