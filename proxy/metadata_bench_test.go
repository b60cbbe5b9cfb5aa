package proxy

import (
	"context"
	"fmt"
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
		for _, side := range []struct{ name, addr string }{{"ferry", addr}, {"direct", kf.ListenAddrs()[0]}} {
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
}
