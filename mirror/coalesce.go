package mirror

import (
	"context"
	"slices"
	"sync"
)

// coalescer sends one request for the keys many goroutines ask about at
// once. Keys asked while a request is in flight wait for the next one,
// which carries every key asked meanwhile (up to max): a lone ask waits for
// its own request only, and the thousand writers that start together after
// a switch or a restart share a handful of requests. Sharing matters
// because a client holds one connection per broker and a broker takes one
// request of a connection at a time: a thousand lookups of one topic each
// queued one behind the other.
type coalescer[K comparable, V any] struct {
	// fetch asks the cluster about keys; its answer may lack some (each
	// caller decides what a missing key means). Its context ends at the
	// mirror's Close, not at any caller's.
	fetch func(ctx context.Context, keys []K) (map[K]V, error)
	// start runs the sender goroutine (Mirror.goRun); false once the
	// mirror is closed.
	start func(func()) bool
	ctx   context.Context
	max   int

	mu      sync.Mutex
	queue   []*round[K, V] // rounds not yet sent, the last one filling
	sending bool
}

// round is one request's keys and its answer.
type round[K comparable, V any] struct {
	keys map[K]struct{}
	done chan struct{} // closed when got and err are set
	got  map[K]V
	err  error
}

// getAll returns what the rounds carrying keys learned of them. err is the
// error of a round that left any of its keys unanswered (nil otherwise,
// even if a request failed for other keys), or ctx's.
func (c *coalescer[K, V]) getAll(ctx context.Context, keys ...K) (map[K]V, error) {
	c.mu.Lock()
	// Keys beyond max go to rounds of their own: a request carries at most
	// max keys, however many one ask brings.
	chunks := slices.Collect(slices.Chunk(keys, c.max))
	rounds := make([]*round[K, V], len(chunks)) // rounds[i] carries chunks[i]
	for i, chunk := range chunks {
		var r *round[K, V]
		if n := len(c.queue); n > 0 && len(c.queue[n-1].keys)+len(chunk) <= c.max {
			r = c.queue[n-1]
		} else {
			r = &round[K, V]{keys: make(map[K]struct{}, len(chunk)), done: make(chan struct{})}
			c.queue = append(c.queue, r)
		}
		for _, k := range chunk {
			r.keys[k] = struct{}{}
		}
		rounds[i] = r
	}
	if !c.sending && len(rounds) > 0 {
		c.sending = true
		if !c.start(c.send) {
			c.failAll(ErrClosed)
		}
	}
	c.mu.Unlock()

	for _, r := range rounds {
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make(map[K]V, len(keys))
	for i, chunk := range chunks {
		r := rounds[i]
		for _, k := range chunk {
			v, ok := r.got[k]
			if !ok {
				if r.err != nil {
					return out, r.err
				}
				continue
			}
			out[k] = v
		}
	}
	return out, nil
}

// send sends the queued rounds one after the other until none is left.
func (c *coalescer[K, V]) send() {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.sending = false
			c.mu.Unlock()
			return
		}
		r := c.queue[0]
		c.queue = c.queue[1:]
		c.mu.Unlock()

		keys := make([]K, 0, len(r.keys))
		for k := range r.keys {
			keys = append(keys, k)
		}
		r.got, r.err = c.fetch(c.ctx, keys)
		close(r.done)
	}
}

// failAll ends every queued round with err. c.mu is held.
func (c *coalescer[K, V]) failAll(err error) {
	for _, r := range c.queue {
		r.err = err
		close(r.done)
	}
	c.queue = nil
	c.sending = false
}
