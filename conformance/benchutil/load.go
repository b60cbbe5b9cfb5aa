package benchutil

// A franz-go load generator: clients in the benchmark's process, one per
// run, with the options the caller passes (bootstrap, compression, TLS).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// RunResult is one measured run of one path.
type RunResult struct {
	Records int64
	Bytes   int64 // record value bytes acknowledged or consumed
	Elapsed time.Duration
	Lats    []time.Duration // produce only: per record, sorted
	CPU     time.Duration   // CPU time of the path's process during the run, if it has one
}

// MBps is record value throughput in MB/s (10^6 bytes).
func (r RunResult) MBps() float64 { return float64(r.Bytes) / 1e6 / r.Elapsed.Seconds() }

// RPS is records per second.
func (r RunResult) RPS() float64 { return float64(r.Records) / r.Elapsed.Seconds() }

// Pct is the q-quantile (0..1) of the produce latencies.
func (r RunResult) Pct(q float64) time.Duration {
	if len(r.Lats) == 0 {
		return 0
	}
	i := int(q * float64(len(r.Lats)))
	return r.Lats[min(i, len(r.Lats)-1)]
}

// Produce produces to topic for d with a client made of opts, as fast as
// the client takes records when rate is 0, else paced at rate records per
// second. A record's latency runs from just before Produce (so it includes
// waiting for buffer space) to its acknowledgement.
func Produce(ctx context.Context, opts []kgo.Opt, topic string, values [][]byte, d time.Duration, rate float64) (RunResult, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return RunResult{}, err
	}
	defer cl.Close()
	// Metadata, connections and the producer ID come before the clock
	// starts.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: values[0]}).FirstErr(); err != nil {
		return RunResult{}, fmt.Errorf("first record: %w", err)
	}

	acks := NewAcks(true)
	send := func(v []byte) {
		start := time.Now()
		cl.Produce(ctx, &kgo.Record{Topic: topic, Value: v}, func(r *kgo.Record, err error) {
			acks.Ack(r, time.Since(start), err)
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
	if err := acks.Flush(ctx, cl); err != nil {
		return RunResult{}, err
	}
	res := RunResult{Records: acks.Records, Bytes: acks.Bytes, Elapsed: time.Since(start), Lats: acks.Lats}
	slices.Sort(res.Lats)
	return res, nil
}

// Consume reads at least n records from the start of every partition of
// topic with a client made of opts, without a group, and measures from the
// first poll to the last.
func Consume(ctx context.Context, opts []kgo.Opt, topic string, partitions int, n int64) (RunResult, error) {
	offsets := make(map[int32]kgo.Offset, partitions)
	for p := range partitions {
		offsets[int32(p)] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(append(slices.Clip(opts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}))...)
	if err != nil {
		return RunResult{}, err
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return RunResult{}, err
	}
	var res RunResult
	start := time.Now()
	for res.Records < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return RunResult{}, err
		}
		var errs []error
		fs.EachError(func(t string, p int32, err error) {
			errs = append(errs, fmt.Errorf("%s[%d]: %w", t, p, err))
		})
		if len(errs) > 0 {
			return RunResult{}, errors.Join(errs...)
		}
		fs.EachRecord(func(r *kgo.Record) {
			res.Records++
			res.Bytes += int64(len(r.Value))
		})
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// Median of f over rs; 0 for none.
func Median(rs []RunResult, f func(RunResult) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	slices.Sort(vs)
	if len(vs)%2 == 0 {
		return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return vs[len(vs)/2]
}
