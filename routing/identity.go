package routing

import (
	"crypto/sha256"
)

// Virtual leader epochs and producer IDs carry the routing generation in their
// high bits, so that they never go backwards across a switch (clients ignore
// metadata whose epoch went backwards) and a value issued under one
// generation is recognised, and refused, under the next. Generation 0 maps
// every value to itself: a fleet that never switched shows clients exactly
// what the brokers say, and nothing in a batch needs rewriting.
//
// The limits, which nothing may wrap past:
//   - MaxGeneration (2047): a virtual epoch is int32 and its sign bit
//     means "unknown", so 31-EpochBits bits carry the generation. A switch
//     that would go past it is refused (ReasonGenerationLimit).
//   - MaxPhysicalEpoch (2^20-1 leader elections of one partition): a
//     larger physical epoch has no virtual one and is shown to clients as
//     unknown (-1), which every client takes as "no epoch" (no fencing by
//     epoch for that partition, as with a broker that reports none),
//     rather than truncated to an epoch that names another leader.
//   - Physical producer IDs below 2^48, and 2^15 generations of them:
//     Kafka hands out IDs in blocks of 1000 from 0.
const (
	// EpochBits is how many low bits of a virtual epoch hold the physical
	// one.
	EpochBits = 20
	epochMask = 1<<EpochBits - 1

	// MaxPhysicalEpoch is the largest physical leader epoch that has a
	// virtual one.
	MaxPhysicalEpoch = epochMask

	// MaxGeneration is the last generation whose virtual epochs stay
	// positive.
	MaxGeneration = 1<<(31-EpochBits) - 1

	// PIDBits is how many low bits of a virtual producer ID hold the
	// physical one.
	PIDBits = 48
	pidMask = 1<<PIDBits - 1
)

// VirtualEpoch maps a physical leader epoch of generation gen to the epoch
// clients see. Negative epochs (-1: unknown) pass through; an epoch above
// MaxPhysicalEpoch, or any past MaxGeneration, becomes unknown (-1).
func VirtualEpoch(gen uint32, phys int32) int32 {
	if phys < 0 {
		return phys
	}
	if phys > MaxPhysicalEpoch || gen > MaxGeneration {
		return -1
	}
	return int32(gen)<<EpochBits | phys
}

// PhysicalEpoch maps a virtual epoch back. ok is false when the epoch was
// issued under another generation: the client holds stale metadata and must
// be told FENCED_LEADER_EPOCH (older) or UNKNOWN_LEADER_EPOCH (newer).
func PhysicalEpoch(gen uint32, virt int32) (phys int32, ok bool) {
	if virt < 0 {
		return virt, true
	}
	return virt & epochMask, uint32(virt>>EpochBits) == gen
}

// EpochGeneration is the generation a virtual epoch was issued under.
func EpochGeneration(virt int32) uint32 {
	if virt < 0 {
		return 0
	}
	return uint32(virt >> EpochBits)
}

// VirtualPID maps a physical producer ID of generation gen to the ID clients
// see. Negative IDs (-1: none) pass through.
func VirtualPID(gen uint32, phys int64) int64 {
	if phys < 0 {
		return phys
	}
	return int64(gen)<<PIDBits | phys&pidMask
}

// PhysicalPID maps a virtual producer ID back; ok is false when it was issued
// under another generation (it means nothing, or someone else, now).
func PhysicalPID(gen uint32, virt int64) (phys int64, ok bool) {
	if virt < 0 {
		return virt, true
	}
	return virt & pidMask, uint64(virt>>PIDBits) == uint64(gen)
}

// VirtualTopicID is the topic ID clients see for a topic: derived from the
// virtual cluster's ID and the topic's name, so it is the same on every Ferry
// member and across both physical clusters (which assign different IDs).
// A topic deleted and re-created under the same name keeps its virtual ID.
func VirtualTopicID(clusterID, topic string) [16]byte {
	h := sha256.New()
	h.Write([]byte("ferry-topic-id\x00"))
	h.Write([]byte(clusterID))
	h.Write([]byte{0})
	h.Write([]byte(topic))
	var id [16]byte
	copy(id[:], h.Sum(nil))
	// RFC 9562 version 8 (custom) and variant bits; never the zero UUID
	// nor Kafka's reserved metadata topic ID (0…01).
	id[6] = id[6]&0x0f | 0x80
	id[8] = id[8]&0x3f | 0x80
	return id
}
