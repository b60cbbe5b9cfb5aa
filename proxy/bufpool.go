package proxy

import "github.com/valyala/bytebufferpool"

// Frames are pooled by direction. Client requests and broker answers have
// different size profiles (a fetch answer is megabytes, most requests are
// bytes), and a pool calibrated over both keeps the large buffers of
// neither, so every large fetch answer would be allocated anew.
var (
	requestBufs  bytebufferpool.Pool // client request frames
	responseBufs bytebufferpool.Pool // upstream response frames
)
