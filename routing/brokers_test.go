package routing

import (
	"fmt"
	"hash/fnv"
	"strconv"
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

// TestRendezvousUnchanged: the hash inlined in Rendezvous is hash/fnv's
// FNV-1a, so every key keeps its owner across the change (a fleet of
// members of two versions agrees, and nothing moves at an upgrade).
func TestRendezvousUnchanged(t *testing.T) {
	reference := func(brokers []Broker, key string) int32 {
		best, bestID := uint64(0), int32(-1)
		for _, b := range brokers {
			h := fnv.New64a()
			h.Write([]byte(key))
			h.Write([]byte{byte(b.NodeID >> 24), byte(b.NodeID >> 16), byte(b.NodeID >> 8), byte(b.NodeID)})
			if s := mix64(h.Sum64()); bestID < 0 || s > best {
				best, bestID = s, b.NodeID
			}
		}
		return bestID
	}
	bs := []Broker{{NodeID: 0}, {NodeID: 1}, {NodeID: 7}, {NodeID: 1 << 20}, {NodeID: 300}}
	for k := range 20000 {
		key := fmt.Sprintf("orders-%d\x00%d", k/7, k%7)
		if k%3 == 0 {
			key = "coordinator\x00group-" + strconv.Itoa(k)
		}
		for n := 1; n <= len(bs); n++ {
			if got, want := Rendezvous(bs[:n], key), reference(bs[:n], key); got != want {
				t.Fatalf("key %q over %d members: %d, hash/fnv's FNV-1a gives %d", key, n, got, want)
			}
		}
	}
	if got := Rendezvous(nil, "k"); got != -1 {
		t.Fatalf("no members: %d, want -1", got)
	}
}
