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
	if got := len(c.m); got > maxCarried {
		t.Fatalf("%d transactional IDs remembered, bound %d", got, maxCarried)
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
