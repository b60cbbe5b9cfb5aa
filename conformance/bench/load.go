package main

// The load generator (benchutil.Produce and Consume): franz-go clients in
// this process, one per run, with the client's defaults except lz4 (so acks=all, idempotent, 10 ms linger,
// one produce request in flight per broker).

import (
	"context"
	"strings"
	"time"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/benchutil"
)

// runResult is one measured run of one path.
type runResult = benchutil.RunResult

func baseOpts(bootstrap string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()),
	}
}

// produce produces for d (benchutil.Produce).
func produce(ctx context.Context, bootstrap, topic string, values [][]byte, d time.Duration, rate float64) (runResult, error) {
	return benchutil.Produce(ctx, baseOpts(bootstrap), topic, values, d, rate)
}

// consume reads at least n records from the start of every partition of
// topic (benchutil.Consume).
func consume(ctx context.Context, bootstrap, topic string, partitions int, n int64) (runResult, error) {
	return benchutil.Consume(ctx, baseOpts(bootstrap), topic, partitions, n)
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
