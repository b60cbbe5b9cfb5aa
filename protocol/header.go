package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrMalformedHeader is returned for a request header that cannot be parsed.
var ErrMalformedHeader = errors.New("malformed request header")

// RequestHeader is a parsed request header (v0, v1 or v2). Only the fields
// Ferry routes on are kept; the body is not looked at.
type RequestHeader struct {
	Key           int16
	Version       int16
	CorrelationID int32
	ClientID      string
	HasClientID   bool // false for a null client ID
	// Flexible says whether the request at this version uses KIP-482
	// tagged fields (header v2, and a v1 response header).
	Flexible bool
	// Known is false for an API key or version kmsg cannot parse; such a
	// request is refused.
	Known bool
	// Size is the header's length in the frame: the body starts there.
	Size int
}

// flexible[key][version] caches kmsg's view of every request's flexibility.
var flexible = func() [][]bool {
	t := make([][]bool, kmsg.MaxKey+1)
	for k := int16(0); k <= kmsg.MaxKey; k++ {
		r := kmsg.RequestForKey(k)
		if r == nil {
			continue
		}
		vs := make([]bool, r.MaxVersion()+1)
		for v := range vs {
			r.SetVersion(int16(v))
			vs[v] = r.IsFlexible()
		}
		t[k] = vs
	}
	return t
}()

// IsKnown reports whether kmsg can parse key at version.
func IsKnown(key, version int16) bool {
	return key >= 0 && int(key) < len(flexible) && version >= 0 && int(version) < len(flexible[key])
}

// IsFlexible reports whether key at version is a flexible (KIP-482) request;
// false for unknown ones.
func IsFlexible(key, version int16) bool {
	return IsKnown(key, version) && flexible[key][version]
}

// ParseRequestHeader parses the header at the start of a request frame (the
// frame without its size prefix).
func ParseRequestHeader(b []byte) (RequestHeader, error) {
	var h RequestHeader
	if len(b) < 10 {
		return h, fmt.Errorf("%w: %d bytes", ErrMalformedHeader, len(b))
	}
	h.Key = int16(binary.BigEndian.Uint16(b[0:]))
	h.Version = int16(binary.BigEndian.Uint16(b[2:]))
	h.CorrelationID = int32(binary.BigEndian.Uint32(b[4:]))
	n := int(int16(binary.BigEndian.Uint16(b[8:])))
	pos := 10
	if n >= 0 {
		if len(b)-pos < n {
			return h, fmt.Errorf("%w: client ID of %d bytes overruns the frame", ErrMalformedHeader, n)
		}
		h.ClientID = string(b[pos : pos+n])
		h.HasClientID = true
		pos += n
	} else if n != -1 {
		return h, fmt.Errorf("%w: client ID length %d", ErrMalformedHeader, n)
	}
	h.Known = IsKnown(h.Key, h.Version)
	h.Flexible = IsFlexible(h.Key, h.Version)
	if h.Flexible {
		end, err := skipTags(b, pos)
		if err != nil {
			return h, err
		}
		pos = end
	}
	h.Size = pos
	return h, nil
}

// skipTags skips a KIP-482 tagged-field section starting at pos.
func skipTags(b []byte, pos int) (int, error) {
	num, pos, err := uvarint(b, pos)
	if err != nil {
		return 0, err
	}
	for i := uint64(0); i < num; i++ {
		if _, pos, err = uvarint(b, pos); err != nil { // tag
			return 0, err
		}
		var size uint64
		if size, pos, err = uvarint(b, pos); err != nil {
			return 0, err
		}
		if uint64(len(b)-pos) < size {
			return 0, fmt.Errorf("%w: tagged field overruns the frame", ErrMalformedHeader)
		}
		pos += int(size)
	}
	return pos, nil
}

func uvarint(b []byte, pos int) (uint64, int, error) {
	if pos > len(b) {
		return 0, 0, fmt.Errorf("%w: truncated", ErrMalformedHeader)
	}
	v, n := binary.Uvarint(b[pos:])
	if n <= 0 {
		return 0, 0, fmt.Errorf("%w: bad varint", ErrMalformedHeader)
	}
	return v, pos + n, nil
}

// SetCorrelationID rewrites the correlation ID of a request frame in place
// (it sits at bytes 4..8 of every request header version).
func SetCorrelationID(frame []byte, id int32) {
	binary.BigEndian.PutUint32(frame[4:], uint32(id))
}

// ResponseHeaderSize is the size of the response header for a request of key
// at version: the correlation ID, plus an empty tag section when the request
// was flexible. ApiVersions always answers with header v0 so that a client can
// read the answer to a version it sent too high.
func ResponseHeaderSize(key, version int16) int {
	if key != int16(kmsg.ApiVersions) && IsFlexible(key, version) {
		return 5
	}
	return 4
}

// AppendRequestHeader appends a request header for req (v1, or v2 when
// flexible) with the given correlation ID and client ID.
func AppendRequestHeader(dst []byte, req kmsg.Request, corrID int32, clientID string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(req.Key()))
	dst = binary.BigEndian.AppendUint16(dst, uint16(req.GetVersion()))
	dst = binary.BigEndian.AppendUint32(dst, uint32(corrID))
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(clientID)))
	dst = append(dst, clientID...)
	if req.IsFlexible() {
		dst = append(dst, 0)
	}
	return dst
}

// AppendResponseHeader appends the response header for a request of key at
// version.
func AppendResponseHeader(dst []byte, key, version int16, corrID int32) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(corrID))
	if ResponseHeaderSize(key, version) == 5 {
		dst = append(dst, 0)
	}
	return dst
}
