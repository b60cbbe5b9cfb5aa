package routing

import (
	"fmt"
	"testing"
)

// TestRendezvousSpreadsEvenly: over many keys every member of a fleet owns
// close to its share, for node ID sets that differ only in their low bits;
// and a member's departure moves only the keys it owned.
func TestRendezvousSpreadsEvenly(t *testing.T) {
	const keys = 30000
	for _, ids := range [][]int32{{0, 1, 2}, {1, 2, 3}, {10, 20, 30}, {0, 1, 2, 3, 4, 5}} {
		var bs []Broker
		for _, id := range ids {
			bs = append(bs, Broker{NodeID: id})
		}
		count := map[int32]int{}
		for k := range keys {
			count[Rendezvous(bs, fmt.Sprintf("mirror\x00orders-%d\x00%d", k/12, k%12))]++
		}
		share := keys / len(ids)
		for _, id := range ids {
			if c := count[id]; c < share*9/10 || c > share*11/10 {
				t.Fatalf("members %v: member %d owns %d of %d keys, want %d ±10%% (%v)", ids, id, c, keys, share, count)
			}
		}
	}

	all := []Broker{{NodeID: 0}, {NodeID: 1}, {NodeID: 2}}
	rest := []Broker{{NodeID: 0}, {NodeID: 2}}
	for k := range 5000 {
		key := fmt.Sprint("k", k)
		before, after := Rendezvous(all, key), Rendezvous(rest, key)
		if before != 1 && before != after {
			t.Fatalf("key %s moved from member %d to %d when member 1 left", key, before, after)
		}
	}
}
