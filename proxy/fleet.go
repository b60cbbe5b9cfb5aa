package proxy

import (
	"hash/fnv"
	"sort"
	"strconv"
	"sync/atomic"
)

// Broker is one broker of the virtual cluster: a Ferry member.
type Broker struct {
	NodeID int32
	Host   string
	Port   int32
	Rack   *string
}

// Fleet is the set of live Ferry members that clients see as brokers. Every
// member can serve every partition: leadership and coordination are spread
// over members only to spread load.
type Fleet interface {
	// Brokers returns the live members, ordered by node ID.
	Brokers() []Broker
	// Leader is the member clients are told leads a partition.
	Leader(topic string, partition int32) int32
	// Coordinator is the member clients are told coordinates a group or
	// transactional ID.
	Coordinator(key string) int32
}

// StaticFleet is a fixed set of members, chosen among by rendezvous hashing.
// The membership package provides a live one.
type StaticFleet struct {
	brokers atomic.Pointer[[]Broker]
}

// NewStaticFleet returns a fleet of the given members.
func NewStaticFleet(brokers ...Broker) *StaticFleet {
	f := new(StaticFleet)
	f.Set(brokers)
	return f
}

// Set replaces the members.
func (f *StaticFleet) Set(brokers []Broker) {
	bs := append([]Broker(nil), brokers...)
	sort.Slice(bs, func(i, j int) bool { return bs[i].NodeID < bs[j].NodeID })
	f.brokers.Store(&bs)
}

// Brokers implements Fleet.
func (f *StaticFleet) Brokers() []Broker { return *f.brokers.Load() }

// Leader implements Fleet.
func (f *StaticFleet) Leader(topic string, partition int32) int32 {
	return Rendezvous(f.Brokers(), topic+"\x00"+strconv.Itoa(int(partition)))
}

// Coordinator implements Fleet.
func (f *StaticFleet) Coordinator(key string) int32 {
	return Rendezvous(f.Brokers(), "coordinator\x00"+key)
}

// Rendezvous picks the member with the highest hash of (key, member): when a
// member leaves, only the keys it held move.
func Rendezvous(brokers []Broker, key string) int32 {
	best, bestID := uint64(0), int32(-1)
	for _, b := range brokers {
		h := fnv.New64a()
		h.Write([]byte(key))
		var id [4]byte
		id[0], id[1], id[2], id[3] = byte(b.NodeID>>24), byte(b.NodeID>>16), byte(b.NodeID>>8), byte(b.NodeID)
		h.Write(id[:])
		if s := h.Sum64(); bestID < 0 || s > best {
			best, bestID = s, b.NodeID
		}
	}
	return bestID
}
