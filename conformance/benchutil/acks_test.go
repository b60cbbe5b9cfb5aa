package benchutil

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestAcksTally(t *testing.T) {
	a := NewAcks(true)
	a.Ack(&kgo.Record{Value: []byte("abc")}, 2*time.Millisecond, nil)
	a.Ack(&kgo.Record{Value: []byte("de")}, time.Millisecond, nil)
	if a.Records != 2 || a.Bytes != 5 || !slices.Equal(a.Lats, []time.Duration{2 * time.Millisecond, time.Millisecond}) {
		t.Fatalf("after two acks: %d records, %d bytes, lats %v; want 2, 5, [2ms 1ms]", a.Records, a.Bytes, a.Lats)
	}
	first, second := errors.New("first"), errors.New("second")
	a.Ack(&kgo.Record{Value: []byte("x")}, 0, first)
	a.Ack(&kgo.Record{Value: []byte("y")}, 0, second)
	if a.Records != 2 || a.Bytes != 5 || len(a.Lats) != 2 || !errors.Is(a.failure, first) {
		t.Fatalf("failed records counted, or not the first failure kept: %d records, %d bytes, %d lats, failure %v", a.Records, a.Bytes, len(a.Lats), a.failure)
	}

	b := NewAcks(false)
	b.Ack(&kgo.Record{Value: []byte("abc")}, time.Second, nil)
	if b.Records != 1 || b.Lats != nil {
		t.Fatalf("without latencies: %d records, lats %v; want 1 and none", b.Records, b.Lats)
	}
}

func TestAcksFlush(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	a := NewAcks(false)
	for range 10 {
		cl.Produce(ctx, &kgo.Record{Value: []byte("value")}, func(r *kgo.Record, err error) { a.Ack(r, 0, err) })
	}
	if err := a.Flush(ctx, cl); err != nil || a.Records != 10 || a.Bytes != 50 {
		t.Fatalf("Flush = %v with %d records, %d bytes; want nil, 10, 50", err, a.Records, a.Bytes)
	}
	failed := errors.New("refused")
	a.Ack(&kgo.Record{}, 0, failed)
	if err := a.Flush(ctx, cl); !errors.Is(err, failed) {
		t.Fatalf("Flush after a failure = %v; want it", err)
	}
}
