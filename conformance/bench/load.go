package main

// The load generator: franz-go clients in this process, one per run, with
// the client's defaults except lz4 (so acks=all, idempotent, 10 ms linger,
// one produce request in flight per broker).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
)

// run is one measured run of one path.
type runResult struct {
	records int64
	bytes   int64 // record value bytes acknowledged or consumed
	elapsed time.Duration
	lats    []time.Duration // produce only: per record, sorted
	cpu     time.Duration   // Ferry's CPU time during the run; Ferry runs only
}

// mbps is record value throughput in MB/s (10^6 bytes).
func (r runResult) mbps() float64 { return float64(r.bytes) / 1e6 / r.elapsed.Seconds() }

// rps is records per second.
func (r runResult) rps() float64 { return float64(r.records) / r.elapsed.Seconds() }

// pct is the q-quantile (0..1) of the produce latencies.
func (r runResult) pct(q float64) time.Duration {
	if len(r.lats) == 0 {
		return 0
	}
	i := int(q * float64(len(r.lats)))
	return r.lats[min(i, len(r.lats)-1)]
}

func baseOpts(bootstrap string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()),
	}
}

// produce produces for d, as fast as the client takes records when rate is
// 0, else paced at rate records per second. A record's latency runs from
// just before Produce (so it includes waiting for buffer space) to its
// acknowledgement.
func produce(ctx context.Context, bootstrap, topic string, values [][]byte, d time.Duration, rate float64) (runResult, error) {
	cl, err := kgo.NewClient(baseOpts(bootstrap)...)
	if err != nil {
		return runResult{}, err
	}
	defer cl.Close()
	// Metadata, connections and the producer ID come before the clock
	// starts.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: values[0]}).FirstErr(); err != nil {
		return runResult{}, fmt.Errorf("first record: %w", err)
	}

	var (
		mu      sync.Mutex
		res     runResult
		lats    = make([]time.Duration, 0, 1<<20)
		failure error
	)
	send := func(v []byte) {
		start := time.Now()
		cl.Produce(ctx, &kgo.Record{Topic: topic, Value: v}, func(r *kgo.Record, err error) {
			lat := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if failure == nil {
					failure = err
				}
				return
			}
			lats = append(lats, lat)
			res.records++
			res.bytes += int64(len(r.Value))
		})
	}

	start := time.Now()
	end := start.Add(d)
	n := 0
	if rate <= 0 {
		for ctx.Err() == nil && time.Now().Before(end) {
			send(values[n%len(values)])
			n++
		}
	} else {
		// Produce what is due every half millisecond: the schedule is
		// kept exactly even if a tick comes late.
		for ctx.Err() == nil {
			now := time.Now()
			if !now.Before(end) {
				break
			}
			due := int(rate * now.Sub(start).Seconds())
			for ; n < due; n++ {
				send(values[n%len(values)])
			}
			time.Sleep(500 * time.Microsecond)
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return runResult{}, err
	}
	res.elapsed = time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	if failure != nil {
		return runResult{}, failure
	}
	slices.Sort(lats)
	res.lats = lats
	return res, nil
}

// consume reads at least n records from the start of every partition of
// topic, without a group, and measures from the first poll to the last.
func consume(ctx context.Context, bootstrap, topic string, partitions int, n int64) (runResult, error) {
	offsets := make(map[int32]kgo.Offset, partitions)
	for p := range partitions {
		offsets[int32(p)] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(append(baseOpts(bootstrap),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}))...)
	if err != nil {
		return runResult{}, err
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return runResult{}, err
	}
	var res runResult
	start := time.Now()
	for res.records < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return runResult{}, err
		}
		var errs []error
		fs.EachError(func(t string, p int32, err error) {
			errs = append(errs, fmt.Errorf("%s[%d]: %w", t, p, err))
		})
		if len(errs) > 0 {
			return runResult{}, errors.Join(errs...)
		}
		fs.EachRecord(func(r *kgo.Record) {
			res.records++
			res.bytes += int64(len(r.Value))
		})
	}
	res.elapsed = time.Since(start)
	return res, nil
}

// lz4Ratio is how much lz4 shrinks a batch-sized run of vs.
func lz4Ratio(vs [][]byte) float64 {
	var src []byte
	for _, v := range vs {
		if len(src) >= 64<<10 {
			break
		}
		src = append(src, v...)
	}
	dst := make([]byte, lz4.CompressBlockBound(len(src)))
	n, err := lz4.CompressBlock(src, dst, nil)
	if err != nil || n == 0 {
		return 1
	}
	return float64(len(src)) / float64(n)
}
