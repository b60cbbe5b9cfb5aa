package proxy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// switchLease is a write lease a test turns on and off.
type switchLease struct {
	mu      sync.Mutex
	valid   bool
	changed chan struct{}
}

func (l *switchLease) Left() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.valid {
		return time.Hour
	}
	return 0
}

func (l *switchLease) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *switchLease) set(v bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.valid = v
	close(l.changed)
	l.changed = make(chan struct{})
}

// TestWritesWaitForTheWriteLease: while the member holds no write lease a
// produce reaches no cluster and is not answered; reads still are; once the
// lease is renewed the produce lands and is acknowledged.
func TestWritesWaitForTheWriteLease(t *testing.T) {
	kf := newKfake(t, 1)
	lease := &switchLease{valid: true, changed: make(chan struct{})}
	_, addr := startFerry(t, kf.ListenAddrs(), WithWriteLease(lease))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, addr))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "leased"); err != nil {
		t.Fatal(err)
	}
	prod := newClient(t, addr, kgo.DefaultProduceTopic("leased"))
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("before")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	lease.set(false)
	acked := make(chan error, 1)
	prod.Produce(ctx, &kgo.Record{Value: []byte("held")}, func(_ *kgo.Record, err error) { acked <- err })
	direct := kadm.NewClient(newClient(t, kf.ListenAddrs()[0]))
	// Reads pass while writes wait: metadata and offsets through Ferry.
	for range 5 {
		ends, err := adm.ListEndOffsets(ctx, "leased")
		if err != nil {
			t.Fatal(err)
		}
		if o, _ := ends.Lookup("leased", 0); o.Offset != 1 {
			t.Fatalf("end offset %d while the lease is lapsed, want 1", o.Offset)
		}
		select {
		case err := <-acked:
			t.Fatalf("a produce was answered (%v) without a write lease", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if ends, err := direct.ListEndOffsets(ctx, "leased"); err != nil {
		t.Fatal(err)
	} else if o, _ := ends.Lookup("leased", 0); o.Offset != 1 {
		t.Fatalf("the cluster's end offset is %d without a write lease, want 1", o.Offset)
	}

	lease.set(true)
	if err := <-acked; err != nil {
		t.Fatalf("the held produce failed after the renewal: %v", err)
	}
	ends, err := direct.ListEndOffsets(ctx, "leased")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup("leased", 0); o.Offset != 2 {
		t.Fatalf("end offset %d after the renewal, want 2", o.Offset)
	}
}

// lapsingLease is valid for its first n checks, then lapsed.
type lapsingLease struct {
	mu sync.Mutex
	n  int
}

func (l *lapsingLease) Left() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.n >= 0 {
		return time.Hour
	}
	return 0
}

func (l *lapsingLease) Changed() <-chan struct{} { return make(chan struct{}) }

// TestWriteNotSentAfterTheLeaseLapsed: a produce that passed the hold with
// the lease in force, whose lease lapsed before it was sent upstream, is
// not sent: it is answered with the retriable NOT_LEADER_OR_FOLLOWER and
// the partition holds nothing.
func TestWriteNotSentAfterTheLeaseLapsed(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "lapsed"))
	_, addr := startFerry(t, kf.ListenAddrs(), WithWriteLease(&lapsingLease{n: 1}))
	if code := rawProduce(t, dialRaw(t, addr), "lapsed", 7).ErrorCode; code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("produce answered with %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	if o := endOffset(t, kf, "lapsed"); o != 0 {
		t.Fatalf("end offset %d: the write was sent after the lease lapsed", o)
	}
}
