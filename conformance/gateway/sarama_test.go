package gateway

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
)

// TestSarama drives IBM/sarama — which speaks older protocol versions than
// franz-go — through Ferry: an idempotent producer and a consumer group,
// record for record, and committed offsets equal through Ferry and direct.
func TestSarama(t *testing.T) {
	c := cluster(t)
	f := ferrytest.Start(t, c.Bootstrap())
	viaFerry := kadm.NewClient(client(t, f.Addr))
	direct := kadm.NewClient(client(t, c.Bootstrap()))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const topic, group, n = "sarama", "sarama-group", 500
	createTopic(t, viaFerry, topic, 3, nil)

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.ClientID = "ferry-sarama"
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Producer.Return.Successes = true
	cfg.Producer.Compression = sarama.CompressionSnappy
	cfg.Net.MaxOpenRequests = 1
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = false

	prod, err := sarama.NewSyncProducer([]string{f.Addr}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	want := map[string]saramaRec{}
	for i := 0; i < n; i++ {
		k, v := fmt.Sprintf("k-%d", i), fmt.Sprintf("v-%d", i)
		p, o, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(v)})
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		want[k] = saramaRec{p, o, v}
	}

	cg, err := sarama.NewConsumerGroup([]string{f.Addr}, group, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	h := &saramaHandler{want: want, n: n, done: make(chan struct{}), t: t}
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	go func() {
		for cctx.Err() == nil {
			if err := cg.Consume(cctx, []string{topic}, h); err != nil && cctx.Err() == nil {
				t.Errorf("consume: %v", err)
				return
			}
		}
	}()
	select {
	case <-h.done:
	case <-ctx.Done():
		t.Fatalf("sarama consumed %d of %d records", h.count(), n)
	}
	ccancel()
	cg.Close()
	committedEqualsEnd(t, ctx, viaFerry, direct, group, topic)
}

type saramaRec struct {
	p   int32
	o   int64
	val string
}

type saramaHandler struct {
	t    *testing.T
	want map[string]saramaRec
	n    int
	mu   sync.Mutex
	seen map[string]bool
	done chan struct{}
	once sync.Once
}

func (h *saramaHandler) count() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.seen) }

func (h *saramaHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *saramaHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		k := string(m.Key)
		w, ok := h.want[k]
		if !ok || w.p != m.Partition || w.o != m.Offset || w.val != string(m.Value) {
			h.t.Errorf("record %s at %d/%d differs from what was produced (%+v)", k, m.Partition, m.Offset, w)
		}
		s.MarkMessage(m, "")
		s.Commit()
		h.mu.Lock()
		if h.seen == nil {
			h.seen = map[string]bool{}
		}
		h.seen[k] = true
		if len(h.seen) == h.n {
			h.once.Do(func() { close(h.done) })
		}
		h.mu.Unlock()
	}
	return nil
}
