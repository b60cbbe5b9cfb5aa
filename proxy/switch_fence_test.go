package proxy

import (
	"strconv"
	"testing"
	"time"
)

// The transactional IDs clients name are remembered within a bound: a
// client naming ever new ones does not grow the member's memory, and the
// IDs named last are still known as carried.
func TestCarriedTxnsBounded(t *testing.T) {
	var c carriedTxns
	now := time.Unix(1_000_000, 0)
	const n = maxCarried + maxCarried/2
	for i := range n {
		c.note("txn-"+strconv.Itoa(i), now.Add(time.Duration(i)*time.Millisecond))
	}
	end := now.Add(n * time.Millisecond)
	if got := c.m.Len(); got > maxCarried {
		t.Fatalf("%d transactional IDs remembered, bound %d", got, maxCarried)
	}
	if c.carries("txn-0", end) {
		t.Fatalf("txn-0, the least recently named of %d, is still carried", n)
	}
	for i := n - 100; i < n; i++ {
		if !c.carries("txn-"+strconv.Itoa(i), end) {
			t.Fatalf("txn-%d, named among the last, is not carried", i)
		}
	}
	if c.carries("txn-"+strconv.Itoa(n-1), end.Add(carriedFor)) {
		t.Fatalf("an ID last named %v ago is still carried", carriedFor)
	}
}

// The fences a switch's drain announces are remembered within the same
// bound, the latest kept, and an init by another producer forgets one.
func TestSwitchFencesBounded(t *testing.T) {
	var f switchFences
	const n = maxCarried + maxCarried/2
	fs := make([]SwitchFence, n)
	for i := range fs {
		fs[i] = SwitchFence{TxnID: "txn-" + strconv.Itoa(i), ProducerID: int64(i), Epoch: 3}
	}
	f.add(7, fs)
	if got := f.n.Load(); got != maxCarried {
		t.Fatalf("%d fences remembered, want the bound %d", got, maxCarried)
	}
	if f.fenced(7, "txn-0", 0, 3) {
		t.Fatal("txn-0, the oldest fence, is still remembered past the bound")
	}
	last := "txn-" + strconv.Itoa(n-1)
	if !f.fenced(7, last, n-1, 3) {
		t.Fatalf("%s, fenced last, is not fenced", last)
	}
	for _, miss := range []struct {
		gen   uint32
		pid   int64
		epoch int16
	}{{8, n - 1, 3}, {7, n - 2, 3}, {7, n - 1, 4}} {
		if f.fenced(miss.gen, last, miss.pid, miss.epoch) {
			t.Fatalf("%s fenced under generation %d, producer ID %d, epoch %d", last, miss.gen, miss.pid, miss.epoch)
		}
	}
	f.forget(last)
	if f.fenced(7, last, n-1, 3) || f.n.Load() != maxCarried-1 {
		t.Fatalf("%s still fenced after forget (%d fences)", last, f.n.Load())
	}
}
