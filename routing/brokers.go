package routing

import (
	"sort"
	"sync/atomic"
)

// Broker is a Ferry member, or one of the virtual brokers it presents.
type Broker struct {
	NodeID int32
	Host   string
	Port   int32
	Rack   *string
	// LanePorts are the ports of the member's lanes (see proxy/lanes.go), lane
	// 0 first; a lane without one is at Port plus its number.
	LanePorts []int32
}

// LanePort is the port a lane of this member is advertised at.
func (b Broker) LanePort(lane int) int32 {
	if lane < len(b.LanePorts) {
		return b.LanePorts[lane]
	}
	return b.Port + int32(lane)
}

// BrokerSet is the live Ferry members as the brokers clients see, and
// which of them owns a key. Every member can serve every partition:
// ownership is spread over members only to spread load.
type BrokerSet interface {
	// Brokers returns the live members, ordered by node ID.
	Brokers() []Broker
	// Owner is the member that owns a key (rendezvous hashing).
	Owner(key string) int32
}

// StaticBrokerSet is a fixed set of members, chosen among by rendezvous
// hashing (a member alone, and tests); cmd/ferry provides the live one
// from gossip.
type StaticBrokerSet struct {
	brokers atomic.Pointer[[]Broker]
}

// NewStaticBrokerSet returns a set of the given members.
func NewStaticBrokerSet(brokers ...Broker) *StaticBrokerSet {
	f := new(StaticBrokerSet)
	f.Set(brokers)
	return f
}

// Set replaces the members.
func (f *StaticBrokerSet) Set(brokers []Broker) {
	bs := append([]Broker(nil), brokers...)
	sort.Slice(bs, func(i, j int) bool { return bs[i].NodeID < bs[j].NodeID })
	f.brokers.Store(&bs)
}

// Brokers implements BrokerSet.
func (f *StaticBrokerSet) Brokers() []Broker { return *f.brokers.Load() }

// Owner implements BrokerSet.
func (f *StaticBrokerSet) Owner(key string) int32 { return Rendezvous(f.Brokers(), key) }

// Rendezvous picks the member with the highest hash of (key, member): when a
// member leaves, only the keys it held move.
//
// The FNV-1a hash of key and node ID is mixed (murmur3's 64-bit finalizer)
// before the comparison: node IDs differ in their last bytes only, and raw
// FNV hashes of inputs that differ at the end lie close together, so a few
// low bits of the key's hash decided the winner and some members got twice
// the keys of others.
func Rendezvous(brokers []Broker, key string) int32 {
	// FNV-1a inline, the key hashed once (hash/fnv allocated a hasher
	// per member, for every partition of every Metadata answer).
	keyed := uint64(fnvOffset64)
	for i := range len(key) {
		keyed = (keyed ^ uint64(key[i])) * fnvPrime64
	}
	best, bestID := uint64(0), int32(-1)
	for _, b := range brokers {
		h := keyed
		for _, c := range [4]byte{byte(b.NodeID >> 24), byte(b.NodeID >> 16), byte(b.NodeID >> 8), byte(b.NodeID)} {
			h = (h ^ uint64(c)) * fnvPrime64
		}
		if s := mix64(h); bestID < 0 || s > best {
			best, bestID = s, b.NodeID
		}
	}
	return bestID
}

// FNV-1a's 64-bit parameters (hash/fnv).
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// mix64 is murmur3's fmix64: every input bit affects every output bit.
func mix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}
