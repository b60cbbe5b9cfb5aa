package protocol

import (
	"bufio"
	"encoding/binary"
	"io"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A Hole is a run of a request frame's bytes that ReadProduceFrame left
// to its move function: the frame's buffer does not hold them (its bytes
// there are whatever the buffer held before).
type Hole struct{ Off, Len int }

// ReadProduceFrame reads a Produce request frame of n bytes (what follows
// its size prefix) from r into b (len(b) == n), except the bodies of
// record batches: of each batch whose body after its 61-byte header has
// at least minRun bytes still on the socket, move is asked to take them
// from the socket behind r (r's buffer being empty then) and the run is
// returned as a hole. Everything else lands in b: the request's fields and
// every batch header, so that the request decodes (the holes aside) and
// each batch's producer fields can be read. move may take fewer than
// asked (it has no more room): that run's rest and every later byte are
// read into b.
//
// A frame that is not a Produce of v3 or later, or does not parse as one,
// is read whole into b, holes so far kept: the decoder refuses it later
// with a clear error. Only a read's failure is returned.
func ReadProduceFrame(r *bufio.Reader, b []byte, minRun int, move func(n int) (int, error)) ([]Hole, error) {
	s := produceStream{r: r, b: b, minRun: minRun, move: move}
	s.frame()
	if s.err == nil && s.have < len(b) {
		s.fill(len(b)) // the rest, parsed or not
	}
	return s.holes, s.err
}

type produceStream struct {
	r      *bufio.Reader
	b      []byte
	have   int // b[:have] is read (or a hole)
	pos    int // the parser's position, <= have
	bad    bool
	err    error // a read failed
	minRun int
	move   func(int) (int, error)
	full   bool // move took less than asked: no more holes
	holes  []Hole
}

// fill reads b up to end.
func (s *produceStream) fill(end int) {
	if s.err != nil || end <= s.have {
		return
	}
	if _, err := io.ReadFull(s.r, s.b[s.have:end]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		s.err = err
		return
	}
	s.have = end
}

// need makes the next k bytes readable, or marks the frame bad.
func (s *produceStream) need(k int) bool {
	if s.bad || s.err != nil {
		return false
	}
	if k < 0 || s.pos+k > len(s.b) {
		s.bad = true
		return false
	}
	s.fill(s.pos + k)
	return s.err == nil
}

func (s *produceStream) skip(k int) {
	if s.need(k) {
		s.pos += k
	}
}

func (s *produceStream) int16() int {
	if !s.need(2) {
		return 0
	}
	v := int16(binary.BigEndian.Uint16(s.b[s.pos:]))
	s.pos += 2
	return int(v)
}

func (s *produceStream) int32() int {
	if !s.need(4) {
		return 0
	}
	v := int32(binary.BigEndian.Uint32(s.b[s.pos:]))
	s.pos += 4
	return int(v)
}

func (s *produceStream) uvarint() int {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		if !s.need(1) {
			return 0
		}
		c := s.b[s.pos]
		s.pos++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			if v > 1<<31 {
				s.bad = true
				return 0
			}
			return int(v)
		}
	}
	s.bad = true
	return 0
}

// length reads a string's, bytes' or array's length: compact (uvarint of
// length+1, 0 for null) or classic (int16 for strings, int32 otherwise).
// Null is -1.
func (s *produceStream) length(compact, short bool) int {
	switch {
	case compact:
		return s.uvarint() - 1
	case short:
		return s.int16()
	}
	return s.int32()
}

func (s *produceStream) tags() {
	for n := s.uvarint(); n > 0 && !s.bad; n-- {
		s.uvarint() // tag
		s.skip(s.uvarint())
	}
}

func (s *produceStream) frame() {
	key, version := s.int16(), s.int16()
	if s.bad || key != int(kmsg.Produce) || version < 3 || !IsKnown(int16(key), int16(version)) {
		return
	}
	flex := IsFlexible(int16(key), int16(version))
	s.skip(4)                             // correlation ID
	s.skip(max(s.length(false, true), 0)) // client ID: never compact
	if flex {
		s.tags()
	}
	s.skip(max(s.length(flex, true), 0)) // transactional ID
	s.skip(2 + 4)                        // acks, timeout
	for nt := s.length(flex, false); nt > 0 && !s.bad; nt-- {
		if version >= 13 {
			s.skip(16)
		} else {
			s.skip(max(s.length(flex, true), 0))
		}
		for np := s.length(flex, false); np > 0 && !s.bad; np-- {
			s.skip(4) // partition
			if n := s.length(flex, false); n > 0 {
				s.records(n)
			}
			if flex {
				s.tags()
			}
		}
		if flex {
			s.tags()
		}
	}
}

// records reads n bytes of record batches, each header into b and each
// large body, when it can, into a hole.
func (s *produceStream) records(n int) {
	if !s.need(0) || s.pos+n > len(s.b) {
		s.bad = true
		return
	}
	end := s.pos + n
	for end-s.pos >= BatchHeaderSize && !s.bad && s.err == nil {
		if !s.need(12) {
			return
		}
		size := 12 + int(int32(binary.BigEndian.Uint32(s.b[s.pos+8:])))
		if size < BatchHeaderSize || size > end-s.pos {
			break // not a batch: read as it is
		}
		if !s.need(BatchHeaderSize) {
			return
		}
		s.pos += BatchHeaderSize
		body := size - BatchHeaderSize
		if s.full || body-s.r.Buffered() < s.minRun {
			s.skip(body)
			continue
		}
		// What the reader's buffer holds comes first, then the socket.
		s.fill(s.pos + s.r.Buffered())
		if s.err != nil {
			return
		}
		want := s.pos + body - s.have
		m, err := s.move(want)
		if m > 0 {
			s.holes = append(s.holes, Hole{Off: s.have, Len: m})
			s.have += m
		}
		if err != nil {
			s.err = err
			return
		}
		if m < want {
			s.full = true
		}
		s.skip(body) // the rest of a body the move left
	}
	s.skip(end - s.pos)
}
