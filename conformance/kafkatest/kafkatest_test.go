package kafkatest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestMain(m *testing.M) { Main(m) }

func newClient(t *testing.T, c *Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Addrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func createTopic(t *testing.T, ctx context.Context, adm *kadm.Client, topic string, partitions int32, rf int16) {
	t.Helper()
	resp, err := adm.CreateTopic(ctx, partitions, rf, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// eventually polls f until it returns nil or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestSingleNodeProduceConsume(t *testing.T) {
	start := time.Now()
	c := Start(t, 1)
	t.Logf("1-node cluster %s ready in %v at %s", c.ClusterID(), time.Since(start).Round(time.Millisecond), c.Bootstrap())

	if got := c.NodeIDs(); !slices.Equal(got, []int32{1}) {
		t.Fatalf("NodeIDs = %v, want [1]", got)
	}
	if len(c.ClusterID()) != 22 || strings.HasPrefix(c.ClusterID(), "-") {
		t.Fatalf("ClusterID %q is not a 22-character base64url ID", c.ClusterID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cl := newClient(t, c)
	createTopic(t, ctx, kadm.NewClient(cl), "one", 1, 1)
	for i, v := range []string{"first", "second"} {
		r, err := cl.ProduceSync(ctx, &kgo.Record{Topic: "one", Value: []byte(v)}).First()
		if err != nil {
			t.Fatalf("produce %q: %v", v, err)
		}
		if r.Offset != int64(i) {
			t.Fatalf("produce %q: offset %d, want %d", v, r.Offset, i)
		}
	}

	consumer := newClient(t, c, kgo.ConsumeTopics("one"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []*kgo.Record
	for len(got) < 2 {
		fs := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d records before %v", len(got), err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		got = append(got, fs.Records()...)
	}
	if len(got) != 2 || string(got[1].Value) != "second" || got[1].Offset != 1 {
		t.Fatalf("consumed %d records, last %q at %d; want 2, \"second\" at 1", len(got), got[len(got)-1].Value, got[len(got)-1].Offset)
	}
}
