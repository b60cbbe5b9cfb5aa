package conformance

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
)

// TestMetadataUnchangedNotDecoded: a Kafka broker answers Metadata for
// every topic with the same bytes while nothing changes, so the member
// answers a client from its kept translation without decoding the
// cluster's answer again (proxy/metadata_answers.go); and what the client
// is told lists what the cluster holds.
func TestMetadataUnchangedNotDecoded(t *testing.T) {
	c := sharedCluster(t)
	adm := admin(t, c)
	var topics []string
	for range 4 {
		topics = append(topics, createTopic(t, adm, "meta"))
	}
	f := ferrytest.Start(t, c.Bootstrap())
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	sameBytes := func() float64 {
		mfs, err := f.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		return counterWith(mfs, "ferry_metadata_all_topics_total", "answer", "same_bytes")
	}
	const asks = 10
	before := sameBytes()
	for i := range asks {
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		parts := map[string]int{}
		for _, rt := range resp.Topics {
			if rt.Topic != nil && rt.ErrorCode == 0 {
				parts[*rt.Topic] = len(rt.Partitions)
			}
		}
		for _, topic := range topics {
			if parts[topic] != partitions {
				t.Fatalf("ask %d: %s listed with %d partitions, want %d", i, topic, parts[topic], partitions)
			}
		}
	}
	// The first answer is translated (this member's first); another
	// test's topics still being deleted, or a leader moving, change a few
	// more. The rest are the cluster's unchanged bytes: with every answer
	// decoded, or the controller ID compared, none or one is.
	if got := sameBytes() - before; got < asks-4 {
		t.Fatalf("%v of %d answers from the cluster's unchanged bytes, want at least %d", got, asks, asks-4)
	}
}

// counterWith sums the counter name's series whose label is value.
func counterWith(mfs []*dto.MetricFamily, name, label, value string) float64 {
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
