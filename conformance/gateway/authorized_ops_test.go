package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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

	// A topic's authorized operations (latest Metadata), and those of a
	// topic asked for by an ID nobody knows.
	createTopic(t, kadm.NewClient(direct), "authz", 1, nil)
	topicOps := func(cl *kgo.Client, include bool) (byName, byUnknownID int32) {
		ops := func(topic kmsg.MetadataRequestTopic) int32 {
			req := kmsg.NewPtrMetadataRequest()
			req.IncludeTopicAuthorizedOperations = include
			req.Topics = []kmsg.MetadataRequestTopic{topic}
			resp, err := req.RequestWith(ctx, cl)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Topics) != 1 {
				t.Fatalf("Metadata for %v answered %d topics, want 1", topic, len(resp.Topics))
			}
			return resp.Topics[0].AuthorizedOperations
		}
		return ops(kmsg.MetadataRequestTopic{Topic: kmsg.StringPtr("authz")}), ops(kmsg.MetadataRequestTopic{TopicID: [16]byte{0xfe, 1}})
	}
	for _, include := range []bool{true, false} {
		gotName, gotID := topicOps(viaFerry, include)
		wantName, wantID := topicOps(direct, include)
		if gotName != wantName || gotID != wantID {
			t.Errorf("Metadata (include topic operations %v) through Ferry: %#x for the topic, %#x for an unknown ID; the cluster answers %#x and %#x",
				include, gotName, gotID, wantName, wantID)
		}
	}
}
