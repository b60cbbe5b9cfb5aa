package proxy

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
)

// TestLargeProducesLeaveNoMemory: four clients each send a 64 MiB Produce
// at once; once they are answered, ferry_buffered_bytes is 0 again and,
// soon after, the heap in use is back near what it was before (the
// connections still open), without the test forcing a collection: nothing
// keeps the large buffers, and their memory is not left waiting for a
// collection that an idle member may not run for minutes.
func TestLargeProducesLeaveNoMemory(t *testing.T) {
	const clients, size = 4, 64 << 20
	// The records are zeros, which the broker refuses without keeping
	// them (kfake runs in this process): only what Ferry keeps counts.
	kf := newKfake(t, 1, kfake.SeedTopics(1, "big"))
	s, addr := startFerry(t, kf.ListenAddrs())

	conns := make([]net.Conn, clients)
	for i := range conns {
		conns[i] = dialRaw(t, addr)
		// A small produce first: the connections, upstream ones
		// included, exist before the measure.
		if p := rawProduce(t, conns[i], "big", 1); p.ErrorCode != 0 {
			t.Fatalf("small produce: error %d", p.ErrorCode)
		}
		// After it: rawProduce sets its own 30 s, which four 64 MiB
		// produces under -race on a busy machine can outlast.
		conns[i].SetDeadline(time.Now().Add(2 * time.Minute))
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapInuse

	frame := func() []byte {
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks, req.TimeoutMillis = 9, 1, 30000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = "big"
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = make([]byte, size)
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		b := protocol.AppendSize(nil)
		b = protocol.AppendRequestHeader(b, req, 2, "big")
		b = req.AppendTo(b)
		protocol.FinishSize(b, 0)
		return b
	}()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Write(frame); err != nil {
				errs <- err
				return
			}
			var size [4]byte
			if _, err := io.ReadFull(c, size[:]); err != nil {
				errs <- err
				return
			}
			_, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(size[:])))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	frame = nil
	testwait.Until(t, 30*time.Second, "ferry_buffered_bytes back to 0", func() bool { return testutil.ToFloat64(s.metrics.buffered) == 0 })
	// What go_memstats_heap_inuse_bytes shows: no collection is forced
	// here, as none is in a member once its clients are done.
	testwait.Eventually(t, 30*time.Second, "heap in use back within 32 MiB of before once the produces were answered", func() error {
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > before+32<<20 {
			return fmt.Errorf("heap in use %d MiB, %d MiB before: the large buffers are kept", ms.HeapInuse>>20, before>>20)
		}
		return nil
	})
	t.Logf("heap in use: %d MiB before, %d MiB after %d produces of %d MiB (held from the OS: %d MiB)", before>>20, ms.HeapInuse>>20, clients, size>>20, (ms.HeapSys-ms.HeapReleased)>>20)
}
