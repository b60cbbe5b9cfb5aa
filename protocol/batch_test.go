package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

var (
	capture      = flag.Bool("capture", false, "regenerate the kfake-* fixtures in testdata/batches from an in-process kfake cluster")
	captureKafka = flag.Bool("capture-kafka", false, "regenerate the kafka-* fixtures in testdata/batches from a real Apache Kafka broker (conformance/kafkatest)")
)

const batchFixtureDir = "testdata/batches"

// A batchFixture is one raw records blob in testdata/batches, as a broker
// returned it from a Fetch of one partition from offset 0. Its name says how
// it was produced: <source>-<mode>-<codec>.bin.
type batchFixture struct {
	source string // "kfake" (in-process) or "kafka" (Apache Kafka)
	mode   string // "idempotent", "plain" (idempotence disabled) or "txn"
	codec  string
}

func (fx batchFixture) name() string { return fx.source + "-" + fx.mode + "-" + fx.codec }

// A codecCase is one compression codec the fixtures are produced with.
type codecCase struct {
	name  string // as in fixture names
	attr  int8   // the Compression* value in the batch attributes
	codec kgo.CompressionCodec
}

var fixtureCodecs = []codecCase{
	{"none", CompressionNone, kgo.NoCompression()},
	{"gzip", CompressionGzip, kgo.GzipCompression()},
	{"snappy", CompressionSnappy, kgo.SnappyCompression()},
	{"lz4", CompressionLZ4, kgo.Lz4Compression()},
	{"zstd", CompressionZstd, kgo.ZstdCompression()},
}

func fixtureCodec(name string) codecCase {
	i := slices.IndexFunc(fixtureCodecs, func(c codecCase) bool { return c.name == name })
	if i < 0 {
		panic("unknown codec " + name)
	}
	return fixtureCodecs[i]
}

var fixtureSources = []string{"kfake", "kafka"}

func allFixtures() []batchFixture {
	var fxs []batchFixture
	for _, src := range fixtureSources {
		fxs = append(fxs, sourceFixtures(src)...)
	}
	return fxs
}

func sourceFixtures(source string) []batchFixture {
	var fxs []batchFixture
	for _, mode := range []string{"idempotent", "plain", "txn"} {
		for _, c := range fixtureCodecs {
			fxs = append(fxs, batchFixture{source, mode, c.name})
		}
	}
	return fxs
}

// fixtureTxns is how the producer of a fixture grouped its batches: one
// inner slice per transaction for "txn" (committed unless listed in
// fixtureAborted), else one per flush. Each number is the batch's record
// count.
var fixtureTxns = [][]int{{5, 3}, {4}, {1, 6}}

// fixtureAborted lists the transactions (indexes into fixtureTxns) that the
// "txn" fixtures abort.
var fixtureAborted = []int{1}

// fixtureRecords are the records of a fixture in produce order, one slice per
// batch. They mix nil and empty keys, a tombstone, headers and timestamps
// out of order, and the values compress well so that kgo keeps the codec.
func fixtureRecords(fx batchFixture) [][]*kgo.Record {
	base := time.UnixMilli(1_700_000_000_000)
	var batches [][]*kgo.Record
	n := 0
	for _, txn := range fixtureTxns {
		for _, count := range txn {
			var batch []*kgo.Record
			for range count {
				r := &kgo.Record{
					Key:       []byte(fmt.Sprintf("key-%s-%d", fx.name(), n)),
					Value:     []byte(strings.Repeat(fmt.Sprintf("value %d of %s; ", n, fx.name()), 8+n%4)),
					Timestamp: base.Add(time.Duration(n*37%11) * time.Second),
				}
				switch n % 5 {
				case 1:
					r.Key = nil
				case 2:
					r.Headers = []kgo.RecordHeader{{Key: "h1", Value: []byte("one")}, {Key: "h2", Value: nil}}
				case 3:
					r.Value = nil // tombstone
				case 4:
					r.Key = []byte{}
					r.Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte(fmt.Sprint(n))}}
				}
				batch = append(batch, r)
				n++
			}
			batches = append(batches, batch)
		}
	}
	return batches
}

// TestCaptureBatches regenerates testdata/batches: for every codec, it
// produces fixtureRecords with an idempotent, a non-idempotent and a
// transactional franz-go producer, then reads the partition back with a raw
// FetchRequest and writes the records blob as it came. -capture uses an
// in-process kfake cluster (which keeps the batches clients send),
// -capture-kafka a one-node Apache Kafka cluster from conformance/kafkatest.
//
//	go test ./protocol -run TestCaptureBatches -capture -capture-kafka
func TestCaptureBatches(t *testing.T) {
	if !*capture && !*captureKafka {
		t.Skip("run with -capture or -capture-kafka to regenerate " + batchFixtureDir)
	}
	if err := os.MkdirAll(batchFixtureDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if *capture {
		t.Run("kfake", func(t *testing.T) {
			fxs := sourceFixtures("kfake")
			c := newKfake(t, kfake.SeedTopics(1, fixtureTopics(fxs)...))
			captureFixtures(t, c.ListenAddrs(), fxs)
		})
	}
	if *captureKafka {
		t.Run("kafka", func(t *testing.T) {
			fxs := sourceFixtures("kafka")
			addrs := kafkatest.Start(t, 1).Addrs()
			createTopics(t, addrs, fixtureTopics(fxs))
			captureFixtures(t, addrs, fxs)
		})
	}
}

func fixtureTopics(fxs []batchFixture) []string {
	var topics []string
	for _, fx := range fxs {
		topics = append(topics, fx.name())
	}
	return topics
}

// createTopics creates single-partition topics on a real cluster.
func createTopics(t testing.TB, addrs []string, topics []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addrs)
	resps, err := kadm.NewClient(cl).CreateTopics(ctx, 1, 1, nil, topics...)
	if err != nil {
		t.Fatal(err)
	}
	if err := resps.Error(); err != nil {
		t.Fatal(err)
	}
}

func captureFixtures(t *testing.T, addrs []string, fxs []batchFixture) {
	for _, fx := range fxs {
		t.Run(fx.name(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			opts := []kgo.Opt{
				kgo.DefaultProduceTopic(fx.name()),
				kgo.ProducerBatchCompression(fixtureCodec(fx.codec).codec),
				kgo.ManualFlushing(), // one Flush, one batch
			}
			switch fx.mode {
			case "plain":
				opts = append(opts, kgo.DisableIdempotentWrite())
			case "txn":
				opts = append(opts, kgo.TransactionalID("ferry-capture-"+fx.name()))
			}
			cl := newClient(t, addrs, opts...)
			batches := fixtureRecords(fx)
			end := int64(0)
			for i, txn := range fixtureTxns {
				if fx.mode == "txn" {
					if err := cl.BeginTransaction(); err != nil {
						t.Fatal(err)
					}
				}
				for range txn {
					produceBatch(ctx, t, cl, batches[0])
					end += int64(len(batches[0]))
					batches = batches[1:]
				}
				if fx.mode == "txn" {
					commit := kgo.TryCommit
					if slices.Contains(fixtureAborted, i) {
						commit = kgo.TryAbort
					}
					if err := cl.EndTransaction(ctx, commit); err != nil {
						t.Fatal(err)
					}
					end++ // the marker
				}
			}
			// A broker writes transaction markers after EndTxn returns, and
			// answers a Fetch from one log segment: fetch on until the log
			// reaches the last marker, and keep every batch.
			var blob []byte
			var rp kmsg.FetchResponseTopicPartition
			for next := int64(0); next < end; {
				if ctx.Err() != nil {
					t.Fatalf("log stopped at offset %d, want %d", next, end)
				}
				rp = fetchRaw(ctx, t, cl, fx.name(), next)
				bs := walkAll(t, rp.RecordBatches)
				if len(bs) == 0 {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				blob = append(blob, rp.RecordBatches[:sumLen(bs)]...)
				next = bs[len(bs)-1].NextOffset()
			}
			path := filepath.Join(batchFixtureDir, fx.name()+".bin")
			if err := os.WriteFile(path, blob, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s: %d bytes, high watermark %d", path, len(blob), rp.HighWatermark)
		})
	}
}

func newKfake(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newClient(t testing.TB, addrs []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produceBatch buffers rs and flushes them, so that they leave as one batch.
func produceBatch(ctx context.Context, t *testing.T, cl *kgo.Client, rs []*kgo.Record) {
	t.Helper()
	errs := make(chan error, len(rs))
	for _, r := range rs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) { errs <- err })
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for range rs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func topicID(ctx context.Context, t *testing.T, cl *kgo.Client, topic string) [16]byte {
	t.Helper()
	tds, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	td, ok := tds[topic]
	if !ok || td.Err != nil {
		t.Fatalf("topic %s: %v", topic, td.Err)
	}
	return td.ID
}

// fetchRaw reads partition 0 of topic from offset with read_uncommitted and
// returns the partition's response, records as the broker sent them.
func fetchRaw(ctx context.Context, t *testing.T, cl *kgo.Client, topic string, offset int64) kmsg.FetchResponseTopicPartition {
	t.Helper()
	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis = 100
	req.MinBytes = 1
	req.MaxBytes = 16 << 20
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rt.TopicID = topicID(ctx, t, cl, topic)
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = 0
	rp.FetchOffset = offset
	rp.PartitionMaxBytes = 16 << 20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("fetch response has %d topics", len(resp.Topics))
	}
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != 0 {
		t.Fatalf("fetch %s: error code %d", topic, p.ErrorCode)
	}
	return p
}

// loadFixture returns a fresh copy of a fixture's bytes.
func loadFixture(t testing.TB, fx batchFixture) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(batchFixtureDir, fx.name()+".bin"))
	if err != nil {
		t.Fatalf("%v (regenerate with: go test ./protocol -run TestCaptureBatches -capture)", err)
	}
	return b
}

func walkAll(t testing.TB, records []byte) []Batch {
	t.Helper()
	var bs []Batch
	if err := WalkBatches(records, func(b Batch) error {
		bs = append(bs, b)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return bs
}

// decodeRecords decodes a records blob with kgo's own consumer code, which
// checks every CRC; control records are dropped and nothing is filtered as
// aborted.
func decodeRecords(t testing.TB, records []byte) []*kgo.Record {
	t.Helper()
	rp := kmsg.NewFetchResponseTopicPartition()
	rp.RecordBatches = records
	rp.HighWatermark = 1 << 62
	rp.LastStableOffset = 1 << 62
	fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Topic: "t"}, &rp, kgo.DefaultDecompressor(), nil)
	if fp.Err != nil {
		t.Fatalf("kgo decoding: %v", fp.Err)
	}
	return fp.Records
}

func sameRecords(t testing.TB, got, want []*kgo.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if !bytes.Equal(g.Key, w.Key) || (g.Key == nil) != (w.Key == nil) {
			t.Errorf("record %d: key %q, want %q", i, g.Key, w.Key)
		}
		if !bytes.Equal(g.Value, w.Value) || (g.Value == nil) != (w.Value == nil) {
			t.Errorf("record %d: value %q, want %q", i, g.Value, w.Value)
		}
		if !g.Timestamp.Equal(w.Timestamp) {
			t.Errorf("record %d: timestamp %v, want %v", i, g.Timestamp, w.Timestamp)
		}
		if len(g.Headers) != len(w.Headers) {
			t.Errorf("record %d: %d headers, want %d", i, len(g.Headers), len(w.Headers))
			continue
		}
		for j := range w.Headers {
			if g.Headers[j].Key != w.Headers[j].Key || !bytes.Equal(g.Headers[j].Value, w.Headers[j].Value) {
				t.Errorf("record %d header %d: %q=%q, want %q=%q", i, j, g.Headers[j].Key, g.Headers[j].Value, w.Headers[j].Key, w.Headers[j].Value)
			}
		}
	}
}

// TestFixtureBatches checks every captured blob batch by batch against what
// its producer did.
func TestFixtureBatches(t *testing.T) {
	for _, fx := range allFixtures() {
		t.Run(fx.name(), func(t *testing.T) {
			blob := loadFixture(t, fx)
			bs := walkAll(t, blob)
			recs := fixtureRecords(fx)
			var data, control []Batch
			next := int64(0)
			for i, b := range bs {
				if err := b.Validate(); err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
				if b.BaseOffset() != next {
					t.Errorf("batch %d: base offset %d, want %d", i, b.BaseOffset(), next)
				}
				next = b.NextOffset()
				if b.LastOffsetDelta() != b.NumRecords()-1 {
					t.Errorf("batch %d: last offset delta %d with %d records", i, b.LastOffsetDelta(), b.NumRecords())
				}
				if b.PartitionLeaderEpoch() < 0 {
					t.Errorf("batch %d: partition leader epoch %d", i, b.PartitionLeaderEpoch())
				}
				if b.HasLogAppendTime() || b.HasDeleteHorizon() {
					t.Errorf("batch %d: attributes %#x", i, b.Attributes())
				}
				if b.IsControl() {
					control = append(control, b)
				} else {
					data = append(data, b)
				}
			}
			if len(data) != len(recs) {
				t.Fatalf("%d data batches, produced %d", len(data), len(recs))
			}
			seq, epoch := int32(0), int16(0)
			for i, b := range data {
				want := recs[i]
				if b.NumRecords() != int32(len(want)) {
					t.Errorf("data batch %d: %d records, produced %d", i, b.NumRecords(), len(want))
				}
				if got, w := b.Compression(), fixtureCodec(fx.codec).attr; got != w {
					t.Errorf("data batch %d: codec %d, produced with %d", i, got, w)
				}
				minTS, maxTS := want[0].Timestamp.UnixMilli(), int64(0)
				for _, r := range want {
					maxTS = max(maxTS, r.Timestamp.UnixMilli())
				}
				if b.BaseTimestamp() != minTS || b.MaxTimestamp() != maxTS {
					t.Errorf("data batch %d: timestamps %d..%d, want %d..%d", i, b.BaseTimestamp(), b.MaxTimestamp(), minTS, maxTS)
				}
				if b.IsTransactional() != (fx.mode == "txn") {
					t.Errorf("data batch %d: transactional %v", i, b.IsTransactional())
				}
				switch fx.mode {
				case "plain":
					// franz-go leaves the base sequence at 0 here (the
					// Java client writes -1); brokers ignore it without
					// a producer ID.
					if b.ProducerID() != -1 || b.ProducerEpoch() != -1 {
						t.Errorf("data batch %d: producer %d/%d, want -1/-1", i, b.ProducerID(), b.ProducerEpoch())
					}
				default:
					if b.ProducerID() < 0 || b.ProducerEpoch() < 0 || b.ProducerID() != data[0].ProducerID() {
						t.Errorf("data batch %d: producer %d/%d", i, b.ProducerID(), b.ProducerEpoch())
					}
					// Sequences run on within an epoch and restart at
					// 0 in a new one (KIP-890 bumps the epoch at every
					// transaction's end).
					if i > 0 && b.ProducerEpoch() != epoch {
						if b.ProducerEpoch() < epoch {
							t.Errorf("data batch %d: epoch %d after %d", i, b.ProducerEpoch(), epoch)
						}
						seq = 0
					}
					epoch = b.ProducerEpoch()
					if b.BaseSequence() != seq {
						t.Errorf("data batch %d: base sequence %d, want %d", i, b.BaseSequence(), seq)
					}
					seq += b.NumRecords()
				}
			}
			if fx.mode == "txn" {
				if len(control) != len(fixtureTxns) {
					t.Errorf("%d control batches, want one per transaction (%d)", len(control), len(fixtureTxns))
				}
				for i, b := range control {
					if !b.IsTransactional() || b.NumRecords() != 1 || b.Compression() != CompressionNone || b.ProducerID() != data[0].ProducerID() {
						t.Errorf("control batch %d: attributes %#x, %d records, producer %d", i, b.Attributes(), b.NumRecords(), b.ProducerID())
					}
				}
			} else if len(control) != 0 {
				t.Errorf("%d control batches outside transactions", len(control))
			}
			sameRecords(t, decodeRecords(t, blob), slices.Concat(recs...))
		})
	}
}

// maskedHeader returns a copy of b's header with the given byte ranges
// zeroed, to compare the rest of two headers.
func maskedHeader(b Batch, fields ...[2]int) []byte {
	h := bytes.Clone(b[:BatchHeaderSize])
	for _, c := range fields {
		clear(h[c[0]:c[1]])
	}
	return h
}

var (
	fieldCRC      = [2]int{offCRC, offCRC + 4}
	fieldProducer = [2]int{offProducerID, offRecordCount}
	fieldEpoch    = [2]int{offPartitionLeaderEpoch, offMagic}
	fieldOffset   = [2]int{offBaseOffset, offBatchLength}
)

func TestRewriteProducerKeepsPayload(t *testing.T) {
	for _, fx := range allFixtures() {
		t.Run(fx.name(), func(t *testing.T) {
			orig := loadFixture(t, fx)
			blob := bytes.Clone(orig)
			bs := walkAll(t, blob)
			origs := walkAll(t, orig)
			seq := int32(0)
			for i, b := range bs {
				b.SetProducer(1<<40+int64(i), 7, seq)
				b.UpdateCRC()
				seq += b.NumRecords()
				if err := b.Validate(); err != nil {
					t.Fatalf("batch %d after rewrite: %v", i, err)
				}
				if b.ProducerID() != 1<<40+int64(i) || b.ProducerEpoch() != 7 || b.BaseSequence() != seq-b.NumRecords() {
					t.Errorf("batch %d: producer %d/%d/%d", i, b.ProducerID(), b.ProducerEpoch(), b.BaseSequence())
				}
				if !bytes.Equal(b.Payload(), origs[i].Payload()) {
					t.Errorf("batch %d: payload changed", i)
				}
				if !bytes.Equal(maskedHeader(b, fieldCRC, fieldProducer), maskedHeader(origs[i], fieldCRC, fieldProducer)) {
					t.Errorf("batch %d: header outside the producer fields changed", i)
				}
			}
			// kgo's decoder checks each CRC itself.
			sameRecords(t, decodeRecords(t, blob), decodeRecords(t, orig))
		})
	}
}

func TestFieldsOutsideCRC(t *testing.T) {
	for _, fx := range allFixtures() {
		t.Run(fx.name(), func(t *testing.T) {
			orig := loadFixture(t, fx)
			blob := bytes.Clone(orig)
			origs := walkAll(t, orig)
			for i, b := range walkAll(t, blob) {
				crc := b.CRC()
				b.SetPartitionLeaderEpoch(1<<20 + int32(i))
				b.SetBaseOffset(1<<33 + int64(i)*100)
				if b.PartitionLeaderEpoch() != 1<<20+int32(i) || b.BaseOffset() != 1<<33+int64(i)*100 {
					t.Errorf("batch %d: epoch %d, base offset %d", i, b.PartitionLeaderEpoch(), b.BaseOffset())
				}
				if b.NextOffset() != b.BaseOffset()+int64(origs[i].NextOffset()-origs[i].BaseOffset()) {
					t.Errorf("batch %d: next offset %d", i, b.NextOffset())
				}
				if err := b.Validate(); err != nil || b.CRC() != crc {
					t.Errorf("batch %d: %v, crc %#x was %#x", i, err, b.CRC(), crc)
				}
				if !bytes.Equal(b[offMagic:], origs[i][offMagic:]) ||
					!bytes.Equal(maskedHeader(b, fieldEpoch, fieldOffset), maskedHeader(origs[i], fieldEpoch, fieldOffset)) {
					t.Errorf("batch %d: bytes other than epoch and base offset changed", i)
				}
			}
		})
	}
}

func TestAttributes(t *testing.T) {
	blob := loadFixture(t, batchFixture{"kfake", "txn", "zstd"})
	b := walkAll(t, blob)[0]
	if !b.IsTransactional() || b.IsControl() || b.Compression() != CompressionZstd {
		t.Fatalf("attributes %#x", b.Attributes())
	}
	for _, tc := range []struct {
		attrs                       int16
		codec                       int8
		logAppend, txn, ctl, horizo bool
	}{
		{0, CompressionNone, false, false, false, false},
		{BatchAttrLogAppendTime | int16(CompressionGzip), CompressionGzip, true, false, false, false},
		{BatchAttrTransactional | BatchAttrControl, CompressionNone, false, true, true, false},
		{BatchAttrDeleteHorizon | int16(CompressionLZ4), CompressionLZ4, false, false, false, true},
		{0x7f, 7, true, true, true, true},
	} {
		b.SetAttributes(tc.attrs)
		if b.Attributes() != tc.attrs || b.Compression() != tc.codec || b.HasLogAppendTime() != tc.logAppend ||
			b.IsTransactional() != tc.txn || b.IsControl() != tc.ctl || b.HasDeleteHorizon() != tc.horizo {
			t.Errorf("SetAttributes(%#x): read back %#x codec %d", tc.attrs, b.Attributes(), b.Compression())
		}
		if err := b.CheckCRC(); !errors.Is(err, ErrBadCRC) {
			t.Errorf("SetAttributes(%#x) without UpdateCRC: CheckCRC = %v", tc.attrs, err)
		}
		b.UpdateCRC()
		if err := b.Validate(); err != nil {
			t.Errorf("SetAttributes(%#x) then UpdateCRC: %v", tc.attrs, err)
		}
	}
}

func TestCorruptionFailsCRC(t *testing.T) {
	for _, fx := range allFixtures() {
		t.Run(fx.name(), func(t *testing.T) {
			blob := loadFixture(t, fx)
			for i, b := range walkAll(t, blob) {
				for _, at := range []int{BatchHeaderSize, len(b) - 1, offAttributes, offProducerID + 7, offRecordCount + 3, offCRC} {
					b[at] ^= 0x40
					if err := b.CheckCRC(); !errors.Is(err, ErrBadCRC) {
						t.Errorf("batch %d: byte %d flipped, CheckCRC = %v", i, at, err)
					}
					if err := b.Validate(); !errors.Is(err, ErrBadCRC) {
						t.Errorf("batch %d: byte %d flipped, Validate = %v", i, at, err)
					}
					b[at] ^= 0x40
				}
				if err := b.Validate(); err != nil {
					t.Errorf("batch %d restored: %v", i, err)
				}
			}
		})
	}
}

// TestTruncatedBlob cuts each fixture at every length, as a Fetch response's
// size limit may: the walk must see exactly the whole batches and stop
// quietly.
func TestTruncatedBlob(t *testing.T) {
	for _, fx := range allFixtures() {
		t.Run(fx.name(), func(t *testing.T) {
			blob := loadFixture(t, fx)
			var ends []int
			end := 0
			for _, b := range walkAll(t, blob) {
				end += len(b)
				ends = append(ends, end)
			}
			if end != len(blob) {
				t.Fatalf("batches cover %d of %d bytes", end, len(blob))
			}
			for n := 0; n <= len(blob); n++ {
				whole := 0
				for _, e := range ends {
					if e <= n {
						whole++
					}
				}
				bs := walkAll(t, blob[:n])
				if len(bs) != whole {
					t.Fatalf("cut at %d: walked %d batches, want %d", n, len(bs), whole)
				}
				if whole > 0 {
					if err := bs[whole-1].Validate(); err != nil {
						t.Fatalf("cut at %d: last whole batch: %v", n, err)
					}
				}
				if tail := blob[:n][sumLen(bs):]; len(tail) > 0 {
					if _, rest, err := ParseBatch(tail); err != ErrShortBatch || len(rest) != len(tail) {
						t.Fatalf("cut at %d: ParseBatch of the %d-byte tail = %v", n, len(tail), err)
					}
				}
			}
		})
	}
}

func sumLen(bs []Batch) int {
	n := 0
	for _, b := range bs {
		n += len(b)
	}
	return n
}

// newTestBatch builds a valid batch whose payload is n pseudo-random bytes
// (they are never decoded here).
func newTestBatch(n int) Batch {
	buf := make([]byte, BatchHeaderSize+n)
	binary.BigEndian.PutUint32(buf[offBatchLength:], uint32(len(buf)-batchLengthPrefix))
	buf[offMagic] = byte(BatchMagic)
	r := rand.NewChaCha8([32]byte{1})
	_, _ = r.Read(buf[offAttributes:])
	b := Batch(buf)
	b.UpdateCRC()
	return b
}

func TestParseBatchErrors(t *testing.T) {
	valid := newTestBatch(20)
	withLength := func(n int32) []byte {
		b := bytes.Clone(valid)
		binary.BigEndian.PutUint32(b[offBatchLength:], uint32(n))
		return b
	}
	withMagic := func(m byte) []byte {
		b := bytes.Clone(valid)
		b[offMagic] = m
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrShortBatch},
		{"shorter than the length field", valid[:11], ErrShortBatch},
		{"length field only", valid[:12], ErrShortBatch},
		{"header cut before magic", valid[:16], ErrShortBatch},
		{"header cut after magic", valid[:40], ErrShortBatch},
		{"records cut", valid[:len(valid)-1], ErrShortBatch},
		{"magic 1", withMagic(1), ErrBadMagic},
		{"magic 0 in a short tail", withMagic(0)[:20], ErrBadMagic},
		{"length below a header", withLength(BatchHeaderSize - batchLengthPrefix - 1), ErrBadLength},
		{"negative length", withLength(-1), ErrBadLength},
		{"length beyond the bytes", withLength(1 << 30), ErrShortBatch},
		{"valid", valid, nil},
		{"empty payload", newTestBatch(0), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, rest, err := ParseBatch(tc.in)
			if err != tc.want {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if err != nil {
				if b != nil || len(rest) != len(tc.in) {
					t.Fatalf("on error: batch of %d bytes, %d of %d bytes left", len(b), len(rest), len(tc.in))
				}
				if werr := WalkBatches(tc.in, func(Batch) error { return nil }); (err == ErrShortBatch) != (werr == nil) || (werr != nil && !errors.Is(werr, err)) {
					t.Fatalf("WalkBatches = %v", werr)
				}
				return
			}
			if len(b) != len(tc.in) || len(rest) != 0 || cap(b) != len(b) {
				t.Fatalf("batch %d bytes (cap %d), %d left", len(b), cap(b), len(rest))
			}
			if err := b.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestValidateErrors(t *testing.T) {
	valid := newTestBatch(20)
	longer := append(bytes.Clone(valid), 0)
	badMagic := bytes.Clone(valid)
	badMagic[offMagic] = 3
	for _, tc := range []struct {
		name string
		b    Batch
		want error
	}{
		{"valid", valid, nil},
		{"shorter than a header", valid[:BatchHeaderSize-1], ErrShortBatch},
		{"bytes beyond the length", longer, ErrBadLength},
		{"bytes missing", valid[:len(valid)-1], ErrBadLength},
		{"magic 3", badMagic, ErrBadMagic},
	} {
		if err := tc.b.Validate(); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: Validate = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestWalkBatchesStopsAtCallbackError(t *testing.T) {
	blob := loadFixture(t, batchFixture{"kafka", "txn", "gzip"})
	stop := errors.New("stop")
	calls := 0
	err := WalkBatches(blob, func(b Batch) error {
		calls++
		if calls == 2 {
			return stop
		}
		return nil
	})
	if err != stop || calls != 2 {
		t.Fatalf("err = %v after %d calls, want %v after 2", err, calls, stop)
	}

	// A bad batch after good ones is reported with its position.
	bad := append(bytes.Clone(blob), withBadMagic(newTestBatch(4))...)
	n := 0
	err = WalkBatches(bad, func(Batch) error { n++; return nil })
	if !errors.Is(err, ErrBadMagic) || !strings.Contains(err.Error(), fmt.Sprintf("byte %d", len(blob))) {
		t.Fatalf("err = %v", err)
	}
	if n != len(walkAll(t, blob)) {
		t.Fatalf("visited %d batches before the bad one", n)
	}
}

func withBadMagic(b Batch) []byte {
	b[offMagic] = 1
	return b
}

func TestNoAllocs(t *testing.T) {
	blob := loadFixture(t, batchFixture{"kafka", "idempotent", "lz4"})
	var sink int64
	allocs := testing.AllocsPerRun(100, func() {
		_ = WalkBatches(blob, func(b Batch) error {
			b.SetBaseOffset(b.BaseOffset() + 1)
			b.SetPartitionLeaderEpoch(b.PartitionLeaderEpoch())
			b.SetAttributes(b.Attributes())
			b.SetProducer(b.ProducerID(), b.ProducerEpoch(), b.BaseSequence())
			b.UpdateCRC()
			sink += b.NextOffset() + int64(b.BatchLength()) + int64(b.Magic()) + int64(b.CRC()) + int64(b.Compression()) +
				b.BaseTimestamp() + b.MaxTimestamp() + int64(b.NumRecords()) + int64(len(b.Payload()))
			if b.IsTransactional() || b.IsControl() || b.HasLogAppendTime() || b.HasDeleteHorizon() {
				sink++
			}
			if err := b.Validate(); err != nil {
				return err
			}
			return b.CheckCRC()
		})
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per walk", allocs)
	}
	_ = sink
}

// TestRewrittenBatchAcceptedByKfake forwards every data batch of every
// fixture as bytes to a fresh kfake cluster, the way the mirror does (see
// forwardRewritten).
func TestRewrittenBatchAcceptedByKfake(t *testing.T) {
	fxs := allFixtures()
	c := newKfake(t, kfake.SeedTopics(1, fixtureTopics(fxs)...))
	forwardRewritten(t, c.ListenAddrs(), fxs)
}

// TestRewrittenBatchAcceptedByKafka is TestRewrittenBatchAcceptedByKfake
// against a one-node Apache Kafka cluster, whose LogValidator checks more
// than kfake does. It is skipped under -short.
func TestRewrittenBatchAcceptedByKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Apache Kafka; skipped under -short")
	}
	fxs := allFixtures()
	addrs := kafkatest.Start(t, 1).Addrs()
	createTopics(t, addrs, fixtureTopics(fxs))
	forwardRewritten(t, addrs, fxs)
}

// forwardRewritten produces every data batch of each fixture raw to the
// topic named after it, rewritten the way the mirror does: base offset 0, a
// producer ID and epoch of our own from InitProducerID, sequences from 0, the
// transactional bit cleared, CRC updated, payload untouched. The broker must
// accept each batch at the expected offset and a kgo consumer must read back
// the same records.
func forwardRewritten(t *testing.T, addrs []string, fxs []batchFixture) {
	cl := newClient(t, addrs)
	for _, fx := range fxs {
		t.Run(fx.name(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			orig := loadFixture(t, fx)
			want := decodeRecords(t, orig)

			initReq := kmsg.NewPtrInitProducerIDRequest()
			initReq.TransactionTimeoutMillis = 60000
			initResp, err := initReq.RequestWith(ctx, cl)
			if err != nil || initResp.ErrorCode != 0 {
				t.Fatalf("InitProducerID: %v, code %d", err, initResp.ErrorCode)
			}
			pid, epoch := initResp.ProducerID, initResp.ProducerEpoch
			id := topicID(ctx, t, cl, fx.name())

			blob := bytes.Clone(orig)
			seq, next := int32(0), int64(0)
			for i, b := range walkAll(t, blob) {
				if b.IsControl() {
					continue // markers come from the coordinator, never from a producer
				}
				payload := bytes.Clone(b.Payload())
				b.SetBaseOffset(0)
				b.SetPartitionLeaderEpoch(-1)
				b.SetAttributes(b.Attributes() &^ BatchAttrTransactional)
				b.SetProducer(pid, epoch, seq)
				b.UpdateCRC()
				if !bytes.Equal(b.Payload(), payload) {
					t.Fatalf("batch %d: payload changed", i)
				}
				seq += b.NumRecords()

				req := kmsg.NewPtrProduceRequest()
				req.Acks = -1
				req.TimeoutMillis = 5000
				rt := kmsg.NewProduceRequestTopic()
				rt.Topic, rt.TopicID = fx.name(), id
				rp := kmsg.NewProduceRequestTopicPartition()
				rp.Records = b
				rt.Partitions = append(rt.Partitions, rp)
				req.Topics = append(req.Topics, rt)
				var p kmsg.ProduceResponseTopicPartition
				for {
					resp, err := req.RequestWith(ctx, cl)
					if err != nil {
						t.Fatalf("batch %d: produce: %v", i, err)
					}
					p = resp.Topics[0].Partitions[0]
					// A new topic's leader may not be known yet.
					if p.ErrorCode != kerr.NotLeaderForPartition.Code && p.ErrorCode != kerr.UnknownTopicOrPartition.Code {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if p.ErrorCode != 0 || p.BaseOffset != next {
					t.Fatalf("batch %d: produce error code %d, base offset %d, want 0 and %d", i, p.ErrorCode, p.BaseOffset, next)
				}
				next += int64(b.NumRecords())
			}

			consumer := newClient(t, addrs, kgo.ConsumeTopics(fx.name()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			var got []*kgo.Record
			for len(got) < len(want) {
				fs := consumer.PollFetches(ctx)
				if err := fs.Err0(); err != nil {
					t.Fatalf("consuming after %d of %d records: %v", len(got), len(want), err)
				}
				got = append(got, fs.Records()...)
			}
			sameRecords(t, got, want)
			for i, r := range got {
				if r.ProducerID != pid || r.ProducerEpoch != epoch || r.Offset != int64(i) {
					t.Errorf("record %d: producer %d/%d at offset %d, want %d/%d at %d", i, r.ProducerID, r.ProducerEpoch, r.Offset, pid, epoch, i)
				}
			}
		})
	}
}

func BenchmarkWalkSetPartitionLeaderEpoch(b *testing.B) {
	var blob []byte
	for _, fx := range allFixtures() {
		blob = append(blob, loadFixture(b, fx)...)
	}
	n := len(walkAll(b, blob))
	b.SetBytes(int64(len(blob)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		_ = WalkBatches(blob, func(bt Batch) error {
			bt.SetPartitionLeaderEpoch(int32(i))
			return nil
		})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/batch")
}

func BenchmarkSetProducerUpdateCRC16KiB(b *testing.B) {
	bt := newTestBatch(16<<10 - BatchHeaderSize)
	b.SetBytes(int64(len(bt)))
	b.ReportAllocs()
	for i := range b.N {
		bt.SetProducer(int64(i), int16(i), int32(i))
		bt.UpdateCRC()
	}
}

func BenchmarkValidate16KiB(b *testing.B) {
	bt := newTestBatch(16<<10 - BatchHeaderSize)
	b.SetBytes(int64(len(bt)))
	b.ReportAllocs()
	for range b.N {
		if err := bt.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}
