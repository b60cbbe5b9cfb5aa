package proxy

import "github.com/valyala/bytebufferpool"

// Frames are pooled by direction. Client requests and broker answers have
// different size profiles (a fetch answer is megabytes, most requests are
// bytes), and a pool calibrated over both keeps the large buffers of
// neither, so every large fetch answer would be allocated anew.
var (
	requestBufs  = framePool{charged: true} // client request frames
	responseBufs = framePool{charged: true} // upstream response frames
	// encodedBufs hold requests and answers Ferry encodes itself.
	encodedBufs framePool
)

// maxPooledBuf is the largest buffer kept for reuse. A pool keeps what it
// is given for as long as it is used, so a burst of 100 MiB requests would
// stay in memory for good; allocating a large frame anew costs little
// next to reading it.
const maxPooledBuf = 1 << 20

// framePool is a bytebufferpool.Pool that drops buffers over maxPooledBuf,
// and releases the memory budget a buffer was charged with (budget.go) if
// its buffers are charged.
type framePool struct {
	p       bytebufferpool.Pool
	charged bool
}

func (fp *framePool) Get() *bytebufferpool.ByteBuffer { return fp.p.Get() }

// Put releases buf's charge, and keeps it for reuse unless it is large.
func (fp *framePool) Put(buf *bytebufferpool.ByteBuffer) {
	if fp.charged {
		releaseBuf(buf)
	}
	if cap(buf.B) > maxPooledBuf {
		return
	}
	fp.p.Put(buf)
}
