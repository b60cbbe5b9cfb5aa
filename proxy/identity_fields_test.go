package proxy

import (
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// identityNames are field names that carry physical identity somewhere in
// the protocol (PROTOCOL-MAP.md).
var identityNames = map[string]bool{
	"TopicID": true, "ProducerID": true, "LeaderEpoch": true, "CurrentLeaderEpoch": true, "LastFetchedEpoch": true,
	"LeaderID": true, "NodeID": true, "Leader": true, "Replicas": true, "ISR": true, "OfflineReplicas": true,
	"ControllerID": true, "Host": true, "Port": true, "PreferredReadReplica": true, "ReplicaID": true,
	"EligibleLeaderReplicas": true, "LastKnownELR": true, "Brokers": true, "ClusterID": true, "Epoch": true,
	"Coordinators": true, "AddingReplicas": true, "RemovingReplicas": true,
}

// identityPaths lists every identity-carrying field reachable from a
// client-facing request or response type, as "Key.Request|Response.Path".
func identityPaths() []string {
	var out []string
	var walk func(prefix string, t reflect.Type, depth int)
	walk = func(prefix string, t reflect.Type, depth int) {
		if depth > 8 {
			return
		}
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() || f.Name == "UnknownTags" {
				continue
			}
			p := prefix + "." + f.Name
			if identityNames[f.Name] {
				out = append(out, p)
			}
			walk(p, f.Type, depth+1)
		}
	}
	for k := range routes {
		name := kmsg.NameForKey(k)
		walk(name+".Request", reflect.TypeOf(kmsg.RequestForKey(k)), 0)
		walk(name+".Response", reflect.TypeOf(kmsg.ResponseForKey(k)), 0)
	}
	sort.Strings(out)
	return out
}

// handledIdentity says, for every identity field a client can send or
// receive, how Ferry handles it. When kmsg grows a field (Kafka added a
// version), this test fails until the new field is looked at here.
var handledIdentity = map[string]string{
	// Answered by Ferry from its own identity.
	"Metadata.Response.Brokers": "fleet", "Metadata.Response.Brokers.Host": "fleet", "Metadata.Response.Brokers.NodeID": "fleet", "Metadata.Response.Brokers.Port": "fleet",
	"Metadata.Response.ClusterID": "virtual", "Metadata.Response.ControllerID": "fleet",
	"Metadata.Response.Topics.Partitions.Leader": "rendezvous", "Metadata.Response.Topics.Partitions.Replicas": "physical→lane of the leader's member", "Metadata.Response.Topics.Partitions.ISR": "physical→lane of the leader's member",
	"Metadata.Response.Topics.Partitions.OfflineReplicas": "empty", "Metadata.Response.Topics.Partitions.LeaderEpoch": "virtual", "Metadata.Response.Topics.TopicID": "virtual",
	"Metadata.Request.Topics.TopicID":  "virtual→name",
	"DescribeCluster.Response.Brokers": "fleet", "DescribeCluster.Response.Brokers.Host": "fleet", "DescribeCluster.Response.Brokers.NodeID": "fleet", "DescribeCluster.Response.Brokers.Port": "fleet",
	"DescribeCluster.Response.ClusterID": "virtual", "DescribeCluster.Response.ControllerID": "fleet",
	"FindCoordinator.Response.Coordinators": "fleet", "FindCoordinator.Response.Coordinators.Host": "fleet", "FindCoordinator.Response.Coordinators.NodeID": "fleet", "FindCoordinator.Response.Coordinators.Port": "fleet",
	"FindCoordinator.Response.Host": "fleet", "FindCoordinator.Response.NodeID": "fleet", "FindCoordinator.Response.Port": "fleet",
	"DescribeTopicPartitions.Response.Topics.Partitions.LeaderID": "rendezvous", "DescribeTopicPartitions.Response.Topics.Partitions.Replicas": "physical→lane of the leader's member", "DescribeTopicPartitions.Response.Topics.Partitions.ISR": "physical→lane of the leader's member",
	"DescribeTopicPartitions.Response.Topics.Partitions.EligibleLeaderReplicas": "empty", "DescribeTopicPartitions.Response.Topics.Partitions.LastKnownELR": "empty", "DescribeTopicPartitions.Response.Topics.Partitions.OfflineReplicas": "empty",

	// Split by leader and merged, rewritten by hand.
	"Produce.Request.Topics.TopicID": "virtual→physical", "Produce.Response.Topics.TopicID": "request's virtual ID",
	"Produce.Response.Brokers": "fleet", "Produce.Response.Brokers.Host": "fleet", "Produce.Response.Brokers.NodeID": "fleet", "Produce.Response.Brokers.Port": "fleet",
	"Produce.Response.Topics.Partitions.CurrentLeader.LeaderID": "rendezvous", "Produce.Response.Topics.Partitions.CurrentLeader.LeaderEpoch": "virtual",
	"Fetch.Request.Topics.TopicID": "virtual→physical", "Fetch.Response.Topics.TopicID": "request's virtual ID",
	"Fetch.Request.Topics.Partitions.CurrentLeaderEpoch": "virtual→physical, stale generation fenced", "Fetch.Request.Topics.Partitions.LastFetchedEpoch": "virtual→physical",
	"Fetch.Request.ReplicaID": "always -1 upstream", "Fetch.Request.ReplicaState.Epoch": "always -1 upstream",
	"Fetch.Request.ClusterID": "followers only; not sent upstream", "Fetch.Request.ForgottenTopics.TopicID": "sessionless: ignored",
	"Fetch.Response.Brokers": "fleet", "Fetch.Response.Brokers.Host": "fleet", "Fetch.Response.Brokers.NodeID": "fleet", "Fetch.Response.Brokers.Port": "fleet",
	"Fetch.Response.Topics.Partitions.CurrentLeader.LeaderID": "rendezvous", "Fetch.Response.Topics.Partitions.CurrentLeader.LeaderEpoch": "virtual",
	"Fetch.Response.Topics.Partitions.DivergingEpoch.Epoch": "virtual", "Fetch.Response.Topics.Partitions.PreferredReadReplica": "always -1",
	"Fetch.Response.Topics.Partitions.AbortedTransactions.ProducerID": "physical on purpose: matches the physical producer IDs in the batches it filters",
	"Fetch.Response.Topics.Partitions.SnapshotID.Epoch":               "KRaft followers only",
	"ListOffsets.Request.ReplicaID":                                   "always -1 upstream", "ListOffsets.Request.Topics.Partitions.CurrentLeaderEpoch": "virtual→physical", "ListOffsets.Response.Topics.Partitions.LeaderEpoch": "virtual",
	"OffsetForLeaderEpoch.Request.ReplicaID": "always -1 upstream", "OffsetForLeaderEpoch.Request.Topics.Partitions.CurrentLeaderEpoch": "virtual→physical",
	"OffsetForLeaderEpoch.Request.Topics.Partitions.LeaderEpoch": "virtual→physical", "OffsetForLeaderEpoch.Response.Topics.Partitions.LeaderEpoch": "virtual",
	"DescribeProducers.Response.Topics.Partitions.ActiveProducers.ProducerID": "virtual",
	"ListTransactions.Response.TransactionStates.ProducerID":                  "virtual",

	// Not physical identity, despite the name.
	"JoinGroup.Response.LeaderID":                   "a group member ID",
	"ConsumerGroupDescribe.Response.Groups.Epoch":   "the group's epoch",
	"CreateACLs.Request.Creations.Host":             "a client host pattern",
	"DeleteACLs.Request.Filters.Host":               "a client host pattern",
	"DeleteACLs.Response.Results.MatchingACLs.Host": "a client host pattern",
	"DescribeACLs.Request.Host":                     "a client host pattern",
	"DescribeACLs.Response.Resources.ACLs.Host":     "a client host pattern",
	"ApiVersions.Request.ClusterID":                 "sent by controllers only; answered locally",
	"ApiVersions.Request.NodeID":                    "sent by controllers only; answered locally",

	// Explicit replica assignments name the virtual brokers a client knows:
	// mapped to the physical brokers their lanes stand for, or refused.
	"CreateTopics.Request.Topics.ReplicaAssignment.Replicas":                 "virtual→physical by lane (replicaMap)",
	"CreatePartitions.Request.Topics.Assignment.Replicas":                    "virtual→physical by lane (replicaMap)",
	"CreateTopics.Response.Topics.TopicID":                                   "virtual (translated by forwardAny)",
	"AlterPartitionAssignments.Request.Topics.Partitions.Replicas":           "virtual→physical by lane (replicaMap)",
	"ListPartitionReassignments.Response.Topics.Partitions.Replicas":         "physical→lane of the partition's Metadata leader member",
	"ListPartitionReassignments.Response.Topics.Partitions.AddingReplicas":   "physical→lane of the partition's Metadata leader member",
	"ListPartitionReassignments.Response.Topics.Partitions.RemovingReplicas": "physical→lane of the partition's Metadata leader member",
}

func TestEveryIdentityFieldIsHandled(t *testing.T) {
	var missing []string
	for _, p := range identityPaths() {
		if _, ok := handledIdentity[p]; !ok && !translatedByName(p) {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("identity fields not accounted for in handledIdentity:\n%s", strings.Join(missing, "\n"))
	}
}

// translatedByName: fields translate() rewrites by name in every API that
// goes through the generic coordinator and admin paths.
func translatedByName(p string) bool {
	last := p[strings.LastIndex(p, ".")+1:]
	api := p[:strings.Index(p, ".")]
	generic := map[string]bool{}
	for k, r := range routes {
		if (r == routeGroup || r == routeTxn || r == routeAny) && handlers[k] == nil {
			generic[kmsg.NameForKey(k)] = true
		}
	}
	return generic[api] && (last == "TopicID" || last == "ProducerID" || last == "LeaderEpoch" || last == "CurrentLeaderEpoch")
}
