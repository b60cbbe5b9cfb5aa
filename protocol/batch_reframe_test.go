package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

type testRec struct {
	tsDelta, offDelta int64
	key, value        []byte // nil value: a tombstone
	headers           [][2]string
}

// buildHoleyBatch hand-encodes an uncompressed v2 batch holding recs, whose
// offset deltas need not be consecutive.
func buildHoleyBatch(t testing.TB, base, baseTS int64, lastDelta int32, attrs int16, recs []testRec) Batch {
	t.Helper()
	var payload []byte
	maxTS := baseTS
	for _, r := range recs {
		var body []byte
		body = append(body, 0)
		body = binary.AppendVarint(body, r.tsDelta)
		body = binary.AppendVarint(body, r.offDelta)
		body = binary.AppendVarint(body, int64(len(r.key)))
		body = append(body, r.key...)
		if r.value == nil {
			body = binary.AppendVarint(body, -1)
		} else {
			body = binary.AppendVarint(body, int64(len(r.value)))
			body = append(body, r.value...)
		}
		body = binary.AppendVarint(body, int64(len(r.headers)))
		for _, h := range r.headers {
			body = binary.AppendVarint(body, int64(len(h[0])))
			body = append(body, h[0]...)
			body = binary.AppendVarint(body, int64(len(h[1])))
			body = append(body, h[1]...)
		}
		payload = binary.AppendVarint(payload, int64(len(body)))
		payload = append(payload, body...)
		maxTS = max(maxTS, baseTS+r.tsDelta)
	}
	kb := kmsg.RecordBatch{
		FirstOffset: base, PartitionLeaderEpoch: 7, Magic: 2, Attributes: attrs,
		LastOffsetDelta: lastDelta, FirstTimestamp: baseTS, MaxTimestamp: maxTS,
		ProducerID: 4242, ProducerEpoch: 3, FirstSequence: 50, NumRecords: int32(len(recs)), Records: payload,
	}
	kb.Length = int32(BatchHeaderSize - batchLengthPrefix + len(payload))
	b := Batch(kb.AppendTo(nil))
	b.UpdateCRC()
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	return b
}

// decode reads a batch's records with kmsg, independently of recordFrames.
func decode(t *testing.T, b Batch) []kmsg.Record {
	t.Helper()
	p := b.Payload()
	var out []kmsg.Record
	for len(p) > 0 {
		l, k := binary.Varint(p)
		if k <= 0 {
			t.Fatal("bad record length")
		}
		var r kmsg.Record
		if err := r.ReadFrom(p[:k+int(l)]); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
		p = p[k+int(l):]
	}
	if len(out) != int(b.NumRecords()) {
		t.Fatalf("%d records decoded, recordCount %d", len(out), b.NumRecords())
	}
	return out
}

// holeyRecs are the records of a batch with lastOffsetDelta 10 after a
// cleaner run: runs at deltas 1-2, 4 and 7-9, holes at 0, 3, 5-6 and 10.
var holeyRecs = []testRec{
	{tsDelta: 5, offDelta: 1, key: []byte("a"), value: []byte("va"), headers: [][2]string{{"h1", "v1"}, {"h2", ""}}},
	{tsDelta: 3, offDelta: 2, key: []byte("b"), value: nil},
	{tsDelta: 300, offDelta: 4, key: []byte("c"), value: bytes.Repeat([]byte("x"), 200)},
	{tsDelta: 70, offDelta: 7, key: []byte("d"), value: []byte("vd"), headers: [][2]string{{"h1", "v1"}}},
	{tsDelta: 90000, offDelta: 8, key: nil, value: []byte("ve")},
	{tsDelta: -2, offDelta: 9, key: []byte("f"), value: []byte("vf")},
}

func TestSplitRunsHoles(t *testing.T) {
	recs := holeyRecs
	const base, baseTS = 100, 1_700_000_000_000
	for _, attrs := range []int16{0, BatchAttrTransactional} {
		src := buildHoleyBatch(t, base, baseTS, 10, attrs, recs)
		if src.HasConsecutiveOffsets() {
			t.Fatal("test batch has no holes")
		}
		srcRecs := decode(t, src)
		runs, err := SplitRuns(src)
		if err != nil {
			t.Fatal(err)
		}
		want := []struct {
			base int64
			recs []int // indexes into recs
		}{{101, []int{0, 1}}, {104, []int{2}}, {107, []int{3, 4, 5}}}
		if len(runs) != len(want) {
			t.Fatalf("%d runs, want %d", len(runs), len(want))
		}
		for i, r := range runs {
			w := want[i]
			if err := r.Validate(); err != nil {
				t.Fatalf("run %d: %v", i, err)
			}
			if r.BaseOffset() != w.base || int(r.NumRecords()) != len(w.recs) || !r.HasConsecutiveOffsets() ||
				r.NextOffset() != w.base+int64(len(w.recs)) {
				t.Fatalf("run %d: base %d, %d records, lastOffsetDelta %d; want base %d, %d records",
					i, r.BaseOffset(), r.NumRecords(), r.LastOffsetDelta(), w.base, len(w.recs))
			}
			if r.Attributes() != src.Attributes() || r.ProducerID() != src.ProducerID() || r.ProducerEpoch() != src.ProducerEpoch() ||
				r.PartitionLeaderEpoch() != src.PartitionLeaderEpoch() || r.Magic() != BatchMagic {
				t.Fatalf("run %d: header fields differ from the source batch", i)
			}
			if r.BaseSequence() != src.BaseSequence()+int32(w.base-base) {
				t.Fatalf("run %d: base sequence %d", i, r.BaseSequence())
			}
			got := decode(t, r)
			frames, err := recordFrames(r, r.Payload())
			if err != nil {
				t.Fatal(err)
			}
			srcFrames, _ := recordFrames(src, src.Payload())
			maxTS := int64(-1 << 63)
			for j, g := range got {
				s := srcRecs[w.recs[j]]
				ts := r.BaseTimestamp() + g.TimestampDelta64
				if ts != baseTS+s.TimestampDelta64 {
					t.Fatalf("run %d record %d: timestamp %d, source %d", i, j, ts, baseTS+s.TimestampDelta64)
				}
				maxTS = max(maxTS, ts)
				if g.OffsetDelta != int32(j) {
					t.Fatalf("run %d record %d: offsetDelta %d", i, j, g.OffsetDelta)
				}
				if !bytes.Equal(g.Key, s.Key) || !bytes.Equal(g.Value, s.Value) || (g.Value == nil) != (s.Value == nil) ||
					len(g.Headers) != len(s.Headers) {
					t.Fatalf("run %d record %d: key/value/headers differ", i, j)
				}
				for h := range g.Headers {
					if g.Headers[h].Key != s.Headers[h].Key || !bytes.Equal(g.Headers[h].Value, s.Headers[h].Value) {
						t.Fatalf("run %d record %d: header %d differs", i, j, h)
					}
				}
				// Key, value and header bytes are copied as they are.
				if !bytes.Equal(frames[j].rest, srcFrames[w.recs[j]].rest) {
					t.Fatalf("run %d record %d: bytes after the prefix differ", i, j)
				}
			}
			if r.BaseTimestamp() != baseTS+srcRecs[w.recs[0]].TimestampDelta64 || r.MaxTimestamp() != maxTS {
				t.Fatalf("run %d: base timestamp %d, max %d", i, r.BaseTimestamp(), r.MaxTimestamp())
			}
		}
		for off, has := range map[int64]bool{99: false, 100: false, 101: true, 102: true, 103: false, 104: true,
			105: false, 106: false, 107: true, 109: true, 110: false, 111: false} {
			if src.HasRecordAt(off) != has {
				t.Fatalf("HasRecordAt(%d) = %v", off, !has)
			}
		}
	}
}

func TestSplitRunsDeleteHorizonKeepsBase(t *testing.T) {
	recs := []testRec{{tsDelta: 10, offDelta: 0, key: []byte("a")}, {tsDelta: 20, offDelta: 2, key: []byte("b")}}
	src := buildHoleyBatch(t, 0, 5000, 2, BatchAttrDeleteHorizon, recs)
	runs, err := SplitRuns(src)
	if err != nil || len(runs) != 2 {
		t.Fatalf("%d runs, %v", len(runs), err)
	}
	for i, r := range runs {
		if r.BaseTimestamp() != 5000 || !r.HasDeleteHorizon() {
			t.Fatalf("run %d: base timestamp %d", i, r.BaseTimestamp())
		}
		if g := decode(t, r); g[0].TimestampDelta64 != recs[i].tsDelta {
			t.Fatalf("run %d: timestampDelta %d", i, g[0].TimestampDelta64)
		}
	}
}

func TestSplitRunsNoHolesIsIdentity(t *testing.T) {
	recs := []testRec{{tsDelta: 0, offDelta: 0, key: []byte("a"), value: []byte("1")},
		{tsDelta: 4, offDelta: 1, key: []byte("b"), value: []byte("2")}}
	src := buildHoleyBatch(t, 10, 1000, 1, 0, recs)
	runs, err := SplitRuns(src)
	if err != nil || len(runs) != 1 {
		t.Fatalf("%d runs, %v", len(runs), err)
	}
	if !bytes.Equal(runs[0], src) {
		t.Fatal("a batch without holes is not reproduced byte for byte")
	}
}

func TestSplitRunsRefuses(t *testing.T) {
	recs := []testRec{{offDelta: 0, key: []byte("a")}, {offDelta: 2, key: []byte("b")}}
	comp := buildHoleyBatch(t, 0, 0, 2, int16(CompressionZstd), recs) // flagged zstd, not zstd
	if _, err := SplitRuns(comp); !errors.Is(err, ErrCompressedBatch) {
		t.Fatalf("compressed: %v", err)
	}
	// Records it cannot read: it claims the whole range, so that a
	// filler never stands where the source may hold a record.
	if !comp.HasRecordAt(1) {
		t.Fatal("undecodable batch: HasRecordAt must answer true in its range")
	}
	bad := append(Batch(nil), buildHoleyBatch(t, 0, 0, 2, 0, recs)...)
	binary.BigEndian.PutUint32(bad[offRecordCount:], 3)
	if _, err := SplitRuns(bad); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("record count too high: %v", err)
	}
	desc := buildHoleyBatch(t, 0, 0, 2, 0, []testRec{{offDelta: 2, key: []byte("a")}, {offDelta: 1, key: []byte("b")}})
	if _, err := SplitRuns(desc); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("decreasing offset deltas: %v", err)
	}
	beyond := buildHoleyBatch(t, 0, 0, 1, 0, []testRec{{offDelta: 0}, {offDelta: 3}})
	if _, err := SplitRuns(beyond); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("offset delta beyond lastOffsetDelta: %v", err)
	}
}
