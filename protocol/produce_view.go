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
