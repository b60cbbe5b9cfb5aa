package conformance

import (
	"testing"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// target returns the bootstrap address the client programs of the matrix
// connect to. Today that is the cluster itself, which makes the matrix a
// baseline of what real clients do against real Kafka; to run the same
// tests through Ferry, start Ferry in front of c here and return its
// address. The tests' own checks (topic creation, end offsets, committed
// offsets) always talk to the cluster directly.
func target(t *testing.T, c *kafkatest.Cluster) string {
	t.Helper()
	return c.Bootstrap()
}
