package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// streamedProduce is a Produce request with batches of several sizes
// across two topics, some partitions holding two batches, one none.
func streamedProduce(version int16, sizes [][]int) (*kmsg.ProduceRequest, []byte) {
	req := kmsg.NewPtrProduceRequest()
	req.Version = version
	txn := "txn-1"
	req.TransactionID = &txn
	req.Acks = -1
	req.TimeoutMillis = 30000
	pid := int64(1000)
	for ti, parts := range [][][]int{sizes[:len(sizes)/2], sizes[len(sizes)/2:]} {
		t := kmsg.NewProduceRequestTopic()
		t.Topic = []string{"orders", "payments-with-a-longer-name"}[ti]
		t.TopicID = [16]byte{byte(ti + 1), 2, 3}
		for pi, batches := range parts {
			p := kmsg.NewProduceRequestTopicPartition()
			p.Partition = int32(pi)
			for _, n := range batches {
				b := newTestBatch(n)
				b.SetProducer(pid, 3, int32(n))
				pid++
				p.Records = append(p.Records, b...)
			}
			t.Partitions = append(t.Partitions, p)
		}
		req.Topics = append(req.Topics, t)
	}
	frame := AppendRequestHeader(nil, req, 77, "client-a")
	return req, req.AppendTo(frame)
}

// socketed reads frame through a small buffer, as a client connection
// does, and moves what ReadProduceFrame asks into pipe straight from the
// source behind the buffer, up to room bytes.
func socketed(t *testing.T, frame []byte, minRun, room int) (b []byte, holes []Hole, pipe *bytes.Buffer) {
	t.Helper()
	src := bytes.NewReader(frame)
	r := bufio.NewReaderSize(src, 4<<10)
	pipe = new(bytes.Buffer)
	b = bytes.Repeat([]byte{0xEE}, len(frame)) // a reused buffer's old bytes
	holes, err := ReadProduceFrame(r, b, minRun, func(n int) (int, error) {
		if r.Buffered() != 0 {
			t.Fatalf("move asked with %d bytes in the reader's buffer", r.Buffered())
		}
		n = min(n, room-pipe.Len())
		m, err := io.CopyN(pipe, src, int64(n))
		return int(m), err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b, holes, pipe
}

// filled puts the pipe's bytes back into the holes.
func filled(b []byte, holes []Hole, pipe *bytes.Buffer) []byte {
	out := append([]byte(nil), b...)
	for _, h := range holes {
		copy(out[h.Off:h.Off+h.Len], pipe.Next(h.Len))
	}
	return out
}

func TestReadProduceFrameHolesAreBatchBodies(t *testing.T) {
	sizes := [][]int{{200 << 10}, {10, 100 << 10}, {}, {40 << 10, 5 << 10, 70 << 10}, {1000}, {300 << 10}}
	for v := int16(3); v <= 13; v++ {
		req, frame := streamedProduce(v, sizes)
		b, holes, pipe := socketed(t, frame, 32<<10, 1<<30)
		// Every body of 32 KiB or more past what the reader's buffer
		// held is a hole: 200, 100, 40, 70 and 300 KiB.
		if len(holes) != 5 {
			t.Fatalf("v%d: %d holes, want 5: %v", v, len(holes), holes)
		}
		moved := 0
		for _, h := range holes {
			moved += h.Len
		}
		if moved != pipe.Len() || moved < 690<<10 {
			t.Fatalf("v%d: holes cover %d bytes, pipe holds %d", v, moved, pipe.Len())
		}
		if got := filled(b, holes, pipe); !bytes.Equal(got, frame) {
			t.Fatalf("v%d: frame with its holes filled differs from the one sent", v)
		}
		// With its holes unfilled the request decodes, and every batch
		// header reads as sent.
		hdr, err := ParseRequestHeader(b)
		if err != nil {
			t.Fatal(err)
		}
		got := kmsg.NewPtrProduceRequest()
		got.Version = v
		if err := got.ReadFrom(b[hdr.Size:]); err != nil {
			t.Fatalf("v%d: the frame with holes does not decode: %v", v, err)
		}
		for ti, tt := range got.Topics {
			for pi, p := range tt.Partitions {
				want := req.Topics[ti].Partitions[pi].Records
				if len(p.Records) != len(want) {
					t.Fatalf("v%d: records of %d bytes, want %d", v, len(p.Records), len(want))
				}
				var gotPIDs, wantPIDs []int64
				WalkBatches(p.Records, func(b Batch) error { gotPIDs = append(gotPIDs, b.ProducerID(), int64(b.BaseSequence())); return nil })
				WalkBatches(want, func(b Batch) error { wantPIDs = append(wantPIDs, b.ProducerID(), int64(b.BaseSequence())); return nil })
				if len(gotPIDs) != len(wantPIDs) {
					t.Fatalf("v%d: %d batch headers read, want %d", v, len(gotPIDs)/2, len(wantPIDs)/2)
				}
				for i := range gotPIDs {
					if gotPIDs[i] != wantPIDs[i] {
						t.Fatalf("v%d: batch header field %d = %d, want %d", v, i, gotPIDs[i], wantPIDs[i])
					}
				}
			}
		}
	}
}

// A pipe with less room than the batches: the run it could not take, and
// everything after it, is read into the buffer.
func TestReadProduceFramePipeFull(t *testing.T) {
	_, frame := streamedProduce(9, [][]int{{200 << 10}, {100 << 10}, {300 << 10}, {50 << 10}})
	b, holes, pipe := socketed(t, frame, 32<<10, 250<<10)
	if len(holes) != 2 || pipe.Len() != 250<<10 {
		t.Fatalf("holes %v, pipe %d bytes; want 2 holes filling it", holes, pipe.Len())
	}
	if got := filled(b, holes, pipe); !bytes.Equal(got, frame) {
		t.Fatal("frame with its holes filled differs from the one sent")
	}
}

// Whatever is not a well-formed Produce is read whole: the decoder says
// what is wrong with it.
func TestReadProduceFrameReadsOthersWhole(t *testing.T) {
	_, good := streamedProduce(9, [][]int{{200 << 10}, {100 << 10}})
	meta := AppendRequestHeader(nil, kmsg.NewPtrMetadataRequest(), 1, "c")
	meta = kmsg.NewPtrMetadataRequest().AppendTo(meta)
	// A records length past the frame's end, in the first partition:
	// found at the first batch of the second topic's records.
	badLen := append([]byte(nil), good...)
	cut := bytes.Index(badLen, []byte("payments"))
	badLen = badLen[:cut+200]
	v2 := append([]byte(nil), good...)
	v2[3] = 2 // Produce v2: not streamed
	for name, frame := range map[string][]byte{"metadata": meta, "truncated structure": badLen, "v2": v2} {
		b, holes, pipe := socketed(t, frame, 32<<10, 1<<30)
		if name != "truncated structure" && len(holes) != 0 {
			t.Fatalf("%s: %d holes", name, len(holes))
		}
		if got := filled(b, holes, pipe); !bytes.Equal(got, frame) {
			t.Fatalf("%s: read differs from the frame", name)
		}
	}
}

func TestReadProduceFrameShortRead(t *testing.T) {
	_, frame := streamedProduce(9, [][]int{{200 << 10}, {100 << 10}})
	for _, at := range []int{3, 40, 1000, 150 << 10, len(frame) - 1} {
		r := bufio.NewReaderSize(bytes.NewReader(frame[:at]), 4<<10)
		src := r
		_, err := ReadProduceFrame(r, make([]byte, len(frame)), 32<<10, func(n int) (int, error) {
			m, err := io.CopyN(io.Discard, src, int64(n))
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return int(m), err
		})
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("cut at %d: %v, want unexpected EOF", at, err)
		}
	}
}
