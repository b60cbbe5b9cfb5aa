package main

// The load and the checks: franz-go clients in this process. The load
// writes records with a key naming their partition and sequence, so that
// a record copied to the target can be found on the source whatever offset
// it landed at.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// valuePool is how many distinct record values the load (and the ceiling's
// payload file) draws from: enough that a ~1 MB batch rarely holds the same
// value twice, so codecs see text-like data, not repeats.
const valuePool = 32768

// writePayloadFile writes vs one a line, for ProducerPerformance.
func writePayloadFile(path string, vs [][]byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for _, v := range vs {
		w.Write(v)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func codecOpt(codec string) kgo.CompressionCodec {
	switch codec {
	case "gzip":
		return kgo.GzipCompression()
	case "snappy":
		return kgo.SnappyCompression()
	case "lz4":
		return kgo.Lz4Compression()
	case "zstd":
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

func newClient(bootstrap string, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(bootstrap, ",")...)}, opts...)...)
}

// recordKey names a record's partition and its sequence there.
func recordKey(partition int32, seq int64) []byte {
	return fmt.Appendf(nil, "p%03d-%010d", partition, seq)
}

// parseKey is recordKey's inverse.
func parseKey(k []byte) (partition int32, seq int64, ok bool) {
	ps, ss, found := strings.Cut(string(k), "-")
	if !found || len(ps) < 2 || ps[0] != 'p' {
		return 0, 0, false
	}
	p, err1 := strconv.ParseInt(ps[1:], 10, 32)
	s, err2 := strconv.ParseInt(ss, 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return int32(p), s, true
}

// loadResult is the source load of one variant.
type loadResult struct {
	records int64
	bytes   int64 // record value bytes
	elapsed time.Duration
}

func (r loadResult) mbps() float64 { return float64(r.bytes) / 1e6 / r.elapsed.Seconds() }

// produceSource writes n records round-robin over the partitions of topic:
// key recordKey, value from vs, one header, franz-go's defaults otherwise
// (acks=all, idempotent, 10 ms linger, batches up to ~1 MB) and codec.
func produceSource(ctx context.Context, bootstrap, topic, codec string, partitions int, n int64, vs [][]byte, batchBytes int32) (loadResult, error) {
	opts := []kgo.Opt{kgo.ProducerBatchCompression(codecOpt(codec)),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(topic)}
	if batchBytes > 0 {
		opts = append(opts, kgo.ProducerBatchMaxBytes(batchBytes))
	}
	cl, err := newClient(bootstrap, opts...)
	if err != nil {
		return loadResult{}, err
	}
	defer cl.Close()
	acks := benchutil.NewAcks(false)
	rng := rand.New(rand.NewPCG(3, 4))
	start := time.Now()
	for i := int64(0); i < n && ctx.Err() == nil; i++ {
		p := int32(i % int64(partitions))
		v := vs[rng.IntN(len(vs))]
		r := &kgo.Record{
			Partition: p,
			Key:       recordKey(p, i/int64(partitions)),
			Value:     v,
			Headers:   []kgo.RecordHeader{{Key: "seq", Value: binary.BigEndian.AppendUint64(nil, uint64(i))}},
		}
		cl.Produce(ctx, r, func(r *kgo.Record, err error) { acks.Ack(r, 0, err) })
	}
	if err := acks.Flush(ctx, cl); err != nil {
		return loadResult{}, err
	}
	res := loadResult{records: acks.Records, bytes: acks.Bytes, elapsed: time.Since(start)}
	if res.records != n {
		return loadResult{}, fmt.Errorf("produced %d of %d records", res.records, n)
	}
	return res, nil
}

// srcRecord is what the check keeps of a source record: its offset and a
// hash of everything else a consumer sees (key, value, headers,
// timestamp).
type srcRecord struct {
	offset int64
	sum    uint64
}

// sourceIndex is the source topic, per partition, indexed by the sequence
// in the key.
type sourceIndex struct {
	seed  maphash.Seed
	parts [][]srcRecord
	ends  map[int32]int64 // high watermark per partition
}

// recordSum hashes a record's key, value, headers and timestamp.
func recordSum(seed maphash.Seed, r *kgo.Record) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	var n [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field(r.Key)
	field(r.Value)
	binary.BigEndian.PutUint64(n[:], uint64(len(r.Headers)))
	h.Write(n[:])
	for _, hd := range r.Headers {
		field([]byte(hd.Key))
		field(hd.Value)
	}
	binary.BigEndian.PutUint64(n[:], uint64(r.Timestamp.UnixMilli()))
	h.Write(n[:])
	return h.Sum64()
}

// endOffsets returns the high watermark of every partition of topic; a
// topic that does not exist yet has none.
func endOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
	lo, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64)
	var errs []error
	lo.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("%s[%d]: %w", o.Topic, o.Partition, o.Err))
			return
		}
		out[o.Partition] = o.Offset
	})
	return out, errors.Join(errs...)
}

// readAll reads every record of topic from the start of each partition up
// to ends, read_uncommitted, calling fn for each.
func readAll(ctx context.Context, bootstrap, topic string, ends map[int32]int64, fn func(*kgo.Record)) error {
	offsets := make(map[int32]kgo.Offset)
	left := 0
	for p, e := range ends {
		if e > 0 {
			offsets[p] = kgo.NewOffset().AtStart()
			left++
		}
	}
	if left == 0 {
		return nil
	}
	cl, err := newClient(bootstrap,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(8<<20))
	if err != nil {
		return err
	}
	defer cl.Close()
	done := make(map[int32]bool)
	for left > 0 {
		// A partition whose last offset holds no record (a transaction
		// marker) would never be seen as done: give up after a quiet
		// minute rather than hang.
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		if errors.Is(pctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("reading %s: nothing more for a minute with %d partitions short of their end", topic, left)
		}
		var errs []error
		fs.EachError(func(t string, p int32, err error) {
			errs = append(errs, fmt.Errorf("%s[%d]: %w", t, p, err))
		})
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		fs.EachRecord(func(r *kgo.Record) {
			fn(r)
			if !done[r.Partition] && r.Offset+1 >= ends[r.Partition] {
				done[r.Partition] = true
				left--
			}
		})
	}
	return nil
}

// indexSource reads the source topic once.
func indexSource(ctx context.Context, bootstrap, topic string, partitions int, perPartition int64) (*sourceIndex, error) {
	cl, err := newClient(bootstrap)
	if err != nil {
		return nil, err
	}
	ends, err := endOffsets(ctx, kadm.NewClient(cl), topic)
	cl.Close()
	if err != nil {
		return nil, err
	}
	idx := &sourceIndex{seed: maphash.MakeSeed(), parts: make([][]srcRecord, partitions), ends: ends}
	for p := range idx.parts {
		idx.parts[p] = make([]srcRecord, perPartition)
		for i := range idx.parts[p] {
			idx.parts[p][i].offset = -1
		}
	}
	var bad int64
	err = readAll(ctx, bootstrap, topic, ends, func(r *kgo.Record) {
		p, seq, ok := parseKey(r.Key)
		if !ok || p != r.Partition || seq < 0 || seq >= perPartition {
			bad++
			return
		}
		idx.parts[p][seq] = srcRecord{offset: r.Offset, sum: recordSum(idx.seed, r)}
	})
	if err == nil && bad > 0 {
		err = fmt.Errorf("source topic %s holds %d records the load did not write", topic, bad)
	}
	return idx, err
}

// fidelity is how a copy compares with the source, record by record.
type fidelity struct {
	source    int64 // records on the source
	identical int64 // same offset, key, value, headers and timestamp
	moved     int64 // the source record (by key), at another offset
	differs   int64 // found by key at the same offset, but something else differs
	missing   int64 // source records not on the target
	extra     int64 // target records that are no source record, or a second copy
	offsetsEq bool  // every partition's end offset equals the source's
}

// ok reports whether the copy is identical to the source.
func (f fidelity) ok() bool {
	return f.identical == f.source && f.moved == 0 && f.differs == 0 && f.missing == 0 && f.extra == 0 && f.offsetsEq
}

// compare reads the copy of the topic on the target and matches every
// record with the source's by its key.
func (idx *sourceIndex) compare(ctx context.Context, bootstrap, topic string) (fidelity, error) {
	cl, err := newClient(bootstrap)
	if err != nil {
		return fidelity{}, err
	}
	ends, err := endOffsets(ctx, kadm.NewClient(cl), topic)
	cl.Close()
	if err != nil {
		return fidelity{}, err
	}
	f := fidelity{offsetsEq: len(ends) == len(idx.ends)}
	for p, e := range idx.ends {
		if ends[p] != e {
			f.offsetsEq = false
		}
	}
	seen := make([][]bool, len(idx.parts))
	for p := range seen {
		seen[p] = make([]bool, len(idx.parts[p]))
	}
	err = readAll(ctx, bootstrap, topic, ends, func(r *kgo.Record) {
		p, seq, ok := parseKey(r.Key)
		if !ok || p != r.Partition || int(p) >= len(idx.parts) || seq < 0 || seq >= int64(len(idx.parts[p])) || seen[p][seq] {
			f.extra++
			return
		}
		seen[p][seq] = true
		s := idx.parts[p][seq]
		switch {
		case s.offset != r.Offset:
			f.moved++
		case s.sum != recordSum(idx.seed, r):
			f.differs++
		default:
			f.identical++
		}
	})
	for p := range idx.parts {
		for seq, s := range idx.parts[p] {
			if s.offset < 0 {
				continue
			}
			f.source++
			if !seen[p][seq] {
				f.missing++
			}
		}
	}
	return f, err
}
