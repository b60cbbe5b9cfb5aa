package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestServeKilledMidProduceLosesNothing: `ferry serve` killed with SIGKILL
// under a steady idempotent producer (franz-go, default settings) and
// started again on the same port. The producer sees no failed record, and
// every record it had acknowledged is in the cluster at its offset, once.
// The pause in acknowledgements is logged: it is what a client of a
// restarted member sees.
func TestServeKilledMidProduceLosesNothing(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, "r"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	kafkaAddr := deadAddr(t)
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: vc
listen: %s
admin_listen: 127.0.0.1:0
lanes: 1
clusters:
  - name: main
    bootstrap: [%s]
`, kafkaAddr, strings.Join(kf.ListenAddrs(), ", ")))
	serving := regexp.MustCompile(`"msg":"serving Kafka clients"`)
	p := startFerry(t, "serve", "--config", path)
	p.waitFor(t, serving, 60*time.Second)

	prod := newClient(t, kgo.SeedBrokers(kafkaAddr), kgo.DefaultProduceTopic("r"))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 3000
	var mu sync.Mutex
	var failed []error
	acked := map[string][2]int64{} // key → partition, offset
	var ackTimes []time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			r := &kgo.Record{Key: fmt.Appendf(nil, "k%05d", i), Value: []byte("v")}
			prod.Produce(ctx, r, func(r *kgo.Record, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = append(failed, err)
					return
				}
				acked[string(r.Key)] = [2]int64{int64(r.Partition), r.Offset}
				ackTimes = append(ackTimes, time.Now())
			})
			time.Sleep(2 * time.Millisecond)
		}
	}()
	// Kill once a third is acknowledged, then start again on the port.
	for {
		mu.Lock()
		k := len(acked)
		mu.Unlock()
		if k >= n/3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no acknowledgements before the kill")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	killedAt := time.Now()
	p2 := startFerry(t, "serve", "--config", path)
	p2.waitFor(t, serving, 60*time.Second)
	<-done
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		t.Fatalf("%d records failed across the restart, first: %v", len(failed), failed[0])
	}
	if len(acked) != n {
		t.Fatalf("%d records acknowledged, want %d", len(acked), n)
	}
	var pause time.Duration
	for i := 1; i < len(ackTimes); i++ {
		if ackTimes[i].After(killedAt) && ackTimes[i-1].Before(killedAt.Add(time.Second)) {
			pause = max(pause, ackTimes[i].Sub(ackTimes[i-1]))
		}
	}
	t.Logf("acknowledgements paused %v across the kill and restart", pause.Round(time.Millisecond))

	// Read back directly: every acknowledged record at its offset, once.
	cons := newClient(t, kgo.SeedBrokers(kf.ListenAddrs()...), kgo.ConsumeTopics("r"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	seen := map[string]bool{}
	for len(seen) < n {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read back %d of %d records", len(seen), n)
		}
		fs.EachRecord(func(r *kgo.Record) {
			k := string(r.Key)
			if seen[k] {
				t.Fatalf("record %s is in the cluster twice", k)
			}
			seen[k] = true
			if want, ok := acked[k]; !ok || want != [2]int64{int64(r.Partition), r.Offset} {
				t.Fatalf("record %s at %d/%d, acknowledged at %v", k, r.Partition, r.Offset, want)
			}
		})
	}
	p2.stop(t, 15*time.Second)
}
