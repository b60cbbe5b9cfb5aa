package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A recompressCodec compresses a batch's records the way a producer does:
// franz-go's own compressor for each codec, and the xerial snappy framing
// the Java client writes.
type recompressCodec struct {
	name     string
	attr     int8
	compress func(t testing.TB, src []byte) []byte
}

func franzCompress(codec kgo.CompressionCodec, attr int8) func(t testing.TB, src []byte) []byte {
	return func(t testing.TB, src []byte) []byte {
		t.Helper()
		c, err := kgo.DefaultCompressor(codec)
		if err != nil {
			t.Fatal(err)
		}
		out, used := c.Compress(new(bytes.Buffer), src)
		if int8(used) != attr {
			t.Fatalf("franz-go compressed with codec %d, want %d", used, attr)
		}
		return slices.Clone(out)
	}
}

// xerialCompress frames src as the Java client's SnappyOutputStream does:
// the xerial header, then 32 KiB blocks, each a big-endian length and a raw
// snappy block.
func xerialCompress(_ testing.TB, src []byte) []byte {
	out := []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1}
	for len(src) > 0 {
		n := min(len(src), 32<<10)
		block := s2.EncodeSnappy(nil, src[:n])
		out = binary.BigEndian.AppendUint32(out, uint32(len(block)))
		out = append(out, block...)
		src = src[n:]
	}
	return out
}

var recompressCodecs = []recompressCodec{
	{"gzip", CompressionGzip, franzCompress(kgo.GzipCompression(), CompressionGzip)},
	{"snappy", CompressionSnappy, franzCompress(kgo.SnappyCompression(), CompressionSnappy)},
	{"snappy-xerial", CompressionSnappy, xerialCompress},
	{"lz4", CompressionLZ4, franzCompress(kgo.Lz4Compression(), CompressionLZ4)},
	{"zstd", CompressionZstd, franzCompress(kgo.ZstdCompression(), CompressionZstd)},
}

// compressBatch returns the uncompressed batch b with its records
// compressed by c.
func compressBatch(t testing.TB, b Batch, c recompressCodec) Batch {
	t.Helper()
	if b.Compression() != CompressionNone {
		t.Fatal("compressBatch takes an uncompressed batch")
	}
	out := append(Batch(nil), b[:BatchHeaderSize]...)
	out = append(out, c.compress(t, b.Payload())...)
	out.SetAttributes(b.Attributes() | int16(c.attr))
	binary.BigEndian.PutUint32(out[offBatchLength:], uint32(len(out)-batchLengthPrefix))
	out.UpdateCRC()
	return out
}

// franzDecompress decodes a batch's records with franz-go's decompressor,
// which is independent of DecompressPayload.
func franzDecompress(t *testing.T, b Batch) []byte {
	t.Helper()
	p, err := kgo.DefaultDecompressor().Decompress(b.Payload(), kgo.CompressionCodecType(b.Compression()))
	if err != nil {
		t.Fatalf("franz-go cannot decompress the batch at %d: %v", b.BaseOffset(), err)
	}
	return p
}

// checkRecompressed fails unless RecompressRuns(comp) gives the runs that
// SplitRuns gives for plain (comp's records, uncompressed), each with comp's
// codec and records that franz-go decodes to the same bytes.
func checkRecompressed(t *testing.T, comp, plain Batch) []Batch {
	t.Helper()
	want, err := SplitRuns(plain)
	if err != nil {
		t.Fatal(err)
	}
	got, err := RecompressRuns(comp, MaxDecompressedSize)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d runs, want %d", len(got), len(want))
	}
	for i, g := range got {
		w := want[i]
		if err := g.Validate(); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if g.Compression() != comp.Compression() || g.Attributes() != comp.Attributes() {
			t.Fatalf("run %d: attributes %#x, source batch %#x", i, g.Attributes(), comp.Attributes())
		}
		// Every header field but batchLength, CRC and attributes equals
		// the uncompressed run's.
		if g.BaseOffset() != w.BaseOffset() || g.PartitionLeaderEpoch() != w.PartitionLeaderEpoch() || g.Magic() != w.Magic() ||
			!bytes.Equal(g[offLastOffsetDelta:BatchHeaderSize], w[offLastOffsetDelta:BatchHeaderSize]) {
			t.Fatalf("run %d: header differs from the uncompressed run's", i)
		}
		if p := franzDecompress(t, g); !bytes.Equal(p, w.Payload()) {
			t.Fatalf("run %d: franz-go decodes %d bytes of records, want the uncompressed run's %d", i, len(p), len(w.Payload()))
		}
		if p, err := DecompressPayload(g, MaxDecompressedSize); err != nil || !bytes.Equal(p, w.Payload()) {
			t.Fatalf("run %d: DecompressPayload: %v", i, err)
		}
	}
	return got
}

func TestRecompressRunsHoles(t *testing.T) {
	const base, baseTS = 100, 1_700_000_000_000
	for _, c := range recompressCodecs {
		for _, attrs := range []int16{0, BatchAttrTransactional, BatchAttrDeleteHorizon} {
			plain := buildHoleyBatch(t, base, baseTS, 10, attrs, holeyRecs)
			comp := compressBatch(t, plain, c)
			runs := checkRecompressed(t, comp, plain)
			// TestSplitRunsHoles checks the uncompressed runs field by
			// field; here, what a consumer sees (franz-go's consumer
			// code, CRCs checked): each record at its source offset with
			// its key, value and timestamp.
			var got []*kgo.Record
			for _, r := range runs {
				got = append(got, decodeRecords(t, r)...)
			}
			if len(got) != len(holeyRecs) {
				t.Fatalf("%s: %d records in the runs, want %d", c.name, len(got), len(holeyRecs))
			}
			for i, g := range got {
				src := holeyRecs[i]
				if g.Offset != base+src.offDelta || !bytes.Equal(g.Key, src.key) || !bytes.Equal(g.Value, src.value) ||
					(g.Value == nil) != (src.value == nil) || g.Timestamp.UnixMilli() != baseTS+src.tsDelta && attrs&BatchAttrDeleteHorizon == 0 {
					t.Fatalf("%s attrs %#x: record %d at %d, key %q, timestamp %d; want at %d, key %q, timestamp %d",
						c.name, attrs, i, g.Offset, g.Key, g.Timestamp.UnixMilli(), base+src.offDelta, src.key, baseTS+src.tsDelta)
				}
			}
			for off, has := range map[int64]bool{100: false, 101: true, 103: false, 104: true, 106: false, 109: true, 110: false} {
				if comp.HasRecordAt(off) != has {
					t.Fatalf("%s: HasRecordAt(%d) = %v", c.name, off, !has)
				}
			}
		}
	}
}

// TestRecompressRunsFixtures: batches that franz-go produced and a real
// broker (or kfake) stored, with every codec. Each decodes as franz-go
// decodes it; each, cut down to a batch with holes and compressed again by
// franz-go, splits into the runs SplitRuns gives for the same records
// uncompressed.
func TestRecompressRunsFixtures(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(batchFixtureDir, "*.bin"))
	checked := map[int8]int{}
	for _, f := range files {
		blob, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		err = WalkBatches(blob, func(b Batch) error {
			if b.IsControl() || b.Compression() == CompressionNone {
				return nil
			}
			c := recompressCodecs[slices.IndexFunc(recompressCodecs, func(c recompressCodec) bool { return c.attr == b.Compression() })]
			p, err := DecompressPayload(b, MaxDecompressedSize)
			if err != nil {
				t.Fatalf("%s batch at %d: %v", f, b.BaseOffset(), err)
			}
			if !bytes.Equal(p, franzDecompress(t, b)) {
				t.Fatalf("%s batch at %d: decoded records differ from franz-go's", f, b.BaseOffset())
			}
			plain := uncompressed(t, b, p, nil)
			// Without holes: one run holding the same records.
			if runs := checkRecompressed(t, b, plain); len(runs) != 1 {
				t.Fatalf("%s batch at %d: %d runs", f, b.BaseOffset(), len(runs))
			}
			if b.NumRecords() < 3 {
				return nil
			}
			// Drop the second record, and the last one when there are
			// more than three: a hole inside, and one at the end.
			drop := []int{1}
			if b.NumRecords() > 3 {
				drop = append(drop, int(b.NumRecords())-1)
			}
			holey := uncompressed(t, b, p, drop)
			if holey.HasConsecutiveOffsets() {
				t.Fatal("test batch has no holes")
			}
			runs := checkRecompressed(t, compressBatch(t, holey, c), holey)
			// A consumer reads the records that were kept, at their
			// source offsets.
			var got, want []*kgo.Record
			for _, r := range runs {
				got = append(got, decodeRecords(t, r)...)
			}
			for i, r := range decodeRecords(t, b) {
				if !slices.Contains(drop, i) {
					want = append(want, r)
				}
			}
			sameRecords(t, got, want)
			for i := range want {
				if got[i].Offset != want[i].Offset {
					t.Fatalf("%s batch at %d: record %d at offset %d, want %d", f, b.BaseOffset(), i, got[i].Offset, want[i].Offset)
				}
			}
			checked[b.Compression()]++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range recompressCodecs {
		if checked[c.attr] < 4 {
			t.Fatalf("%s: %d fixture batches with holes checked, want at least 4", c.name, checked[c.attr])
		}
	}
}

// uncompressed returns b as an uncompressed batch of its records p, less
// the records at the indexes in drop (offset deltas kept: holes).
func uncompressed(t *testing.T, b Batch, p []byte, drop []int) Batch {
	t.Helper()
	out := append(Batch(nil), b[:BatchHeaderSize]...)
	n := 0
	for i := 0; len(p) > 0; i++ {
		l, k := binary.Varint(p)
		if k <= 0 || l < 0 || int(l) > len(p)-k {
			t.Fatalf("batch at %d: bad record %d", b.BaseOffset(), i)
		}
		if !slices.Contains(drop, i) {
			out = append(out, p[:k+int(l)]...)
			n++
		}
		p = p[k+int(l):]
	}
	out.SetAttributes(b.Attributes() &^ BatchAttrCompressionMask)
	binary.BigEndian.PutUint32(out[offBatchLength:], uint32(len(out)-batchLengthPrefix))
	binary.BigEndian.PutUint32(out[offRecordCount:], uint32(n))
	out.UpdateCRC()
	return out
}

// TestRecompressRunsLimit: a batch whose records decompress to more than
// the limit is refused before its records are held in full, with every
// codec.
func TestRecompressRunsLimit(t *testing.T) {
	big := []testRec{{offDelta: 0, key: []byte("a"), value: make([]byte, 256<<10)}, {offDelta: 2, key: []byte("b")}}
	plain := buildHoleyBatch(t, 0, 0, 2, 0, big)
	size := len(plain.Payload())
	for _, c := range recompressCodecs {
		comp := compressBatch(t, plain, c)
		if len(comp.Payload()) > size/10 { // a small batch that decompresses big
			t.Fatalf("%s: zeros compressed to %d bytes", c.name, len(comp.Payload()))
		}
		if _, err := RecompressRuns(comp, 64<<10); !errors.Is(err, ErrDecompressedTooLarge) {
			t.Fatalf("%s, limit 64 KiB: %v", c.name, err)
		}
		if _, err := DecompressPayload(comp, size-1); !errors.Is(err, ErrDecompressedTooLarge) {
			t.Fatalf("%s, limit one byte short: %v", c.name, err)
		}
		if p, err := DecompressPayload(comp, size); err != nil || !bytes.Equal(p, plain.Payload()) {
			t.Fatalf("%s, limit the exact size: %v", c.name, err)
		}
		if runs, err := RecompressRuns(comp, MaxDecompressedSize); err != nil || len(runs) != 2 {
			t.Fatalf("%s: %d runs, %v", c.name, len(runs), err)
		}
	}
}

func TestRecompressRunsRefuses(t *testing.T) {
	plain := buildHoleyBatch(t, 0, 0, 2, 0, []testRec{{offDelta: 0, key: []byte("a")}, {offDelta: 2, key: []byte("b")}})
	withPayload := func(attrs int16, p []byte) Batch {
		b := append(Batch(nil), plain[:BatchHeaderSize]...)
		b = append(b, p...)
		b.SetAttributes(attrs)
		binary.BigEndian.PutUint32(b[offBatchLength:], uint32(len(b)-batchLengthPrefix))
		b.UpdateCRC()
		return b
	}
	if _, err := RecompressRuns(withPayload(5, plain.Payload()), MaxDecompressedSize); !errors.Is(err, ErrUnknownCodec) {
		t.Fatalf("codec 5: %v", err)
	}
	for _, c := range recompressCodecs {
		good := compressBatch(t, plain, c)
		// Garbage, and the real encoding cut short.
		for _, p := range [][]byte{[]byte("not compressed at all, not even close"), good.Payload()[:len(good.Payload())-3]} {
			if _, err := RecompressRuns(withPayload(int16(c.attr), p), MaxDecompressedSize); !errors.Is(err, ErrBadCompressed) {
				t.Fatalf("%s, %d bytes that do not decode: %v", c.name, len(p), err)
			}
		}
		// Decodes, but the records do not match the header.
		bad := append(Batch(nil), good...)
		binary.BigEndian.PutUint32(bad[offRecordCount:], 3)
		bad.UpdateCRC()
		if _, err := RecompressRuns(bad, MaxDecompressedSize); !errors.Is(err, ErrBadRecord) {
			t.Fatalf("%s, record count too high: %v", c.name, err)
		}
	}
}

// An uncompressed batch goes through RecompressRuns as through SplitRuns.
func TestRecompressRunsUncompressed(t *testing.T) {
	plain := buildHoleyBatch(t, 100, 1_700_000_000_000, 10, 0, holeyRecs)
	want, _ := SplitRuns(plain)
	got, err := RecompressRuns(plain, MaxDecompressedSize)
	if err != nil || len(got) != len(want) {
		t.Fatalf("%d runs, %v", len(got), err)
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("run %d differs from SplitRuns'", i)
		}
	}
}

// FuzzRecompressRuns: whatever a source batch holds, RecompressRuns never
// panics, fails only with the sentinels, and what it returns are valid
// batches in the source's codec whose records fill the source's.
func FuzzRecompressRuns(f *testing.F) {
	addBatchSeeds(f)
	for _, c := range recompressCodecs {
		f.Add([]byte(compressBatch(f, buildHoleyBatch(f, 100, 1_700_000_000_000, 10, 0, holeyRecs), c)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, _, err := ParseBatch(data)
		if err != nil || len(b) < BatchHeaderSize {
			return
		}
		runs, err := RecompressRuns(b, 1<<20)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) && !errors.Is(err, ErrBadCompressed) &&
				!errors.Is(err, ErrDecompressedTooLarge) && !errors.Is(err, ErrUnknownCodec) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		n := 0
		for _, r := range runs {
			if err := r.Validate(); err != nil || r.Compression() != b.Compression() || !r.HasConsecutiveOffsets() ||
				r.BaseOffset() < b.BaseOffset() || r.NextOffset() > b.NextOffset() {
				t.Fatalf("run %d..%d: %v, codec %d", r.BaseOffset(), r.NextOffset()-1, err, r.Compression())
			}
			if _, err := DecompressPayload(r, 1<<20); err != nil {
				t.Fatal(err)
			}
			n += int(r.NumRecords())
		}
		if n != int(b.NumRecords()) {
			t.Fatalf("%d records in the runs, %d in the batch", n, b.NumRecords())
		}
	})
}
