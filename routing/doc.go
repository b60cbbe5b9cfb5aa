// Package routing holds the routing state (generation, active cluster) and the
// mappings between Ferry's virtual identities and the physical ones: leader
// epochs, producer IDs and topic IDs. It also holds the fleet as the packages
// share it (fleet.go): members as brokers, the Fleet interface, and the
// rendezvous hashing that picks the member owning a key.
package routing
