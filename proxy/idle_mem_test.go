package proxy

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestIdleConnectionMemory: what an idle client connection holds — its
// two goroutines, a small read buffer, its bookkeeping — stays under
// maxIdleConnBytes of heap and stack; the 32 KiB answer buffer is taken
// from a pool only while answers are written. (Each connection held two
// 32 KiB buffers for its whole life before: 10,000 idle clients cost a
// member 640 MiB.)
func TestIdleConnectionMemory(t *testing.T) {
	const conns = 500
	const maxIdleConnBytes = 32 << 10
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	_, addr := startFerry(t, kf.ListenAddrs())
	held := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	// One connection first: the pools and the server's lazily built
	// state are not the connections' cost.
	warm := dialRaw(t, addr)
	writeReq(t, warm, kmsg.NewPtrApiVersionsRequest(), 1)
	readResp(t, warm)
	// The baseline once what earlier tests left has been freed: memory
	// freed during the measurement would hide the connections' cost (and
	// once made the difference negative, which unsigned arithmetic
	// reported as 36893488147392446 bytes per connection).
	var before uint64
	testwait.Eventually(t, 10*time.Second, "the heap settled before the connections", func() error {
		a, b := held(), held()
		if max(a, b)-min(a, b) > 64<<10 {
			return fmt.Errorf("heap and stack in use moved from %d to %d bytes", a, b)
		}
		before = b
		return nil
	})
	for i := range conns {
		c := dialRaw(t, addr)
		writeReq(t, c, kmsg.NewPtrApiVersionsRequest(), int32(i))
		readResp(t, c)
	}
	var per int64
	testwait.Eventually(t, 10*time.Second, "idle connections' memory settled under the bound", func() error {
		grew := int64(held()) - int64(before)
		if grew <= 0 {
			return fmt.Errorf("heap and stack in use fell %d bytes below the baseline with %d connections open: other memory was freed meanwhile", -grew, conns)
		}
		per = grew / conns
		if per > maxIdleConnBytes {
			return fmt.Errorf("%d bytes of heap and stack per idle connection, want at most %d", per, maxIdleConnBytes)
		}
		return nil
	})
	t.Logf("%d idle connections: %d bytes of heap and stack each (both ends: the test's client side is in this process too)", conns, per)
}
