package connstats

import (
	"errors"
	"testing"
	"time"
)

// TestQueryCheck: a bad state, sort, offset or limit is the caller's
// mistake (ErrQuery); an empty query takes the defaults.
func TestQueryCheck(t *testing.T) {
	var q Query
	if err := q.Check(); err != nil || q.State != "open" || q.Sort != "id" || q.Limit != defaultLimit {
		t.Fatalf("empty query: %+v, %v", q, err)
	}
	for _, bad := range []Query{{State: "gone"}, {Sort: "name"}, {Offset: -1}, {Limit: maxLimit + 1}, {Limit: -1}} {
		if err := bad.Check(); !errors.Is(err, ErrQuery) {
			t.Errorf("%+v: %v, want ErrQuery", bad, err)
		}
	}
}

// TestSelect: filters keep what contains them, counters sort largest
// first with ties by ID, and Offset and Limit page what matched.
func TestSelect(t *testing.T) {
	now := time.Now()
	all := []Info{
		{ID: 1, ClientID: "app-a", BytesIn: 10},
		{ID: 2, ClientID: "app-b", BytesIn: 30},
		{ID: 3, ClientID: "other", BytesIn: 30},
		{ID: 4, ClientID: "app-c", BytesIn: 20},
	}
	q := Query{Sort: "bytes_in", ClientID: "app", Offset: 1, Limit: 2}
	if err := q.Check(); err != nil {
		t.Fatal(err)
	}
	r := Select(q, now, 4, append([]Info(nil), all...))
	if r.Open != 4 || r.Matched != 3 || len(r.Connections) != 2 || r.Connections[0].ID != 4 || r.Connections[1].ID != 1 {
		t.Fatalf("report %+v, want matched 3 and page [4 1]", r)
	}
	q = Query{Sort: "bytes_in"}
	if err := q.Check(); err != nil {
		t.Fatal(err)
	}
	r = Select(q, now, 4, append([]Info(nil), all...))
	if got := []uint64{r.Connections[0].ID, r.Connections[1].ID}; got[0] != 2 || got[1] != 3 {
		t.Errorf("ties of bytes_in in order %v, want by ID [2 3]", got)
	}
}

// TestRingKeepsLatest: the ring holds at most ClosedKept, the latest, and
// lists none closed more than ClosedMaxAge ago.
func TestRingKeepsLatest(t *testing.T) {
	var r Ring
	now := time.Now()
	old := now.Add(-ClosedMaxAge - time.Second)
	r.Add(Info{ID: 0, ClosedAt: &old})
	for i := range ClosedKept {
		at := now
		r.Add(Info{ID: uint64(i + 1), ClosedAt: &at})
	}
	got := r.List(now)
	if len(got) != ClosedKept || got[0].ID != 1 || got[len(got)-1].ID != ClosedKept {
		t.Fatalf("%d kept, first %d last %d; want %d from 1 to %d", len(got), got[0].ID, got[len(got)-1].ID, ClosedKept, ClosedKept)
	}
	var r2 Ring
	r2.Add(Info{ID: 9, ClosedAt: &old})
	if n := len(r2.List(now)); n != 0 {
		t.Errorf("a connection closed before ClosedMaxAge listed (%d)", n)
	}
}
