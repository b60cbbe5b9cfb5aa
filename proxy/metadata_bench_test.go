package proxy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Metadata for every topic of a large cluster, at the member and at the
// (in-process) cluster directly: the member's own cost per answer is the
// difference.
//
//	go test ./proxy -run '^$' -bench 'MetadataAllTopics' -benchtime 200x -count 3
func BenchmarkMetadataAllTopics(b *testing.B) {
	for _, partitions := range []int{1000, 10000} {
		var names []string
		for i := range partitions / 10 {
			names = append(names, fmt.Sprintf("t-%05d", i))
		}
		kf := newKfake(b, 1, kfake.SeedTopics(10, names...))
		_, addr := startFerry(b, kf.ListenAddrs())
		benchMetadataSides(b, partitions, addr, kf.ListenAddrs()[0])
	}
}

// Metadata for every topic of a large cluster whose broker lists topics
// and partitions in one order from one answer to the next, as Kafka does
// (kfake's order changes each time, which the benchmark above keeps):
// the member finds the cluster's answer unchanged in its bytes.
//
//	go test ./proxy -run '^$' -bench 'MetadataAllTopicsOneOrder' -benchtime 200x -count 3
func BenchmarkMetadataAllTopicsOneOrder(b *testing.B) {
	for _, partitions := range []int{1000, 10000} {
		var names []string
		for i := range partitions / 10 {
			names = append(names, fmt.Sprintf("t-%05d", i))
		}
		kf := newKfake(b, 1, kfake.SeedTopics(10, names...))
		// kfake's answer once, sorted, then given to every request.
		cl := newClient(b, kf.ListenAddrs()[0])
		fixed, err := kmsg.NewPtrMetadataRequest().RequestWith(context.Background(), cl)
		if err != nil {
			b.Fatal(err)
		}
		slices.SortFunc(fixed.Topics, func(x, y kmsg.MetadataResponseTopic) int { return strings.Compare(*x.Topic, *y.Topic) })
		for _, t := range fixed.Topics {
			slices.SortFunc(t.Partitions, func(x, y kmsg.MetadataResponseTopicPartition) int { return int(x.Partition - y.Partition) })
		}
		kf.ControlKey(kmsg.Metadata.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
			kf.KeepControl()
			if mr := kr.(*kmsg.MetadataRequest); mr.Topics != nil && !(kr.GetVersion() == 0 && len(mr.Topics) == 0) {
				return nil, nil, false // some topics: kfake's own answer
			}
			resp := *fixed
			resp.Version = kr.GetVersion()
			return &resp, nil, true
		})
		_, addr := startFerry(b, kf.ListenAddrs())
		benchMetadataSides(b, partitions, addr, kf.ListenAddrs()[0])
	}
}

// benchMetadataSides times Metadata for every topic at the member and at
// the cluster directly, partitions/10 topics expected in each answer.
func benchMetadataSides(b *testing.B, partitions int, member, direct string) {
	for _, side := range []struct{ name, addr string }{{"ferry", member}, {"direct", direct}} {
		b.Run(fmt.Sprintf("partitions=%d/%s", partitions, side.name), func(b *testing.B) {
			cl := newClient(b, side.addr)
			ctx := context.Background()
			ask := func() {
				resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
				if err != nil {
					b.Fatal(err)
				}
				if n := len(resp.Topics); n < partitions/10 {
					b.Fatalf("%d topics in the answer, want %d", n, partitions/10)
				}
			}
			ask() // connected, versions known
			b.ResetTimer()
			for b.Loop() {
				ask()
			}
		})
	}
}
