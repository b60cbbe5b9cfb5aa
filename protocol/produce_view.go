package protocol

import "fmt"

// ProduceTopicIDs walks a Produce request body (what follows the request
// header) of v13 or later, where topics are named by ID, and returns a
// 16-byte window onto each topic's ID, in order: writing to a window
// rewrites the request. Nothing is copied or decoded.
func ProduceTopicIDs(body []byte, version int16) ([][]byte, error) {
	if version < 13 {
		return nil, fmt.Errorf("%w: Produce v%d names topics, not IDs", ErrMalformedHeader, version)
	}
	r := reader{b: body}
	r.bytes(true) // transactional ID: compact nullable string
	r.skip(2 + 4) // acks, timeout
	var ids [][]byte
	for nt := r.arrayLen(true); nt > 0 && r.err == nil; nt-- {
		ids = append(ids, r.window(16))
		for np := r.arrayLen(true); np > 0 && r.err == nil; np-- {
			r.skip(4) // partition
			r.bytes(true)
			r.skipTags()
		}
		r.skipTags()
	}
	r.skipTags()
	if r.err == nil && r.pos != len(r.b) {
		r.err = fmt.Errorf("%w: %d bytes left over", ErrMalformedResponse, len(r.b)-r.pos)
	}
	return ids, r.err
}

// ProduceAnswerClean walks a Produce response frame (its header
// included, its size not) of v3 or later and reports whether it may reach
// the client as it came: every partition answered without error, no
// record errors, and no tagged field anywhere (a broker sets them, a
// leader hint or node endpoints, only with an error). It returns a 16-byte
// window onto each topic's ID (v13 and later: writing to a window
// rewrites the answer) and how many partitions were answered. Nothing is
// copied or decoded.
func ProduceAnswerClean(frame []byte, version int16) (ids [][]byte, partitions int, ok bool) {
	if version < 3 {
		return nil, 0, false
	}
	flex := version >= 9
	r := reader{b: frame}
	noTags := func() bool { return !flex || r.uvarint() == 0 }
	r.skip(4) // correlation ID
	if !noTags() {
		return nil, 0, false
	}
	for nt := r.arrayLen(flex); nt > 0 && r.err == nil; nt-- {
		if version >= 13 {
			ids = append(ids, r.window(16))
		} else if n := r.nameLen(flex); n > 0 {
			r.skip(n)
		}
		for np := r.arrayLen(flex); np > 0 && r.err == nil; np-- {
			r.skip(4) // partition
			if r.int16() != 0 {
				return nil, 0, false
			}
			r.skip(8 + 8) // base offset, log append time
			if version >= 5 {
				r.skip(8) // log start offset
			}
			if version >= 8 {
				if r.arrayLen(flex) != 0 || r.nameLen(flex) >= 0 {
					return nil, 0, false // record errors, an error message (null when none)
				}
			}
			if !noTags() {
				return nil, 0, false
			}
			partitions++
		}
		if !noTags() {
			return nil, 0, false
		}
	}
	r.skip(4) // throttle time
	if !noTags() || r.err != nil || r.pos != len(r.b) {
		return nil, 0, false
	}
	return ids, partitions, true
}

// nameLen reads a string's length: compact (uvarint of length+1) or
// int16; -1 is null.
func (r *reader) nameLen(flex bool) int {
	if flex {
		return int(r.uvarint()) - 1
	}
	return int(r.int16())
}
