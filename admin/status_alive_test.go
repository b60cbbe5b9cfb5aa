package admin

import (
	"slices"
	"testing"
)

// TestStatusAlive: the members a status lists alive, by node ID in order,
// and none of those suspect, dead or left.
func TestStatusAlive(t *testing.T) {
	st := Status{Members: []Member{
		{NodeID: 3, State: "alive"}, {NodeID: 1, State: "suspect"},
		{NodeID: 0, State: "alive"}, {NodeID: 2, State: "dead"}, {NodeID: 4, State: "left"},
	}}
	if got := st.Alive(); !slices.Equal(got, []int32{0, 3}) {
		t.Fatalf("alive %v, want [0 3]", got)
	}
	if got := (Status{}).Alive(); len(got) != 0 {
		t.Fatalf("alive %v with no members", got)
	}
}
