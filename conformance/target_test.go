package conformance

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/proxy"
)

// target starts Ferry in front of c for the rest of the test and returns
// its address: the client programs of the matrix connect only to Ferry. The
// tests' own checks (topic creation, end offsets, committed offsets) talk
// to the cluster directly, and committed offsets are also read through
// Ferry (see checkGroup). opts change Ferry's configuration (a request
// policy, for a test that deletes topics).
func target(t *testing.T, c *kafkatest.Cluster, opts ...proxy.Option) string {
	t.Helper()
	return ferrytest.Start(t, c.Bootstrap(), opts...).Addr
}

// viaTarget returns a kadm client talking through the target.
func viaTarget(t *testing.T, bootstrap string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bootstrap, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}
