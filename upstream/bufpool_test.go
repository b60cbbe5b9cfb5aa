package upstream

import (
	"testing"

	"github.com/valyala/bytebufferpool"
)

// kept is how many large buffers l keeps.
func (l *largeFrames) kept() int {
	n := 0
	for _, c := range l.classes {
		n += len(c)
	}
	return n
}

// TestLargeFramesKept: a frame over keptFrom, given back, is kept apart and
// handed to the next frame of about its size (no new buffer, nothing to
// grow), never to a small frame nor to one it would overcharge (more than
// half as much again), whether it is over maxPooledBuf or not; what is kept
// stays within largeKeptBytes, the rest goes to the pool, or is dropped
// over maxPooledBuf.
func TestLargeFramesKept(t *testing.T) {
	for _, big := range []int{96 << 10, 2 << 20} {
		fp := FramePool{keepLarge: true}
		put := func(size int) {
			fp.Put(&bytebufferpool.ByteBuffer{B: make([]byte, size)})
		}
		put(big)
		small := func() *bytebufferpool.ByteBuffer { return &bytebufferpool.ByteBuffer{B: make([]byte, 0, 512)} }

		// A small frame, and a large one the kept buffer would
		// overcharge, keep their own buffer.
		for _, n := range []int{100, keptFrom, big*2/3 - 1} {
			buf := small()
			fp.Fit(buf, n)
			if cap(buf.B) != 512 {
				t.Fatalf("kept %d: a frame of %d bytes got a buffer of %d", big, n, cap(buf.B))
			}
		}
		// One too large for it grows its own.
		buf := small()
		fp.Fit(buf, big+1)
		if cap(buf.B) != 512 {
			t.Fatalf("kept %d: a frame of %d bytes got a buffer of %d", big, big+1, cap(buf.B))
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
			t.Fatalf("kept %d: a second frame got a buffer of %d: the kept one was handed out twice", big, cap(other.B))
		}
		// The smallest that fits is the one handed out, in a class
		// above the frame's or in its own.
		fp.Put(buf)
		put(big + big/4)
		for _, n := range []int{big, big - big/10} {
			buf = small()
			fp.Fit(buf, n)
			if cap(buf.B) != big {
				t.Fatalf("a frame of %d bytes got a buffer of %d, want the smallest that fits, %d", n, cap(buf.B), big)
			}
			fp.Put(buf)
		}

		// The bound: as many as fit in largeKeptBytes are kept, then none.
		for range largeKeptBytes / big {
			put(big)
		}
		if fp.large.bytes > largeKeptBytes {
			t.Fatalf("%d bytes kept, bound %d", fp.large.bytes, largeKeptBytes)
		}
		kept := fp.large.kept()
		put(big)
		if fp.large.kept() != kept {
			t.Fatalf("%d large buffers kept past the bound of %d bytes (%d before)", fp.large.kept(), largeKeptBytes, kept)
		}
	}

	// A pool whose frames grow as they are encoded keeps none.
	var enc FramePool
	enc.Put(&bytebufferpool.ByteBuffer{B: make([]byte, 2<<20)})
	if enc.large.kept() != 0 {
		t.Fatal("a pool of encoded frames kept a large buffer it could never fit")
	}
}

// TestSizeClasses: every capacity is in the class whose floor is the
// largest at or below it, so a class above a frame's has room for it.
func TestSizeClasses(t *testing.T) {
	for c := keptFrom + 1; c < 64<<20; c += c/7 + 1 {
		k := sizeClass(c)
		if classFloor(k) > c || classFloor(k+1) <= c {
			t.Fatalf("capacity %d in class %d, [%d, %d)", c, k, classFloor(k), classFloor(k+1))
		}
	}
	if k := sizeClass(1<<31 - 1); k >= len(largeFrames{}.classes) {
		t.Fatalf("the largest frame's class %d is past the classes", k)
	}
}

// TestGrowServesItsClass: a buffer grown for a frame is room for every
// frame of its size class, at most a quarter more than the frame, and once
// kept is handed to the next frames of that class, larger ones included
// (each spliced Produce a little larger than the last would otherwise be
// allocated anew).
func TestGrowServesItsClass(t *testing.T) {
	for _, n := range []int{keptFrom + 1, 100 << 10, 300<<10 + 7, 1 << 20, 3<<20 - 1} {
		fp := FramePool{keepLarge: true}
		buf := &bytebufferpool.ByteBuffer{B: make([]byte, 0, 512)}
		fp.Grow(buf, n)
		c := cap(buf.B)
		if c < n || c > n+n/4 || sizeClass(c) != sizeClass(n) {
			t.Fatalf("frame of %d: grown to %d (class %d, the frame's %d)", n, c, sizeClass(c), sizeClass(n))
		}
		fp.Put(buf)
		next := &bytebufferpool.ByteBuffer{B: make([]byte, 0, 512)}
		fp.Fit(next, c) // the largest frame of the class
		if cap(next.B) != c {
			t.Fatalf("frame of %d: the next frame of %d got a buffer of %d, not the kept %d", n, c, cap(next.B), c)
		}
	}
	// Room already: left as it is.
	buf := &bytebufferpool.ByteBuffer{B: make([]byte, 0, 200<<10)}
	(&FramePool{}).Grow(buf, 150<<10)
	if cap(buf.B) != 200<<10 {
		t.Fatalf("a buffer with room was replaced: %d", cap(buf.B))
	}
}
