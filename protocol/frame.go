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
	var szb [4]byte
	if _, err := io.ReadFull(r, szb[:]); err != nil {
		return err
	}
	size := int32(binary.BigEndian.Uint32(szb[:]))
	switch {
	case size < 0:
		return fmt.Errorf("%w: negative size %d", ErrMalformedFrame, size)
	case size > max:
		return fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, size, max)
	}
	buf.Reset()
	n := int(size)
	for len(buf.B) < n {
		chunk := max64k(len(buf.B))
		if rem := n - len(buf.B); chunk > rem {
			chunk = rem
		}
		start := len(buf.B)
		buf.B = grow(buf.B, chunk)
		if _, err := io.ReadFull(r, buf.B[start:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// max64k returns the next chunk size: at least firstChunk, then doubling
// with what already arrived.
func max64k(have int) int {
	if have < firstChunk {
		return firstChunk
	}
	return have
}

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
