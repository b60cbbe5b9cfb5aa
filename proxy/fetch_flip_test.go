package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// TestParkedFetchAnsweredAtTheFlip: a fetch long-polling the active cluster
// when a switch flips to the other one is answered at the flip, empty and
// without error, instead of after its MaxWait on a cluster where no record
// will come; the consumer's next fetch then goes to the new cluster. Both
// for a fetch to one broker and for one split over two. The same when the
// member's Shutdown begins: the fetch is answered then, not at its MaxWait,
// and the client's next fetch goes to another member.
func TestParkedFetchAnsweredAtTheFlip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		brokers  int
		shutdown bool // Shutdown begins instead of a flip
	}{{"one broker", 1, false}, {"split over two brokers", 2, false}, {"shutdown, one broker", 1, true}, {"shutdown, split", 2, true}} {
		t.Run(tc.name, func(t *testing.T) {
			const topic = "parked"
			parts := int32(tc.brokers)
			a := newKfake(t, tc.brokers, kfake.SeedTopics(parts, topic))
			b := newKfake(t, tc.brokers, kfake.SeedTopics(parts, topic))
			if tc.brokers > 1 {
				// One partition on each broker: the fetch is split.
				if err := a.MoveTopicPartition(topic, 1, a.LeaderFor(topic, 0)^1); err != nil {
					t.Fatal(err)
				}
			}
			// Told when a fetch for the topic reaches a, so that the flip
			// comes while it is parked there.
			parked := make(chan int, 8) // partitions of the topic in a fetch
			a.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
				a.KeepControl()
				for _, ft := range kr.(*kmsg.FetchRequest).Topics {
					if ft.Topic == topic {
						parked <- len(ft.Partitions)
					}
				}
				return nil, nil, false
			})
			table := routing.NewTable(routing.State{Active: "a"})
			s, addr := startFerry(t, a.ListenAddrs(), WithRoutingTable(table),
				WithClusters(upstream.Config{Name: "a", Bootstrap: a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: b.ListenAddrs(), MirrorTarget: true}))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cl := newClient(t, addr, kgo.MaxVersions(kversion.V3_0_0())) // Fetch v12: topics by name
			if err := cl.Ping(ctx); err != nil {
				t.Fatal(err)
			}

			const maxWait = 20 * time.Second
			req := kmsg.NewPtrFetchRequest()
			req.MaxWaitMillis, req.MinBytes, req.MaxBytes = int32(maxWait/time.Millisecond), 1, 1<<20
			ft := kmsg.FetchRequestTopic{Topic: topic}
			for p := range parts {
				ft.Partitions = append(ft.Partitions, kmsg.FetchRequestTopicPartition{Partition: p, FetchOffset: 0, PartitionMaxBytes: 1 << 20, CurrentLeaderEpoch: -1, LastFetchedEpoch: -1, LogStartOffset: -1})
			}
			req.Topics = []kmsg.FetchRequestTopic{ft}
			type answer struct {
				resp *kmsg.FetchResponse
				err  error
				at   time.Time
			}
			answered := make(chan answer, 1)
			go func() {
				resp, err := req.RequestWith(ctx, cl)
				answered <- answer{resp, err, time.Now()}
			}()
			for n := 0; n < int(parts); {
				select {
				case k := <-parked:
					if tc.brokers > 1 && k == int(parts) {
						t.Fatalf("one upstream fetch named all %d partitions: not split", parts)
					}
					n += k
				case got := <-answered:
					t.Fatalf("answered before it reached cluster a: %+v, %v", got.resp, got.err)
				case <-ctx.Done():
					t.Fatal("the fetch never reached cluster a")
				}
			}
			flip := time.Now()
			if tc.shutdown {
				// Waited for before the test ends: it logs to t.
				done := make(chan struct{})
				go func() {
					defer close(done)
					sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer scancel()
					s.Shutdown(sctx)
				}()
				t.Cleanup(func() { <-done })
			} else {
				table.Update(routing.State{Generation: 1, Active: "b", Last: &routing.Switch{From: "a", To: "b"}})
			}

			var got answer
			select {
			case got = <-answered:
			case <-ctx.Done():
				t.Fatal("no answer to the parked fetch")
			}
			if got.err != nil {
				t.Fatal(got.err)
			}
			if took := got.at.Sub(flip); took > maxWait/4 {
				t.Errorf("the parked fetch was answered %v after the flip, its MaxWait being %v", took, maxWait)
			}
			n := 0
			for _, rt := range got.resp.Topics {
				for _, p := range rt.Partitions {
					n++
					if p.ErrorCode != 0 || len(p.RecordBatches) != 0 || p.HighWatermark != 0 {
						t.Errorf("partition %d answered error %d, %d record bytes, high watermark %d; want an empty answer at 0",
							p.Partition, p.ErrorCode, len(p.RecordBatches), p.HighWatermark)
					}
				}
			}
			if n != int(parts) {
				t.Errorf("%d partitions answered, want %d", n, parts)
			}
		})
	}
}
