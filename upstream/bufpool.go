package upstream

import (
	"math/bits"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/bytebufferpool"
)

// Frames are pooled by direction. Client requests and broker answers have
// different size profiles (a fetch answer is megabytes, most requests are
// bytes), and a pool calibrated over both keeps the large buffers of
// neither, so every large fetch answer would be allocated anew.
var (
	RequestBufs  = FramePool{charged: true, keepLarge: true} // client request frames
	ResponseBufs = FramePool{charged: true, keepLarge: true} // upstream response frames
	// encodedBufs hold requests and answers Ferry encodes itself, which
	// grow as they are encoded: a large one kept would never be fitted.
	EncodedBufs FramePool
)

// maxPooledBuf is the largest buffer the pool keeps for reuse (larger ones
// are kept apart, a bounded few: largeKeptBytes). A pool keeps what it is
// given for as long as it is used, so a burst of 100 MiB requests would
// stay in memory for good.
const maxPooledBuf = 1 << 20

// Frames over keptFrom (where ReadFrameBody starts growing a buffer with
// the bytes that arrive) are kept apart from the others, up to
// largeKeptBytes in all, and handed only to a frame of about their size
// (Fit): a small request never holds one, and so is never charged a large
// buffer's capacity against its budget. Kept with the others,
// bytebufferpool drops whatever is larger than 95 % of what it is given
// (its calibration), so on a member whose producers' requests are fewer
// than one in twenty (consumers' fetches, heartbeats) every one of them
// was dropped; and buffers over maxPooledBuf (a producer's requests at full
// speed: franz-go puts up to a megabyte a partition in one) always were.
// Each such frame then cost twice its size in allocations as ReadFrameBody
// grew a buffer for it, and a copy: the largest part of what Ferry added to
// a producer's bytes (BenchmarkProduceThrough: 3.2 MB allocated for a
// 1.1 MiB request before, none after; 150 KB for a 96 KiB one among
// another client's small requests). Bounded, they are what an idle member
// keeps after a burst of large frames; past the bound the others go to the
// pool as before, or over maxPooledBuf are dropped and reclaimed
// (largeBufs).
const (
	keptFrom       = 64 << 10
	largeKeptBytes = 32 << 20
)

// framePool is a bytebufferpool.Pool that keeps buffers over keptFrom apart
// (large), and releases the memory budget a buffer was charged with
// (budget.go) if its buffers are charged.
type FramePool struct {
	p         bytebufferpool.Pool
	large     largeFrames
	charged   bool
	keepLarge bool // its frames' sizes are known before they are read (Fit)
}

func (fp *FramePool) Get() *bytebufferpool.ByteBuffer { return fp.p.Get() }

// Fit gives buf, uncharged and about to hold a frame of n bytes, a kept
// large buffer with room for it, when n is over keptFrom, buf has no room
// for it and one of about its size is kept; otherwise buf is left as it
// is, to grow with the bytes that arrive (ReadFrameBody). buf's own buffer
// goes back to the pool.
func (fp *FramePool) Fit(buf *bytebufferpool.ByteBuffer, n int) {
	if n <= keptFrom || cap(buf.B) >= n {
		return
	}
	if lb := fp.large.take(n); lb != nil {
		buf.B, lb.B = lb.B[:0], buf.B[:0]
		fp.p.Put(lb)
	}
}

// Put releases buf's charge and keeps it for reuse: apart if it is over
// keptFrom and the large ones kept are under their bound; else in the pool,
// or, over maxPooledBuf, dropped (and its memory reclaimed, largeBufs).
func (fp *FramePool) Put(buf *bytebufferpool.ByteBuffer) {
	if fp.charged {
		ReleaseBuf(buf)
	}
	n := cap(buf.B)
	if n > keptFrom && fp.keepLarge && fp.large.keep(buf) {
		return
	}
	if n > maxPooledBuf {
		largeBufs.dropped(n)
		return
	}
	fp.p.Put(buf)
}

// largeFrames are the large buffers kept, up to largeKeptBytes, by size
// class: four classes to each power of two, so a buffer of a class above a
// frame's always has room for it, and one of its own class may.
type largeFrames struct {
	mu      sync.Mutex
	classes [128][]*bytebufferpool.ByteBuffer
	bytes   int
}

// Grow gives buf, about to hold a frame of n bytes over keptFrom that Fit
// found no kept buffer for, a new buffer with room for every frame of n's
// size class (at most a quarter more than n), so that once kept it serves
// the next frames of about its size instead of each one a little larger
// than the last being allocated anew. For a frame read whole before its
// bytes arrive (a spliced Produce): ReadFrameBody grows with the bytes.
func (fp *FramePool) Grow(buf *bytebufferpool.ByteBuffer, n int) {
	if c := GrowCap(buf, n); c > cap(buf.B) {
		buf.B = make([]byte, 0, c)
	}
}

// GrowCap is the capacity buf has once Grow made room for a frame of n
// bytes: what to charge it before it grows (the allocation waits for the
// budget's admission).
func GrowCap(buf *bytebufferpool.ByteBuffer, n int) int {
	switch {
	case cap(buf.B) >= n:
		return cap(buf.B)
	case n > keptFrom:
		return classFloor(sizeClass(n)+1) - 1
	}
	return n
}

// sizeClass is the class of a capacity c over keptFrom.
func sizeClass(c int) int {
	l := bits.Len(uint(c)) // c in [2^(l-1), 2^l)
	return (l-1)*4 + int(uint(c)>>(l-3))&3
}

// classFloor is the smallest capacity of class k.
func classFloor(k int) int {
	return 1<<(k/4) + (k%4)<<(k/4-2)
}

// take returns a kept buffer with room for n bytes and at most half as much
// again (the charge counts its capacity), from the smallest class that has
// one, or nil.
func (l *largeFrames) take(n int) *bytebufferpool.ByteBuffer {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := sizeClass(n); k < len(l.classes) && classFloor(k) <= n+n/2; k++ {
		bufs := l.classes[k]
		for i := len(bufs) - 1; i >= 0; i-- {
			b := bufs[i]
			if c := cap(b.B); c < n || c > n+n/2 {
				continue
			}
			bufs[i] = bufs[len(bufs)-1]
			bufs[len(bufs)-1] = nil
			l.classes[k] = bufs[:len(bufs)-1]
			l.bytes -= cap(b.B)
			return b
		}
	}
	return nil
}

// keep keeps buf unless that would pass largeKeptBytes, and reports
// whether it did.
func (l *largeFrames) keep(buf *bytebufferpool.ByteBuffer) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := cap(buf.B)
	k := sizeClass(c)
	if l.bytes+c > largeKeptBytes || k >= len(l.classes) {
		return false
	}
	buf.B = buf.B[:0]
	l.classes[k] = append(l.classes[k], buf)
	l.bytes += c
	return true
}

// A large buffer dropped is garbage, but its memory is used again, or
// given back to the OS, only after the runtime's next collection. With
// GOGC's default the heap may grow to twice what was live at the last
// collection, and a collection during a burst of large requests saw them
// live: once the burst is over, a member that allocates little may not
// collect again for minutes (the runtime forces one every 2), holding
// hundreds of MiB that ferry_buffered_bytes no longer counts. So once the
// large buffers dropped since the last time add up to reclaimAfter, and no
// more has been dropped for reclaimQuiet (or reclaimMaxDelay has passed,
// under a steady flow of them), Ferry has the runtime collect and return
// the freed memory to the OS. Under a steady flow nothing is gained by
// returning memory that is about to be allocated again, hence the wait.
const (
	reclaimAfter    = 32 << 20
	reclaimQuiet    = time.Second
	reclaimMaxDelay = 10 * time.Second
)

// largeBufs counts the large buffers dropped, for the whole process (the
// pools are).
var largeBufs = newReclaimer()

// reclaimer has the memory of dropped large buffers collected and given
// back, in a goroutine of its own started at the first need.
type reclaimer struct {
	pending atomic.Int64 // bytes dropped since the last free
	last    atomic.Int64 // when the last one was dropped (UnixNano)
	kick    chan struct{}
	start   sync.Once
}

func newReclaimer() *reclaimer {
	return &reclaimer{kick: make(chan struct{}, 1)}
}

// dropped records a large buffer of n bytes dropped.
func (r *reclaimer) dropped(n int) {
	r.last.Store(time.Now().UnixNano())
	if r.pending.Add(int64(n)) < reclaimAfter {
		return
	}
	r.start.Do(func() { go r.loop() })
	select {
	case r.kick <- struct{}{}:
	default: // a reclaim is coming
	}
}

func (r *reclaimer) loop() {
	for range r.kick {
		first := time.Now()
		for {
			quietAt := time.Unix(0, r.last.Load()).Add(reclaimQuiet)
			wait := min(time.Until(quietAt), time.Until(first.Add(reclaimMaxDelay)))
			if wait <= 0 {
				break
			}
			time.Sleep(wait)
		}
		r.pending.Store(0)
		debug.FreeOSMemory()
	}
}
