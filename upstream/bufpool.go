package upstream

import (
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

// maxPooledBuf is the largest buffer kept for reuse. A pool keeps what it
// is given for as long as it is used, so a burst of 100 MiB requests would
// stay in memory for good; allocating a large frame anew costs little
// next to reading it.
const maxPooledBuf = 1 << 20

// Frames over maxPooledBuf (a producer's requests at full speed: franz-go
// puts up to a megabyte per partition in one, so two or three partitions a
// broker make them 2–3 MiB) are kept apart from the others, up to
// largeKeptBytes in all, and handed only to a frame of about their size
// (Fit): a small request never holds one, and so is never charged a large
// buffer's capacity against its budget. Dropped, each such frame cost
// twice its size in allocations as ReadFrameBody grew a buffer for it, and
// a copy: the largest part of what Ferry added to a producer's bytes at
// full speed (BenchmarkProduceThrough, the 1.1 MiB case: 3.2 MB allocated
// a request before, none after). Bounded, they are what an idle member
// keeps after a burst of large frames; the rest is dropped and reclaimed
// (largeBufs).
const largeKeptBytes = 32 << 20

// framePool is a bytebufferpool.Pool that keeps buffers over maxPooledBuf
// apart (large), and releases the memory budget a buffer was charged with
// (budget.go) if its buffers are charged.
type FramePool struct {
	p         bytebufferpool.Pool
	large     largeFrames
	charged   bool
	keepLarge bool // its frames' sizes are known before they are read (Fit)
}

func (fp *FramePool) Get() *bytebufferpool.ByteBuffer { return fp.p.Get() }

// Fit gives buf, uncharged and about to hold a frame of n bytes, a kept
// large buffer with room for it, when n is over maxPooledBuf and one of
// about its size is kept; otherwise buf is left as it is, to grow with the
// bytes that arrive (ReadFrameBody). buf's own buffer goes back to the
// pool.
func (fp *FramePool) Fit(buf *bytebufferpool.ByteBuffer, n int) {
	if n <= maxPooledBuf || cap(buf.B) >= n {
		return
	}
	if lb := fp.large.take(n); lb != nil {
		buf.B, lb.B = lb.B[:0], buf.B[:0]
		fp.p.Put(lb)
	}
}

// Put releases buf's charge and keeps it for reuse: apart if it is over
// maxPooledBuf, or dropped (and its memory reclaimed, largeBufs) when the
// large ones kept are at their bound.
func (fp *FramePool) Put(buf *bytebufferpool.ByteBuffer) {
	if fp.charged {
		ReleaseBuf(buf)
	}
	if n := cap(buf.B); n > maxPooledBuf {
		if !fp.keepLarge || !fp.large.keep(buf) {
			largeBufs.dropped(n)
		}
		return
	}
	fp.p.Put(buf)
}

// largeFrames are the large buffers kept, up to largeKeptBytes: a few, so
// a list searched whole.
type largeFrames struct {
	mu    sync.Mutex
	bufs  []*bytebufferpool.ByteBuffer
	bytes int
}

// take returns the smallest kept buffer with room for n bytes and at most
// half as much again (the charge counts its capacity), or nil.
func (l *largeFrames) take(n int) *bytebufferpool.ByteBuffer {
	l.mu.Lock()
	defer l.mu.Unlock()
	best := -1
	for i, b := range l.bufs {
		if c := cap(b.B); c >= n && c <= n+n/2 && (best < 0 || c < cap(l.bufs[best].B)) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := l.bufs[best]
	l.bufs[best] = l.bufs[len(l.bufs)-1]
	l.bufs[len(l.bufs)-1] = nil
	l.bufs = l.bufs[:len(l.bufs)-1]
	l.bytes -= cap(b.B)
	return b
}

// keep keeps buf unless that would pass largeKeptBytes, and reports
// whether it did.
func (l *largeFrames) keep(buf *bytebufferpool.ByteBuffer) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bytes+cap(buf.B) > largeKeptBytes {
		return false
	}
	buf.B = buf.B[:0]
	l.bufs = append(l.bufs, buf)
	l.bytes += cap(buf.B)
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
