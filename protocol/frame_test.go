package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"
)

var captureFrames = flag.Bool("capture-frames", false, "regenerate testdata/frames from franz-go traffic to an in-process kfake cluster")

func frame(body []byte) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(len(body))) // then body
}

func TestReadFrame(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []byte
		max     int32
		want    []byte
		wantErr error
	}{
		{"small", append(frame([]byte("hello")), "hello"...), 100, []byte("hello"), nil},
		{"empty", frame(nil), 100, []byte{}, nil},
		{"at max", append(frame(bytes.Repeat([]byte{1}, 64)), bytes.Repeat([]byte{1}, 64)...), 64, bytes.Repeat([]byte{1}, 64), nil},
		{"over max", append(frame(bytes.Repeat([]byte{1}, 65)), bytes.Repeat([]byte{1}, 65)...), 64, nil, ErrFrameTooLarge},
		{"negative", []byte{0xff, 0xff, 0xff, 0xf0}, 100, nil, ErrMalformedFrame},
		{"truncated body", append(frame([]byte("hello")), "he"...), 100, nil, io.ErrUnexpectedEOF},
		{"truncated size", []byte{0, 0}, 100, nil, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := bytebufferpool.Get()
			defer bytebufferpool.Put(buf)
			err := ReadFrame(bytes.NewReader(tc.in), tc.max, buf)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err == nil && !bytes.Equal(buf.B, tc.want) {
				t.Fatalf("frame %q, want %q", buf.B, tc.want)
			}
		})
	}
}

// A peer that claims a huge frame and sends little gets no huge buffer.
func TestReadFrameDoesNotTrustTheClaimedSize(t *testing.T) {
	in := append(frame(make([]byte, 90<<20)), make([]byte, 1000)...)[:4+1000]
	buf := bytebufferpool.Get()
	err := ReadFrame(bytes.NewReader(in), DefaultMaxFrameSize, buf)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v", err)
	}
	if cap(buf.B) > 1<<20 {
		t.Fatalf("allocated %d bytes for a frame of which 1000 arrived", cap(buf.B))
	}
}

// A large frame gets a buffer of exactly its size: nothing spare for a
// pool or a slow client to keep alive (doubling left up to twice the frame).
func TestReadFrameBufferIsTheFrameSize(t *testing.T) {
	for _, size := range []int{firstChunk + 1, 3<<20 + 7, 5 << 20} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i * 7)
		}
		in := append(frame(body), body...)
		buf := &bytebufferpool.ByteBuffer{B: make([]byte, 0, 1000)} // a small pooled buffer
		if err := ReadFrame(iotest.HalfReader(bytes.NewReader(in)), DefaultMaxFrameSize, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.B, body) {
			t.Fatalf("frame of %d bytes read wrongly", size)
		}
		if cap(buf.B) != size {
			t.Fatalf("frame of %d bytes in a buffer of capacity %d", size, cap(buf.B))
		}
	}
	// A buffer with room enough is used as it is.
	buf := &bytebufferpool.ByteBuffer{B: make([]byte, 0, 1<<20)}
	if err := ReadFrame(bytes.NewReader(append(frame([]byte("hello")), "hello"...)), 100, buf); err != nil || string(buf.B) != "hello" || cap(buf.B) != 1<<20 {
		t.Fatalf("%q cap %d: %v", buf.B, cap(buf.B), err)
	}
}

func TestParseRequestHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  kmsg.Request
		flex bool
	}{
		{"metadata v1", &kmsg.MetadataRequest{Version: 1}, false},
		{"metadata v12 flexible", &kmsg.MetadataRequest{Version: 12}, true},
		{"produce v9 flexible", &kmsg.ProduceRequest{Version: 9}, true},
		{"api versions v3", &kmsg.ApiVersionsRequest{Version: 3}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := AppendRequestHeader(nil, tc.req, 42, "client-x")
			hdrLen := len(b)
			b = tc.req.AppendTo(b)
			h, err := ParseRequestHeader(b)
			if err != nil {
				t.Fatal(err)
			}
			if h.Key != tc.req.Key() || h.Version != tc.req.GetVersion() || h.CorrelationID != 42 || h.ClientID != "client-x" || !h.HasClientID || h.Flexible != tc.flex || !h.Known || h.Size != hdrLen {
				t.Fatalf("parsed %+v (header length %d)", h, hdrLen)
			}
			SetCorrelationID(b, 7)
			if h, _ := ParseRequestHeader(b); h.CorrelationID != 7 {
				t.Fatalf("SetCorrelationID: %d", h.CorrelationID)
			}
		})
	}
}

func TestParseRequestHeaderRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"short", []byte{0, 3, 0, 1}},
		{"client ID overruns", []byte{0, 3, 0, 1, 0, 0, 0, 1, 0, 50, 'a'}},
		{"bad client ID length", []byte{0, 3, 0, 1, 0, 0, 0, 1, 0xff, 0xf0}},
		{"tags overrun", []byte{0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 1, 0, 50}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseRequestHeader(tc.in); !errors.Is(err, ErrMalformedHeader) {
				t.Fatalf("err %v, want ErrMalformedHeader", err)
			}
		})
	}
}

func TestUnknownVersionIsNotKnown(t *testing.T) {
	h, err := ParseRequestHeader([]byte{0, 3, 0, 99, 0, 0, 0, 1, 0xff, 0xff})
	if err != nil || h.Known || h.Flexible {
		t.Fatalf("%+v %v", h, err)
	}
}

func TestIntersectKeepsOldClientFloors(t *testing.T) {
	a := Versions{0: {0, 11}, 3: {0, 12}, 1: {4, 17}}
	b := Versions{0: {0, 12}, 3: {0, 13}, 1: {4, 16}, 50: {0, 0}}
	got := Intersect(a, b)
	want := Versions{0: {0, 11}, 3: {0, 12}, 1: {4, 16}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got.Supports(50, 0) || !got.Supports(0, 0) {
		t.Fatal("Supports")
	}
}

func loadFrames(tb testing.TB) [][]byte {
	files, _ := filepath.Glob("testdata/frames/*.bin")
	sort.Strings(files)
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func TestCapturedFramesParse(t *testing.T) {
	frames := loadFrames(t)
	if len(frames) < 10 {
		t.Fatalf("%d captured frames in testdata/frames; regenerate with -capture-frames", len(frames))
	}
	for _, f := range frames {
		buf := bytebufferpool.Get()
		if err := ReadFrame(bytes.NewReader(f), DefaultMaxFrameSize, buf); err != nil {
			t.Fatal(err)
		}
		h, err := ParseRequestHeader(buf.B)
		if err != nil || !h.Known {
			t.Fatalf("captured frame: %+v %v", h, err)
		}
		r := kmsg.RequestForKey(h.Key)
		r.SetVersion(h.Version)
		if err := r.ReadFrom(buf.B[h.Size:]); err != nil {
			t.Fatalf("%s v%d body: %v", kmsg.NameForKey(h.Key), h.Version, err)
		}
		bytebufferpool.Put(buf)
	}
}

// TestCaptureFrames records the request frames franz-go sends to a kfake
// cluster (produce with every codec, group consume, transactions, admin) as
// the header and frame fuzzers' seed corpus.
func TestCaptureFrames(t *testing.T) {
	if !*captureFrames {
		t.Skip("run with -capture-frames to regenerate testdata/frames")
	}
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	seen := map[string][]byte{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				up, err := net.Dial("tcp", kf.ListenAddrs()[0])
				if err != nil {
					c.Close()
					return
				}
				go io.Copy(c, up)
				for {
					buf := bytebufferpool.Get()
					if err := ReadFrame(c, DefaultMaxFrameSize, buf); err != nil {
						c.Close()
						up.Close()
						return
					}
					h, _ := ParseRequestHeader(buf.B)
					whole := append(frame(buf.B), buf.B...)
					mu.Lock()
					// Up to five of each kind: the produces differ by codec.
					for i := 0; i < 5; i++ {
						k := fmt.Sprintf("%02d-%s-v%d-%d", h.Key, kmsg.NameForKey(h.Key), h.Version, i)
						if _, ok := seen[k]; !ok {
							seen[k] = whole
							break
						}
					}
					mu.Unlock()
					up.Write(whole)
				}
			}()
		}
	}()
	// kfake advertises its own address; point the client's dialer at the tee.
	dial := func(ctx context.Context, network, host string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, ln.Addr().String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, codec := range []kgo.CompressionCodec{kgo.NoCompression(), kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()} {
		cl, _ := kgo.NewClient(kgo.SeedBrokers(ln.Addr().String()), kgo.Dialer(dial), kgo.ProducerBatchCompression(codec), kgo.DefaultProduceTopic("t"))
		cl.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: bytes.Repeat([]byte("value "), 50)})
		cl.Close()
	}
	tx, _ := kgo.NewClient(kgo.SeedBrokers(ln.Addr().String()), kgo.Dialer(dial), kgo.TransactionalID("tx"), kgo.DefaultProduceTopic("t"))
	tx.BeginTransaction()
	tx.ProduceSync(ctx, &kgo.Record{Value: []byte("in txn")})
	tx.EndTransaction(ctx, kgo.TryCommit)
	tx.Close()
	cons, _ := kgo.NewClient(kgo.SeedBrokers(ln.Addr().String()), kgo.Dialer(dial), kgo.ConsumeTopics("t"), kgo.ConsumerGroup("g"))
	cons.PollFetches(ctx)
	cons.CommitUncommittedOffsets(ctx)
	cons.Close()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	os.MkdirAll("testdata/frames", 0o755)
	for k, b := range seen {
		if err := os.WriteFile(filepath.Join("testdata/frames", k+".bin"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("captured %d distinct request kinds", len(seen))
}

func FuzzReadFrame(f *testing.F) {
	for _, b := range loadFrames(f) {
		f.Add(b, int32(DefaultMaxFrameSize))
		f.Add(b, int32(len(b)/2))
	}
	f.Fuzz(func(t *testing.T, in []byte, max int32) {
		buf := bytebufferpool.Get()
		defer bytebufferpool.Put(buf)
		err := ReadFrame(bytes.NewReader(in), max, buf)
		if err != nil {
			return
		}
		if len(in) < 4 || int(binary.BigEndian.Uint32(in)) != len(buf.B) || !bytes.Equal(in[4:4+len(buf.B)], buf.B) || int32(len(buf.B)) > max {
			t.Fatalf("frame of %d bytes accepted wrongly", len(buf.B))
		}
	})
}

func FuzzParseRequestHeader(f *testing.F) {
	for _, b := range loadFrames(f) {
		f.Add(b[4:])
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := ParseRequestHeader(in)
		if err != nil {
			return
		}
		if h.Size > len(in) || h.Size < 10 {
			t.Fatalf("header size %d of a %d-byte frame", h.Size, len(in))
		}
		if h.Flexible && !h.Known {
			t.Fatal("flexible but unknown")
		}
		// Whatever parsed must be safe to hand to kmsg.
		if h.Known {
			r := kmsg.RequestForKey(h.Key)
			r.SetVersion(h.Version)
			_ = r.ReadFrom(in[h.Size:])
		}
	})
}
