package mirror

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testCoalescer answers each key k with "v-"+k, counting requests; a fetch
// waits for release (if set) so that asks pile up behind it.
func testCoalescer(t *testing.T, max int, release chan struct{}, fail func(keys []string) error) (*coalescer[string, string], *atomic.Int32, *sync.WaitGroup) {
	var requests atomic.Int32
	var wg sync.WaitGroup
	c := &coalescer[string, string]{
		ctx: context.Background(),
		max: max,
		start: func(f func()) bool {
			wg.Go(f)
			return true
		},
		fetch: func(ctx context.Context, keys []string) (map[string]string, error) {
			requests.Add(1)
			if len(keys) > max {
				t.Errorf("a request of %d keys, max %d", len(keys), max)
			}
			if release != nil {
				<-release
			}
			out := make(map[string]string)
			var err error
			if fail != nil {
				err = fail(keys)
			}
			for _, k := range keys {
				if err != nil && k[0] == 'x' {
					continue // what the failed part of the request would have answered
				}
				out[k] = "v-" + k
			}
			return out, err
		},
	}
	return c, &requests, &wg
}

// TestCoalescerSharesRequests: a thousand concurrent asks while one
// request is in flight go out in a few requests, each ask answered with its
// own keys.
func TestCoalescerSharesRequests(t *testing.T) {
	release := make(chan struct{})
	c, requests, wg := testCoalescer(t, 300, release, nil)
	ctx := context.Background()

	first := make(chan error, 1)
	go func() {
		got, err := c.getAll(ctx, "first")
		if err == nil && got["first"] != "v-first" {
			err = fmt.Errorf("first: got %v", got)
		}
		first <- err
	}()
	// Wait until the first request is in flight, then pile up 1,000 asks.
	for requests.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	var asks sync.WaitGroup
	errs := make(chan error, 1000)
	for i := range 1000 {
		asks.Go(func() {
			a, b := fmt.Sprint("a", i), fmt.Sprint("b", i)
			got, err := c.getAll(ctx, a, b)
			switch {
			case err != nil:
				errs <- err
			case len(got) != 2 || got[a] != "v-"+a || got[b] != "v-"+b:
				errs <- fmt.Errorf("ask %d: got %v", i, got)
			}
		})
	}
	// Every ask is queued behind the first request before it is released.
	for c.queued() != 2000 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	asks.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// 2,000 keys, 300 to a request: 7 requests, and the first.
	if n := requests.Load(); n != 8 {
		t.Errorf("%d requests, want 8", n)
	}
	// Idle again: the next ask starts a sender of its own.
	if got, err := c.getAll(ctx, "later"); err != nil || got["later"] != "v-later" {
		t.Errorf("ask after idle: %v, %v", got, err)
	}
}

// TestCoalescerErrors: a failed request fails the asks whose keys it did
// not answer, not the others; an ask's context ends its wait; a closed
// mirror fails asks at once.
func TestCoalescerErrors(t *testing.T) {
	boom := errors.New("coordinator unreachable")
	c, _, _ := testCoalescer(t, 100, nil, func([]string) error { return boom })
	ctx := context.Background()
	if got, err := c.getAll(ctx, "ok"); err != nil || got["ok"] != "v-ok" {
		t.Errorf("answered key: %v, %v", got, err)
	}
	if _, err := c.getAll(ctx, "ok", "xmissing"); !errors.Is(err, boom) {
		t.Errorf("unanswered key: err %v, want %v", err, boom)
	}

	release := make(chan struct{})
	defer close(release)
	slow, _, _ := testCoalescer(t, 100, release, nil)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := slow.getAll(cctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ask past its deadline: %v", err)
	}

	closed, requests, _ := testCoalescer(t, 100, nil, nil)
	closed.start = func(func()) bool { return false }
	if _, err := closed.getAll(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("ask of a closed mirror: %v", err)
	}
	if requests.Load() != 0 {
		t.Errorf("a closed mirror sent %d requests", requests.Load())
	}
}

// TestCoalescerSplitsLargeAsks: an ask of more keys than max goes out in
// requests of at most max keys each (testCoalescer's fetch checks), every
// key answered; a key one of those requests failed to answer fails the ask.
func TestCoalescerSplitsLargeAsks(t *testing.T) {
	const max = 100
	boom := errors.New("coordinator unreachable")
	c, requests, wg := testCoalescer(t, max, nil, func(keys []string) error {
		for _, k := range keys {
			if k[0] == 'x' {
				return boom
			}
		}
		return nil
	})
	ctx := context.Background()
	keys := make([]string, max*5/2)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	got, err := c.getAll(ctx, keys...)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(keys) {
		t.Errorf("%d keys answered, want %d", len(got), len(keys))
	}
	for _, k := range keys {
		if got[k] != "v-"+k {
			t.Errorf("key %s: got %q", k, got[k])
		}
	}
	wg.Wait()
	// 250 keys, 100 to a request.
	if n := requests.Load(); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}

	if _, err := c.getAll(ctx, append(keys, "xmissing")...); !errors.Is(err, boom) {
		t.Errorf("unanswered key in the last request: err %v, want %v", err, boom)
	}
}

// queued is the number of keys waiting in rounds not yet sent.
func (c *coalescer[K, V]) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.queue {
		n += len(r.keys)
	}
	return n
}
