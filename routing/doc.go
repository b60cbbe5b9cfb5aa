// Package routing holds the routing state (generation, active cluster) and the
// mappings between Ferry's virtual identities and the physical ones: leader
// epochs, producer IDs and topic IDs.
package routing
