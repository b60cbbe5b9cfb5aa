package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
)

// TestAuthorizedOperationsThroughFerry: DescribeCluster and Metadata
// (v8-v10) asked for the cluster's authorized operations answer what the
// cluster answers; not asked, INT32_MIN.
func TestAuthorizedOperationsThroughFerry(t *testing.T) {
	c := cluster(t)
	f := ferrytest.Start(t, c.Bootstrap())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const omitted = -2147483648

	describeCluster := func(cl *kgo.Client, include bool) *kmsg.DescribeClusterResponse {
		req := kmsg.NewPtrDescribeClusterRequest()
		req.IncludeClusterAuthorizedOperations = include
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	viaFerry, direct := client(t, f.Addr), client(t, c.Bootstrap())
	want := describeCluster(direct, true).ClusterAuthorizedOperations
	if want == omitted || want == 0 {
		t.Fatalf("the cluster answers %d; the test needs a cluster that grants operations", want)
	}
	if got := describeCluster(viaFerry, true).ClusterAuthorizedOperations; got != want {
		t.Errorf("DescribeCluster through Ferry: authorized operations %#x, the cluster answers %#x", got, want)
	}
	if got := describeCluster(viaFerry, false).ClusterAuthorizedOperations; got != omitted {
		t.Errorf("DescribeCluster through Ferry, not asked: %d, want INT32_MIN", got)
	}

	// Metadata v10, the last version with cluster authorized operations.
	v10 := kversion.Stable()
	v10.SetMaxKeyVersion(int16(kmsg.Metadata), 10)
	metadata := func(addr string, include bool) *kmsg.MetadataResponse {
		req := kmsg.NewPtrMetadataRequest()
		req.IncludeClusterAuthorizedOperations = include
		req.IncludeTopicAuthorizedOperations = include
		req.Topics = []kmsg.MetadataRequestTopic{}
		resp, err := req.RequestWith(ctx, client(t, addr, kgo.MaxVersions(v10)))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Version != 10 {
			t.Fatalf("Metadata answered at v%d, want v10", resp.Version)
		}
		return resp
	}
	if got, want := metadata(f.Addr, true).AuthorizedOperations, metadata(c.Bootstrap(), true).AuthorizedOperations; got != want || want == omitted {
		t.Errorf("Metadata v10 through Ferry: cluster authorized operations %#x, the cluster answers %#x", got, want)
	}
	if got := metadata(f.Addr, false).AuthorizedOperations; got != omitted {
		t.Errorf("Metadata v10 through Ferry, not asked: %d, want INT32_MIN", got)
	}
}
