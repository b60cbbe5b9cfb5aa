package upstream

import (
	"testing"

	"github.com/valyala/bytebufferpool"
)

// TestLargeFramesKept: a frame over maxPooledBuf, given back, is kept apart
// and handed to the next frame of about its size (no new buffer, nothing to
// grow), never to a small frame nor to one it would overcharge (more than
// half as much again); what is kept stays within largeKeptBytes, the rest
// dropped.
func TestLargeFramesKept(t *testing.T) {
	fp := FramePool{keepLarge: true}
	const big = 2 << 20
	put := func(size int) {
		fp.Put(&bytebufferpool.ByteBuffer{B: make([]byte, size)})
	}
	put(big)
	small := func() *bytebufferpool.ByteBuffer { return &bytebufferpool.ByteBuffer{B: make([]byte, 0, 512)} }

	// A small frame, and a large one the kept buffer would overcharge,
	// keep their own buffer.
	for _, n := range []int{100, maxPooledBuf, big*2/3 - 1} {
		buf := small()
		fp.Fit(buf, n)
		if cap(buf.B) != 512 {
			t.Fatalf("a frame of %d bytes got a buffer of %d", n, cap(buf.B))
		}
	}
	// One too large for it grows its own.
	buf := small()
	fp.Fit(buf, big+1)
	if cap(buf.B) != 512 {
		t.Fatalf("a frame of %d bytes got a buffer of %d", big+1, cap(buf.B))
	}
	// One it fits takes it, empty, and only one does.
	buf = small()
	fp.Fit(buf, big-1000)
	if cap(buf.B) != big || len(buf.B) != 0 {
		t.Fatalf("a frame of %d bytes got a buffer of %d (length %d), want the kept %d", big-1000, cap(buf.B), len(buf.B), big)
	}
	other := small()
	fp.Fit(other, big-1000)
	if cap(other.B) != 512 {
		t.Fatalf("a second frame got a buffer of %d: the kept one was handed out twice", cap(other.B))
	}
	// The smallest that fits is the one handed out.
	fp.Put(buf)
	put(big + big/4)
	buf = small()
	fp.Fit(buf, big)
	if cap(buf.B) != big {
		t.Fatalf("a frame of %d bytes got a buffer of %d, want the smallest that fits, %d", big, cap(buf.B), big)
	}

	// The bound: as many as fit in largeKeptBytes are kept, then none.
	for range largeKeptBytes / big {
		put(big)
	}
	if fp.large.bytes > largeKeptBytes {
		t.Fatalf("%d bytes kept, bound %d", fp.large.bytes, largeKeptBytes)
	}
	kept := len(fp.large.bufs)
	put(big)
	if len(fp.large.bufs) != kept {
		t.Fatalf("%d large buffers kept past the bound of %d bytes (%d before)", len(fp.large.bufs), largeKeptBytes, kept)
	}

	// A pool whose frames grow as they are encoded keeps none.
	var enc FramePool
	enc.Put(&bytebufferpool.ByteBuffer{B: make([]byte, big)})
	if len(enc.large.bufs) != 0 {
		t.Fatal("a pool of encoded frames kept a large buffer it could never fit")
	}
}
