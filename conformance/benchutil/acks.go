package benchutil

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Acks tallies what a franz-go producer had acknowledged, from its
// promises: records, their value bytes and (NewAcks(true)) each one's
// latency; it keeps the first failure. Records, Bytes and Lats are read
// after Flush.
type Acks struct {
	Records int64
	Bytes   int64           // record value bytes
	Lats    []time.Duration // in the order acknowledged; nil unless kept

	mu       sync.Mutex
	keepLats bool
	failure  error
}

// NewAcks returns an empty tally; keepLats keeps every record's latency.
func NewAcks(keepLats bool) *Acks {
	a := &Acks{keepLats: keepLats}
	if keepLats {
		a.Lats = make([]time.Duration, 0, 1<<20)
	}
	return a
}

// Ack is a record's promise: r acknowledged lat after it was produced, or
// failed with err. Safe from any goroutine.
func (a *Acks) Ack(r *kgo.Record, lat time.Duration, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		if a.failure == nil {
			a.failure = err
		}
		return
	}
	if a.keepLats {
		a.Lats = append(a.Lats, lat)
	}
	a.Records++
	a.Bytes += int64(len(r.Value))
}

// Flush waits until cl's records are acknowledged or failed and returns
// the first failure (or Flush's own error).
func (a *Acks) Flush(ctx context.Context, cl *kgo.Client) error {
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.failure
}
