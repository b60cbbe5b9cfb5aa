package protocol

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// streamCase streams in (the response after its correlation ID) through a
// source buffer of bufSize bytes, moving records past the buffers the way
// the proxy does (flush, then straight from the underlying reader), and
// returns what came out and how many record bytes bypassed the buffers.
func streamCase(t *testing.T, in []byte, v int16, bufSize int, h FetchStreamHooks) ([]byte, int64, error) {
	t.Helper()
	under := &io.LimitedReader{R: bytes.NewReader(in), N: int64(len(in))}
	src := bufio.NewReaderSize(under, bufSize)
	var out bytes.Buffer
	dst := bufio.NewWriterSize(&out, 64)
	var direct int64
	h.Records = func(n int64) error {
		if err := dst.Flush(); err != nil {
			return err
		}
		m, err := io.CopyN(&out, under, n)
		direct += m
		return err
	}
	_, err := StreamFetchResponse(src, dst, v, int64(len(in)), h)
	if err == nil {
		err = dst.Flush()
	}
	return out.Bytes(), direct, err
}

// withHeaderTags prefixes body with an empty response-header tag section
// for flexible versions, as a broker sends it.
func withHeaderTags(body []byte, v int16) []byte {
	if v < 12 {
		return body
	}
	return append([]byte{0}, body...)
}

// realRecords returns record batches real Apache Kafka returned, for
// responses that look like the ones Ferry streams.
func realRecords(t *testing.T) [][]byte {
	var out [][]byte
	for _, name := range []string{"kafka-idempotent-lz4.bin", "kafka-txn-zstd.bin", "kafka-plain-none.bin"} {
		b, err := os.ReadFile(filepath.Join(batchFixtureDir, name))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func TestStreamFetchResponsePassesBytesThrough(t *testing.T) {
	recs := realRecords(t)
	for v := int16(4); v <= 18; v++ {
		r := sampleFetchResponse(v, false)
		for i := range r.Topics[0].Partitions {
			r.Topics[0].Partitions[i].RecordBatches = recs[i]
		}
		in := withHeaderTags(r.AppendTo(nil), v)
		for _, bufSize := range []int{16, 4096, 1 << 20} {
			out, direct, err := streamCase(t, in, v, bufSize, FetchStreamHooks{})
			if err != nil {
				t.Fatalf("v%d buffer %d: %v", v, bufSize, err)
			}
			if !bytes.Equal(out, in) {
				t.Fatalf("v%d buffer %d: %d bytes out differ from the %d in", v, bufSize, len(out), len(in))
			}
			if bufSize == 16 && direct == 0 {
				t.Fatalf("v%d: no record bytes moved past the buffers", v)
			}
			// Runs shorter than MinRecords go through the buffers.
			out, direct, err = streamCase(t, in, v, bufSize, FetchStreamHooks{MinRecords: 1 << 30})
			if err != nil || !bytes.Equal(out, in) || direct != 0 {
				t.Fatalf("v%d buffer %d with MinRecords: %v, equal %v, %d bytes moved past the buffers", v, bufSize, err, bytes.Equal(out, in), direct)
			}
		}
	}
}

// The hooks rewrite the same fields WalkFetchResponse's windows do, with
// the same result.
func TestStreamFetchResponseRewritesLikeTheWalk(t *testing.T) {
	for v := int16(4); v <= 18; v++ {
		body := sampleFetchResponse(v, false).AppendTo(nil)
		in := withHeaderTags(body, v)
		var heads, tails int
		out, _, err := streamCase(t, in, v, 16, FetchStreamHooks{
			Topic: rewriteTopic,
			Head: func(_ *FetchTopic, p *FetchPartition) {
				heads++
				rewriteHead(p)
			},
			Tail: func(_ *FetchTopic, p *FetchPartition) {
				tails++
				rewriteTail(p)
			},
		})
		if err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		if heads != 6 || tails != 6 {
			t.Fatalf("v%d: %d heads %d tails", v, heads, tails)
		}
		if err := walkRewrite(body, v); err != nil {
			t.Fatalf("v%d: walk: %v", v, err)
		}
		if want := withHeaderTags(body, v); !bytes.Equal(out, want) {
			t.Fatalf("v%d: streamed rewrite differs from the walked one", v)
		}
	}
}

// Node endpoints name physical brokers: a streamed response carries their
// bytes zeroed under an unknown tag, same size, and kmsg reads no brokers.
func TestStreamFetchResponseHidesEndpoints(t *testing.T) {
	for _, v := range []int16{16, 17, 18} {
		in := withHeaderTags(sampleFetchResponse(v, true).AppendTo(nil), v)
		out, _, err := streamCase(t, in, v, 16, FetchStreamHooks{})
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != len(in) {
			t.Fatalf("v%d: %d bytes out, %d in", v, len(out), len(in))
		}
		if bytes.Contains(out, []byte("kafka-3")) {
			t.Fatalf("v%d: the physical host is still in the response", v)
		}
		back := kmsg.NewPtrFetchResponse()
		back.SetVersion(v)
		if err := back.ReadFrom(out[1:]); err != nil {
			t.Fatalf("v%d: kmsg cannot read the streamed response: %v", v, err)
		}
		if len(back.Brokers) != 0 || len(back.Topics) != 2 || back.Topics[1].Partitions[1].CurrentLeader.LeaderID != 3 {
			t.Fatalf("v%d: brokers %v topics %d", v, back.Brokers, len(back.Topics))
		}
	}
}

func TestStreamFetchResponseRejectsTruncated(t *testing.T) {
	in := withHeaderTags(sampleFetchResponse(16, false).AppendTo(nil), 16)
	for n := 0; n < len(in); n += 5 {
		under := bytes.NewReader(in[:n])
		var out bytes.Buffer
		if _, err := StreamFetchResponse(bufio.NewReaderSize(under, 16), bufio.NewWriter(&out), 16, int64(n), FetchStreamHooks{}); err == nil {
			t.Fatalf("accepted a response cut at %d of %d bytes", n, len(in))
		}
	}
	// A size that claims more than the fields hold is caught too.
	if _, err := StreamFetchResponse(bufio.NewReader(bytes.NewReader(in)), bufio.NewWriter(io.Discard), 16, int64(len(in)+3), FetchStreamHooks{}); err == nil {
		t.Fatal("accepted a response shorter than its size")
	}
}

func FuzzStreamFetchResponse(f *testing.F) {
	for _, v := range []int16{4, 11, 12, 13, 16, 18} {
		f.Add(withHeaderTags(sampleFetchResponse(v, v == 16).AppendTo(nil), v), v)
	}
	f.Fuzz(func(t *testing.T, in []byte, v int16) {
		if v < 4 || v > 18 {
			return
		}
		var out bytes.Buffer
		dst := bufio.NewWriter(&out)
		_, err := StreamFetchResponse(bufio.NewReaderSize(bytes.NewReader(in), 16), dst, v, int64(len(in)), FetchStreamHooks{})
		dst.Flush()
		// Without hooks only node endpoints (v16+) change, in place.
		if err == nil && (len(out.Bytes()) != len(in) || v < 16 && !bytes.Equal(out.Bytes(), in)) {
			t.Fatalf("v%d: output differs from input", v)
		}
	})
}

// fillerRecords is a partition's records as a cluster the mirror wrote
// into may hold them: real batches with fillers between and after them,
// and a partial batch at the end, as a broker may cut an answer.
func fillerRecords(t *testing.T) []byte {
	recs := realRecords(t)
	filler := func(n int32, base int64, txn bool) []byte {
		f := Batch(AppendFillerBatch(nil, n, 7, 0, 0, txn))
		f.SetBaseOffset(base)
		f.SetPartitionLeaderEpoch(5) // as the broker does
		return f
	}
	var b []byte
	b = append(b, recs[0]...)
	b = append(b, filler(3, 0, false)...)
	b = append(b, recs[2]...)
	b = append(b, filler(200, 0, true)...)
	return append(b, recs[1][:90]...)
}

// A batch rewrite gives the same bytes whether the records are rewritten
// in a buffer or streamed: every complete batch's leader epoch mapped, the
// fillers emptied (still stepping over their offsets), the records' size
// unchanged, and nothing a client reads after the last complete batch.
func TestBatchRewriteStreamedLikeInPlace(t *testing.T) {
	records := fillerRecords(t)
	hidden := 0
	rw := BatchRewrite{Epoch: func(e int32) int32 { return 3<<20 | e }, HideFillers: true, Hidden: func() { hidden++ }}
	want := bytes.Clone(records)
	if n := RewriteRecords(want, rw); n != 2 || hidden != 2 {
		t.Fatalf("%d fillers hidden (%d counted), want 2", n, hidden)
	}
	if len(want) != len(records) {
		t.Fatalf("records of %d bytes became %d", len(records), len(want))
	}
	var batches []Batch
	if err := WalkBatches(want, func(b Batch) error { batches = append(batches, b); return nil }); err != nil {
		t.Fatal(err)
	}
	count := func(b []byte) int {
		n := 0
		WalkBatches(b, func(Batch) error { n++; return nil })
		return n
	}
	recs := realRecords(t)
	f1, f2 := count(recs[0]), count(recs[0])+1+count(recs[2])
	if len(batches) != f2+1 {
		t.Fatalf("%d complete batches after the rewrite, want %d", len(batches), f2+1)
	}
	for i, b := range batches {
		if err := b.CheckCRC(); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if b.PartitionLeaderEpoch()>>20 != 3 {
			t.Fatalf("batch %d: leader epoch %d not of generation 3", i, b.PartitionLeaderEpoch())
		}
		if IsFillerBatch(b) {
			t.Fatalf("batch %d is still a filler", i)
		}
	}
	if b1, b2 := batches[f1], batches[f2]; b1.NumRecords() != 0 || b1.NextOffset() != 3 || b2.NumRecords() != 0 || b2.NextOffset() != 200 {
		t.Fatalf("emptied fillers: %d records to %d, %d records to %d", b1.NumRecords(), b1.NextOffset(), b2.NumRecords(), b2.NextOffset())
	}
	// Twice is once: a fallback may rewrite an answer again.
	again := bytes.Clone(want)
	if RewriteRecords(again, rw); !bytes.Equal(again, want) {
		t.Fatal("a second rewrite changed the records")
	}

	for _, v := range []int16{4, 11, 12, 13, 18} {
		r := sampleFetchResponse(v, false)
		r.Topics[0].Partitions[0].RecordBatches = records
		in := withHeaderTags(r.AppendTo(nil), v)
		r.Topics[0].Partitions[0].RecordBatches = want
		expect := withHeaderTags(r.AppendTo(nil), v)
		for _, bufSize := range []int{16, 4096, 1 << 20} {
			for _, minRecords := range []int64{0, 1 << 30} {
				hidden = 0
				out, _, err := streamCase(t, in, v, bufSize, FetchStreamHooks{Batches: rw, MinRecords: minRecords})
				if err != nil {
					t.Fatalf("v%d buffer %d: %v", v, bufSize, err)
				}
				if !bytes.Equal(out, expect) || hidden != 2 {
					t.Fatalf("v%d buffer %d: streamed rewrite differs from the one in place (%d fillers hidden)", v, bufSize, hidden)
				}
			}
		}
	}
}
