package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/valyala/bytebufferpool"
)

// DefaultMaxFrameSize is the largest request Ferry reads by default, the same
// as Kafka's socket.request.max.bytes.
const DefaultMaxFrameSize = 100 << 20

// ErrFrameTooLarge is returned when a peer announces a frame larger than the
// configured maximum. The connection cannot be resynchronised and must close.
var ErrFrameTooLarge = errors.New("frame larger than the maximum request size")

// ErrMalformedFrame is returned for a frame whose size prefix is impossible.
var ErrMalformedFrame = errors.New("malformed frame")

// firstChunk is how much of a frame is read before the buffer grows: a
// frame is only given memory as its bytes actually arrive, so a peer that
// claims 100 MiB and sends 10 bytes costs Ferry nothing.
const firstChunk = 64 << 10

// ReadFrame reads one size-prefixed frame from r into buf (reset first); buf
// holds the frame without its 4-byte size. Frames of more than max bytes are
// refused before anything is allocated.
func ReadFrame(r io.Reader, max int32, buf *bytebufferpool.ByteBuffer) error {
	n, err := ReadFrameSize(r, max)
	if err != nil {
		return err
	}
	return ReadFrameBody(r, n, buf)
}

// ReadFrameSize reads a frame's 4-byte size prefix and checks it against
// max. The caller may then wait (for memory to be free, say) before
// ReadFrameBody reads the frame itself.
func ReadFrameSize(r io.Reader, max int32) (int, error) {
	var szb [4]byte
	if _, err := io.ReadFull(r, szb[:]); err != nil {
		return 0, err
	}
	size := int32(binary.BigEndian.Uint32(szb[:]))
	switch {
	case size < 0:
		return 0, fmt.Errorf("%w: negative size %d", ErrMalformedFrame, size)
	case size > max:
		return 0, fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, size, max)
	}
	return int(size), nil
}

// ReadFrameBody reads the n bytes of a frame whose size ReadFrameSize read
// into buf (reset first). A buffer that already has room is used as it is;
// otherwise memory follows the bytes that arrived: each step at most
// doubles what has been read, and the last one is exactly n, so the frame's
// buffer never has spare capacity to keep alive (a pool or a slow reader
// would hold it) and a peer that claims more than it sends gets little.
func ReadFrameBody(r io.Reader, n int, buf *bytebufferpool.ByteBuffer) error {
	buf.B = buf.B[:0]
	for len(buf.B) < n {
		start := len(buf.B)
		end := n
		if cap(buf.B) < n {
			end = min(n, max(firstChunk, 2*start))
			if cap(buf.B) < end {
				nb := make([]byte, start, end)
				copy(nb, buf.B)
				buf.B = nb
			}
		}
		buf.B = buf.B[:end]
		if _, err := io.ReadFull(r, buf.B[start:]); err != nil {
			buf.B = buf.B[:start]
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// grow extends b by n bytes, reallocating with a quarter to spare.
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, len(b)+n+len(b)/4)
	copy(nb, b)
	return nb
}

// AppendSize reserves 4 bytes for a size prefix; FinishSize fills it in.
func AppendSize(dst []byte) []byte { return append(dst, 0, 0, 0, 0) }

// FinishSize writes the size of the frame that starts at offset start (where
// AppendSize reserved its prefix).
func FinishSize(b []byte, start int) {
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
}
