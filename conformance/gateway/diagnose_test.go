package gateway

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// tailBuffer keeps the last max bytes written to it: a client's debug log,
// printed only when a test fails.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if over := len(w.b) - w.max; over > 0 {
		w.b = append(w.b[:0], w.b[over:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// diagnoseOnFailure registers what a failed failover test prints: each
// partition's leader and end offset as the cluster and as Ferry see them,
// the client's log tail, and every goroutine of this process (Ferry runs
// in it). The broker-kill test has stalled rarely, and this is what would
// tell where.
func diagnoseOnFailure(t *testing.T, topic string, direct, via *kadm.Client, clientLog *tailBuffer) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		for _, side := range []struct {
			name string
			adm  *kadm.Client
		}{{"cluster", direct}, {"through Ferry", via}} {
			md, err := side.adm.Metadata(ctx, topic)
			if err != nil {
				t.Logf("%s: metadata: %v", side.name, err)
				continue
			}
			ends, err := side.adm.ListEndOffsets(ctx, topic)
			var parts []string
			for _, p := range md.Topics[topic].Partitions.Sorted() {
				end, _ := ends.Lookup(topic, p.Partition)
				parts = append(parts, fmt.Sprintf("p%d leader %d epoch %d isr %v end %d", p.Partition, p.Leader, p.LeaderEpoch, p.ISR, end.Offset))
			}
			sort.Strings(parts)
			t.Logf("%s (end offsets err %v): %v; brokers %v", side.name, err, parts, md.Brokers.NodeIDs())
		}
		t.Logf("consumer log tail:\n%s", clientLog)
		var g bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&g, 1)
		t.Logf("goroutines:\n%s", g.String())
	})
}
