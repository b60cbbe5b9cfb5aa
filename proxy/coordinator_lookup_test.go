package proxy

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestCoordinatorLookupSharedByConnections: many client connections asking
// at once for a group whose coordinator Ferry has not cached (every member
// of a group after its coordinator moved, every client after a switch) cost
// the cluster one FindCoordinator for that group, not one per connection,
// and every client is answered.
func TestCoordinatorLookupSharedByConnections(t *testing.T) {
	const group, topic, clients = "herd", "t", 20
	k := newKfake(t, 1, kfake.SeedTopics(1, topic))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The group's committed offset, written to the cluster directly.
	direct := kadm.NewClient(newClient(t, k.ListenAddrs()[0]))
	offsets := kadm.Offsets{}
	offsets.AddOffset(topic, 0, 42, -1)
	if err := direct.CommitAllOffsets(ctx, group, offsets); err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int32
	k.ControlKey(int16(kmsg.FindCoordinator), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		req := kr.(*kmsg.FindCoordinatorRequest)
		if req.CoordinatorKey == group || slices.Contains(req.CoordinatorKeys, group) {
			if asked.Add(1) == 1 {
				// Slow enough that every connection misses the
				// cache while the first lookup is out.
				time.Sleep(500 * time.Millisecond)
			}
		}
		return nil, nil, false
	})
	_, addr := startFerry(t, k.ListenAddrs())

	start := make(chan struct{})
	var wg sync.WaitGroup
	got := make([]int64, clients)
	errs := make([]error, clients)
	for i := range clients {
		cl := newClient(t, addr)
		// Connected first, so that the requests below go out together.
		if err := cl.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req := kmsg.NewPtrOffsetFetchRequest()
			req.Group = group
			rt := kmsg.NewOffsetFetchRequestTopic()
			rt.Topic, rt.Partitions = topic, []int32{0}
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, cl)
			if err != nil {
				errs[i] = err
				return
			}
			got[i] = -1
			if resp.ErrorCode != 0 {
				errs[i] = kerr.ErrorForCode(resp.ErrorCode)
			} else if len(resp.Topics) == 1 && len(resp.Topics[0].Partitions) == 1 {
				got[i] = resp.Topics[0].Partitions[0].Offset
			}
		}()
	}
	close(start)
	wg.Wait()
	for i := range clients {
		if errs[i] != nil || got[i] != 42 {
			t.Errorf("client %d: committed offset %d, %v; want 42", i, got[i], errs[i])
		}
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the cluster was asked for %q's coordinator %d times by %d connections, want once", group, n, clients)
	}
}
