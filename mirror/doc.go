// Package mirror copies topics from the active cluster to the standby at the
// same offsets, forwarding record batches as bytes.
package mirror
