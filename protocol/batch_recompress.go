package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// Re-framing a compressed batch the log cleaner left with holes inside it.
// The cleaner itself decompressed such a batch and compressed what it kept
// again, so a run of it can only reach a broker the same way: its records
// are decompressed, split into runs as in SplitRuns, and each run is
// compressed again with the batch's codec. This is the one place Ferry
// decompresses or compresses records.
//
// Encodings, as Kafka reads them: gzip (RFC 1952, concatenated members
// allowed); snappy, read either as one raw snappy block (what franz-go and
// librdkafka write) or framed the xerial way (what the Java client writes:
// a 16-byte header, then big-endian length-prefixed raw blocks), written as
// one raw block; lz4, the LZ4 frame format; zstd, zstd frames.

// MaxDecompressedSize is the default bound on a batch's decompressed
// records (RecompressRuns, DecompressPayload): a hostile or corrupt batch
// cannot make Ferry allocate more than this.
const MaxDecompressedSize = 64 << 20

var (
	// ErrUnknownCodec means a batch's attributes name a compression codec
	// that is not gzip, snappy, lz4 or zstd.
	ErrUnknownCodec = errors.New("protocol: unknown compression codec")

	// ErrDecompressedTooLarge means a batch's records decompress to more
	// bytes than the caller's limit.
	ErrDecompressedTooLarge = errors.New("protocol: decompressed records exceed the size limit")

	// ErrBadCompressed means a batch's records do not decode with its
	// codec.
	ErrBadCompressed = errors.New("protocol: compressed records do not decode")
)

// RecompressRuns is SplitRuns for a compressed batch: it decompresses b's
// records (at most limit bytes of them), splits them into runs of records
// with consecutive offsets and returns each run as a new batch whose
// records are compressed with b's codec, at the source offset of its first
// record. Record bytes after each record's prefix, timestamps, attributes,
// producer fields and the transactional flag are as SplitRuns keeps them;
// the compressed bytes need not equal what another encoder (or another
// version of this one) would write, the decompressed records do. An
// uncompressed batch is split as SplitRuns does.
func RecompressRuns(b Batch, limit int) ([]Batch, error) {
	p, err := DecompressPayload(b, limit)
	if err != nil {
		return nil, err
	}
	return splitRuns(b, p, b.Compression())
}

// DecompressPayload returns b's records uncompressed: its payload itself
// for an uncompressed batch, else a new slice of at most limit bytes. The
// errors wrap ErrUnknownCodec, ErrDecompressedTooLarge or ErrBadCompressed.
func DecompressPayload(b Batch, limit int) ([]byte, error) {
	codec := b.Compression()
	if codec == CompressionNone {
		return b.Payload(), nil
	}
	p, err := decompress(codec, b.Payload(), limit)
	if err != nil && !errors.Is(err, ErrUnknownCodec) && !errors.Is(err, ErrDecompressedTooLarge) {
		err = fmt.Errorf("%w: %s: %v", ErrBadCompressed, codecName(codec), err)
	}
	return p, err
}

func codecName(codec int8) string {
	switch codec {
	case CompressionGzip:
		return "gzip"
	case CompressionSnappy:
		return "snappy"
	case CompressionLZ4:
		return "lz4"
	case CompressionZstd:
		return "zstd"
	}
	return fmt.Sprintf("codec %d", codec)
}

func decompress(codec int8, src []byte, limit int) ([]byte, error) {
	switch codec {
	case CompressionGzip:
		r, err := gzip.NewReader(bytes.NewReader(src))
		if err != nil {
			return nil, err
		}
		return readBounded(r, limit)
	case CompressionSnappy:
		if len(src) >= len(xerialHeader) && bytes.HasPrefix(src, xerialMagic) {
			return xerialDecode(src[len(xerialHeader):], limit)
		}
		return snappyDecode(nil, src, limit)
	case CompressionLZ4:
		return readBounded(lz4.NewReader(bytes.NewReader(src)), limit)
	case CompressionZstd:
		out, err := zstdDecoder(limit).DecodeAll(src, nil)
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			return nil, fmt.Errorf("%w (%d bytes): zstd: %v", ErrDecompressedTooLarge, limit, err)
		}
		return out, err
	}
	return nil, fmt.Errorf("%w: %d", ErrUnknownCodec, codec)
}

// readBounded reads r to its end, refusing more than limit bytes.
func readBounded(r io.Reader, limit int) ([]byte, error) {
	var out bytes.Buffer
	n, err := out.ReadFrom(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if n > int64(limit) {
		return nil, fmt.Errorf("%w (%d bytes)", ErrDecompressedTooLarge, limit)
	}
	return out.Bytes(), nil
}

// snappyDecode appends the raw snappy block src, decoded, to dst. The
// decoded length is in the block's header: it is checked against what
// limit leaves before anything is allocated.
func snappyDecode(dst, src []byte, limit int) ([]byte, error) {
	n, err := s2.DecodedLen(src)
	if err != nil {
		return nil, err
	}
	if n > limit-len(dst) {
		return nil, fmt.Errorf("%w (%d bytes)", ErrDecompressedTooLarge, limit)
	}
	dst = slices.Grow(dst, n)
	if _, err := s2.Decode(dst[len(dst):len(dst)+n], src); err != nil {
		return nil, err
	}
	return dst[:len(dst)+n], nil
}

// The xerial snappy stream header: a magic, then version and minimum
// compatible version, both 1 as the Java client writes them.
var (
	xerialMagic  = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}
	xerialHeader = append(slices.Clone(xerialMagic), 0, 0, 0, 1, 0, 0, 0, 1)
)

// xerialDecode decodes the blocks after a xerial header: each a big-endian
// int32 length, then a raw snappy block.
func xerialDecode(src []byte, limit int) ([]byte, error) {
	var out []byte
	for len(src) > 0 {
		if len(src) < 4 {
			return nil, errors.New("xerial snappy: truncated block length")
		}
		n := int32(binary.BigEndian.Uint32(src))
		src = src[4:]
		if n < 0 || int(n) > len(src) {
			return nil, fmt.Errorf("xerial snappy: block length %d, %d bytes left", n, len(src))
		}
		var err error
		if out, err = snappyDecode(out, src[:n], limit); err != nil {
			return nil, err
		}
		src = src[n:]
	}
	return out, nil
}

// zstd decoders, one per limit (in practice one or two), each decoding on
// up to GOMAXPROCS goroutines at once.
var zstdDecoders sync.Map // int → *zstd.Decoder

func zstdDecoder(limit int) *zstd.Decoder {
	if d, ok := zstdDecoders.Load(limit); ok {
		return d.(*zstd.Decoder)
	}
	d, err := zstd.NewReader(nil, zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxMemory(uint64(max(limit, 1))),
		zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)))
	if err != nil {
		panic(err) // only for invalid options, which these are not
	}
	if prev, loaded := zstdDecoders.LoadOrStore(limit, d); loaded {
		d.Close()
		return prev.(*zstd.Decoder)
	}
	return d
}

// The encoders are set up as franz-go sets up its own (a Kafka broker and
// its consumers read what they write): default levels; zstd with a 64 KiB
// window and an empty input as a frame. Each is deterministic for a given
// input and library version.
var (
	gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}
	lz4Writers  = sync.Pool{New: func() any { return lz4.NewWriter(nil) }}
	zstdEncoder = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil, zstd.WithWindowSize(64<<10), zstd.WithZeroFrames(true),
			zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
		if err != nil {
			panic(err) // only for invalid options, which these are not
		}
		return e
	})
)

// appendCompressed appends src compressed with codec to dst.
func appendCompressed(dst []byte, codec int8, src []byte) ([]byte, error) {
	switch codec {
	case CompressionGzip:
		w := gzipWriters.Get().(*gzip.Writer)
		defer gzipWriters.Put(w)
		return appendStream(dst, w, src)
	case CompressionSnappy:
		n := s2.MaxEncodedLen(len(src))
		if n < 0 {
			return nil, fmt.Errorf("snappy: %d bytes are too many for one block", len(src))
		}
		at := len(dst)
		dst = slices.Grow(dst, n)
		enc := s2.EncodeSnappy(dst[at:cap(dst)], src)
		return dst[:at+len(enc)], nil
	case CompressionLZ4:
		w := lz4Writers.Get().(*lz4.Writer)
		defer lz4Writers.Put(w)
		return appendStream(dst, w, src)
	case CompressionZstd:
		return zstdEncoder().EncodeAll(src, dst), nil
	}
	return nil, fmt.Errorf("%w: %d", ErrUnknownCodec, codec)
}

// resetWriter is a pooled streaming compressor (gzip, lz4).
type resetWriter interface {
	io.WriteCloser
	Reset(io.Writer)
}

// appendStream appends src compressed by w to dst.
func appendStream(dst []byte, w resetWriter, src []byte) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	w.Reset(buf)
	if _, err := w.Write(src); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
