package upstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-gw/ferry/protocol"
)

// BenchmarkMixedFramesCharged reads request frames as the reader does
// (a pooled buffer, its charge, its body, back to the pool), one of 64 KiB
// for every three of 200 bytes: the charge must not cost the small frames
// a buffer of their own where the pool has a larger one.
func BenchmarkMixedFramesCharged(b *testing.B) {
	frame := func(n int) []byte {
		f := binary.BigEndian.AppendUint32(nil, uint32(n))
		return append(f, make([]byte, n)...)
	}
	small, large := frame(200), frame(64<<10)
	mb := &Budget{limit: 1 << 40, connLimit: 1 << 40, gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})}
	cm := mb.Conn(0)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		f := small
		if i%4 == 0 {
			f = large
		}
		r := bytes.NewReader(f)
		buf := RequestBufs.Get()
		n, _ := protocol.ReadFrameSize(r, 1<<30)
		cm.Admit(context.Background(), buf, n)
		protocol.ReadFrameBody(r, n, buf)
		RequestBufs.Put(buf)
	}
}
