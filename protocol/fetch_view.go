package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformedResponse is returned for a response that cannot be walked.
var ErrMalformedResponse = errors.New("malformed response")

// FetchTopic is one topic of a Fetch response, seen in place.
type FetchTopic struct {
	Name string // v0-v12
	// ID is a 16-byte window onto the topic ID in the response (v13+):
	// writing to it rewrites the response.
	ID []byte
}

// FetchPartition is one partition of a Fetch response, seen in place. The
// byte windows point into the response: writing to them rewrites it.
type FetchPartition struct {
	Partition        int32
	ErrorCode        int16
	HighWatermark    int64
	LastStableOffset int64
	LogStartOffset   int64
	// PreferredReadReplica is a 4-byte window (v11+), else nil.
	PreferredReadReplica []byte
	// Records are the partition's record batches.
	Records []byte
	// DivergingEpoch is a 4-byte window onto the diverging epoch (a
	// tagged field, v12+), nil when absent.
	DivergingEpoch []byte
	// CurrentLeader is an 8-byte window onto the KIP-951 leader hint
	// (leader ID, then leader epoch), nil when absent.
	CurrentLeader []byte
}

// WalkFetchResponse walks a Fetch response body (what follows the response
// header) of the given version, v4 and up, without copying or allocating per
// partition. It calls topic before each topic's partitions and part for
// each partition. endpoints reports whether the response carries KIP-951
// node endpoints (a tagged field of variable size, which cannot be
// rewritten in place).
func WalkFetchResponse(body []byte, version int16, topic func(*FetchTopic) error, part func(*FetchTopic, *FetchPartition) error) (errorCode int16, endpoints bool, err error) {
	if version < 4 {
		return 0, false, fmt.Errorf("%w: Fetch v%d is not walked in place", ErrMalformedResponse, version)
	}
	r := reader{b: body}
	flex := version >= 12
	r.skip(4) // throttle
	if version >= 7 {
		errorCode = r.int16()
		r.skip(4) // session ID
	}
	var t FetchTopic
	var p FetchPartition
	for nt := r.arrayLen(flex); nt > 0 && r.err == nil; nt-- {
		t = FetchTopic{}
		if version >= 13 {
			t.ID = r.window(16)
		} else {
			t.Name = r.string(flex)
		}
		if r.err == nil && topic != nil {
			if err := topic(&t); err != nil {
				return errorCode, false, err
			}
		}
		for np := r.arrayLen(flex); np > 0 && r.err == nil; np-- {
			p = FetchPartition{}
			p.Partition = r.int32()
			p.ErrorCode = r.int16()
			p.HighWatermark = r.int64()
			p.LastStableOffset = r.int64()
			if version >= 5 {
				p.LogStartOffset = r.int64()
			}
			for na := r.arrayLen(flex); na > 0 && r.err == nil; na-- {
				r.skip(16) // producer ID, first offset
				if flex {
					r.skipTags()
				}
			}
			if version >= 11 {
				p.PreferredReadReplica = r.window(4)
			}
			p.Records = r.bytes(flex)
			if flex {
				for nt := r.uvarint(); nt > 0 && r.err == nil; nt-- {
					tag := r.uvarint()
					size := int(r.uvarint())
					w := r.window(size)
					switch {
					case w == nil:
					case tag == 0 && size >= 4:
						p.DivergingEpoch = w[:4]
					case tag == 1 && size >= 8:
						p.CurrentLeader = w[:8]
					}
				}
			}
			if r.err == nil && part != nil {
				if err := part(&t, &p); err != nil {
					return errorCode, false, err
				}
			}
		}
		if flex {
			r.skipTags()
		}
	}
	if flex {
		for nt := r.uvarint(); nt > 0 && r.err == nil; nt-- {
			tag := r.uvarint()
			r.window(int(r.uvarint()))
			endpoints = endpoints || tag == 0
		}
	}
	if r.err == nil && r.pos != len(r.b) {
		r.err = fmt.Errorf("%w: %d bytes left over", ErrMalformedResponse, len(r.b)-r.pos)
	}
	return errorCode, endpoints, r.err
}

// reader reads Kafka primitives from a byte slice; the first error sticks.
type reader struct {
	b   []byte
	pos int
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.b)-r.pos < n {
		r.err = fmt.Errorf("%w: need %d bytes at %d of %d", ErrMalformedResponse, n, r.pos, len(r.b))
		return false
	}
	return true
}

func (r *reader) skip(n int) {
	if r.need(n) {
		r.pos += n
	}
}

func (r *reader) window(n int) []byte {
	if !r.need(n) {
		return nil
	}
	w := r.b[r.pos : r.pos+n : r.pos+n]
	r.pos += n
	return w
}

func (r *reader) int16() int16 {
	if b := r.window(2); b != nil {
		return int16(binary.BigEndian.Uint16(b))
	}
	return 0
}

func (r *reader) int32() int32 {
	if b := r.window(4); b != nil {
		return int32(binary.BigEndian.Uint32(b))
	}
	return 0
}

func (r *reader) int64() int64 {
	if b := r.window(8); b != nil {
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.pos:])
	if n <= 0 {
		r.err = fmt.Errorf("%w: bad varint at %d", ErrMalformedResponse, r.pos)
		return 0
	}
	r.pos += n
	return v
}

// length32 reads the length of an array or of bytes: in flexible
// versions a compact length (an unsigned varint one above it), else an
// int32; -1 is null.
func (r *reader) length32(flex bool) int {
	if flex {
		return int(r.uvarint()) - 1
	}
	return int(r.int32())
}

// arrayLen reads an array length; null arrays read as empty.
func (r *reader) arrayLen(flex bool) int {
	n := r.length32(flex)
	if n < 0 {
		return 0
	}
	if n > len(r.b)-r.pos {
		r.err = fmt.Errorf("%w: array of %d at %d", ErrMalformedResponse, n, r.pos)
		return 0
	}
	return n
}

func (r *reader) string(flex bool) string {
	n := r.nameLen(flex)
	if n < 0 {
		return ""
	}
	return string(r.window(n))
}

func (r *reader) bytes(flex bool) []byte {
	n := r.length32(flex)
	if n < 0 {
		return nil
	}
	return r.window(n)
}

func (r *reader) skipTags() {
	for n := r.uvarint(); n > 0 && r.err == nil; n-- {
		r.uvarint()
		r.skip(int(r.uvarint()))
	}
}
