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
	RequestBufs  = FramePool{charged: true} // client request frames
	ResponseBufs = FramePool{charged: true} // upstream response frames
	// encodedBufs hold requests and answers Ferry encodes itself.
	EncodedBufs FramePool
)

// maxPooledBuf is the largest buffer kept for reuse. A pool keeps what it
// is given for as long as it is used, so a burst of 100 MiB requests would
// stay in memory for good; allocating a large frame anew costs little
// next to reading it.
const maxPooledBuf = 1 << 20

// framePool is a bytebufferpool.Pool that drops buffers over maxPooledBuf,
// and releases the memory budget a buffer was charged with (budget.go) if
// its buffers are charged.
type FramePool struct {
	p       bytebufferpool.Pool
	charged bool
}

func (fp *FramePool) Get() *bytebufferpool.ByteBuffer { return fp.p.Get() }

// Put releases buf's charge, and keeps it for reuse unless it is large:
// then it is dropped, and its memory reclaimed (largeBufs).
func (fp *FramePool) Put(buf *bytebufferpool.ByteBuffer) {
	if fp.charged {
		ReleaseBuf(buf)
	}
	if n := cap(buf.B); n > maxPooledBuf {
		largeBufs.dropped(n)
		return
	}
	fp.p.Put(buf)
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
