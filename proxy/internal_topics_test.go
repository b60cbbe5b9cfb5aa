package proxy

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

const (
	ownTopic    = routing.DefaultStoreTopic
	absentTopic = "__ferry_absent" // internal, never created
)

// internalFixture is a cluster holding Ferry's own topic (one record, the
// "state") and an application topic, and a Ferry that hides the former.
// allow widens the request policy.
func internalFixture(t *testing.T, allow ...string) (kf *kfake.Cluster, s *Server, addr string, direct *kadm.Client) {
	t.Helper()
	kf = newKfake(t, 1, kfake.SeedTopics(1, ownTopic), kfake.SeedTopics(2, "app"), kfake.AllowAutoTopicCreation())
	directCl := newClient(t, kf.ListenAddrs()[0])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := directCl.ProduceSync(ctx, &kgo.Record{Topic: ownTopic, Key: []byte("ferry-test"), Value: []byte("state")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s, addr = startFerry(t, kf.ListenAddrs(), WithInternalTopics(ownTopic, absentTopic), WithRequestPolicy(allow, nil))
	return kf, s, addr, kadm.NewClient(directCl)
}

// caller sends raw requests on one connection.
func caller(t *testing.T, addr string) func(kmsg.Request) kmsg.Response {
	conn := dialRaw(t, addr)
	corr := int32(0)
	return func(r kmsg.Request) kmsg.Response {
		corr++
		return rawCall(t, conn, r, corr)
	}
}

// ownTopicIntact: the cluster still holds the topic, with its one record
// from offset 0.
func ownTopicIntact(ctx context.Context, t *testing.T, direct *kadm.Client) {
	t.Helper()
	td, err := direct.ListTopics(ctx, ownTopic)
	if err != nil {
		t.Fatal(err)
	}
	if !td.Has(ownTopic) || len(td[ownTopic].Partitions) != 1 {
		t.Fatalf("%s on the cluster: %+v; want it with its 1 partition", ownTopic, td)
	}
	starts, err := direct.ListStartOffsets(ctx, ownTopic)
	if err != nil {
		t.Fatal(err)
	}
	ends, err := direct.ListEndOffsets(ctx, ownTopic)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := starts.Lookup(ownTopic, 0)
	e, _ := ends.Lookup(ownTopic, 0)
	if s.Offset != 0 || e.Offset != 1 {
		t.Fatalf("%s offsets %d-%d, want 0-1: its record must stay and nothing be added", ownTopic, s.Offset, e.Offset)
	}
}

// Metadata never lists Ferry's own topic, answers one named (by name or
// virtual ID) TOPIC_AUTHORIZATION_FAILED, and never asks the cluster for
// it: auto-creation cannot make one.
func TestInternalTopicHiddenFromMetadata(t *testing.T) {
	_, s, addr, direct := internalFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	listed, err := kadm.NewClient(newClient(t, addr)).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if listed.Has(ownTopic) || !listed.Has("app") {
		t.Fatalf("topics through Ferry %v; want app and not %s", listed.Names(), ownTopic)
	}
	if all, err := direct.ListTopics(ctx); err != nil || !all.Has(ownTopic) {
		t.Fatalf("topics on the cluster %v (%v); want %s among them", all.Names(), err, ownTopic)
	}

	call := caller(t, addr)
	for _, v := range []int16{0, 4, 12} {
		all := kmsg.NewPtrMetadataRequest()
		all.Version = v
		if v > 0 {
			all.Topics = nil // v1+: null is every topic; v0: empty is
		}
		for _, rt := range call(all).(*kmsg.MetadataResponse).Topics {
			if rt.Topic != nil && *rt.Topic == ownTopic {
				t.Fatalf("Metadata v%d for all topics lists %s", v, ownTopic)
			}
		}
	}

	named := kmsg.NewPtrMetadataRequest()
	named.Version = 12
	named.AllowAutoTopicCreation = true
	for _, n := range []string{ownTopic, "app", absentTopic} {
		named.Topics = append(named.Topics, kmsg.MetadataRequestTopic{Topic: kmsg.StringPtr(n)})
	}
	got := map[string]kmsg.MetadataResponseTopic{}
	for _, rt := range call(named).(*kmsg.MetadataResponse).Topics {
		got[*rt.Topic] = rt
	}
	for _, n := range []string{ownTopic, absentTopic} {
		rt, ok := got[n]
		if !ok || rt.ErrorCode != kerr.TopicAuthorizationFailed.Code || len(rt.Partitions) != 0 || rt.TopicID != [16]byte{} {
			t.Fatalf("Metadata naming %s: %+v; want TOPIC_AUTHORIZATION_FAILED, no partitions, no ID", n, rt)
		}
	}
	if rt := got["app"]; rt.ErrorCode != 0 || len(rt.Partitions) != 2 {
		t.Fatalf("Metadata naming app with them: %+v; want its 2 partitions", rt)
	}
	if td, err := direct.ListTopics(ctx); err != nil || td.Has(absentTopic) {
		t.Fatalf("topics on the cluster %v (%v): %s was created; it must never be asked upstream", td.Names(), err, absentTopic)
	}

	byID := kmsg.NewPtrMetadataRequest()
	byID.Version = 12
	vid := routing.VirtualTopicID("ferry-test", ownTopic)
	byID.Topics = []kmsg.MetadataRequestTopic{{TopicID: vid}}
	r := call(byID).(*kmsg.MetadataResponse)
	if len(r.Topics) != 1 || r.Topics[0].ErrorCode != kerr.TopicAuthorizationFailed.Code || r.Topics[0].TopicID != vid || r.Topics[0].Topic != nil {
		t.Fatalf("Metadata naming %s by its virtual ID: %+v; want TOPIC_AUTHORIZATION_FAILED with the ID and no name", ownTopic, r.Topics)
	}
	if n := refusals(s, "Metadata", reasonInternalTopic); n != 2 {
		t.Fatalf("ferry_refusals_total{api=Metadata,reason=internal_topic} = %v, want 2", n)
	}
}

// Produce, Fetch and the other requests split by partition leader: the
// partitions of Ferry's own topic are answered TOPIC_AUTHORIZATION_FAILED
// and never forwarded, those of another topic in the same request are
// served.
func TestInternalTopicDataRequestsRefused(t *testing.T) {
	_, s, addr, direct := internalFixture(t, "records_delete")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A client producing to both: the application's records go, the
	// state's fail.
	cl := newClient(t, addr)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: ownTopic, Value: []byte("fake state, generation 99")}).FirstErr(); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("produce to %s through Ferry: %v; want TOPIC_AUTHORIZATION_FAILED", ownTopic, err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "app", Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce to app with the same client: %v", err)
	}

	call := caller(t, addr)
	// Raw, one request naming both topics: Ferry's split is what refuses.
	p := kmsg.NewPtrProduceRequest()
	p.Version = min(maxVersion(t, s, kmsg.Produce), 12)
	p.Acks, p.TimeoutMillis = -1, 5000
	for _, n := range []string{ownTopic, "app"} {
		p.Topics = append(p.Topics, kmsg.ProduceRequestTopic{Topic: n, Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: valueBatch(-1, -1, -1, false, "raw")}}})
	}
	wantCodes(t, "Produce", produceCodes(call(p).(*kmsg.ProduceResponse)))

	f := kmsg.NewPtrFetchRequest()
	f.Version = min(maxVersion(t, s, kmsg.Fetch), 12)
	f.ReplicaID, f.MaxBytes, f.SessionEpoch = -1, 1<<20, -1
	for _, n := range []string{ownTopic, "app"} {
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.PartitionMaxBytes = 0, 1<<20
		f.Topics = append(f.Topics, kmsg.FetchRequestTopic{Topic: n, Partitions: []kmsg.FetchRequestTopicPartition{fp}})
	}
	fr := call(f).(*kmsg.FetchResponse)
	codes := map[string]int16{}
	for _, rt := range fr.Topics {
		for _, rp := range rt.Partitions {
			codes[rt.Topic] = rp.ErrorCode
			if rt.Topic == ownTopic && len(rp.RecordBatches) > 0 {
				t.Fatalf("Fetch of %s brought %d bytes of records", ownTopic, len(rp.RecordBatches))
			}
			if rt.Topic == "app" && len(rp.RecordBatches) == 0 {
				t.Fatal("Fetch of app with it brought no records")
			}
		}
	}
	wantCodes(t, "Fetch", codes)
	if maxVersion(t, s, kmsg.Fetch) >= 13 {
		f.Version = maxVersion(t, s, kmsg.Fetch)
		f.Topics[0].Topic, f.Topics[0].TopicID = "", routing.VirtualTopicID("ferry-test", ownTopic)
		f.Topics = f.Topics[:1]
		fr := call(f).(*kmsg.FetchResponse)
		if len(fr.Topics) != 1 || fr.Topics[0].Partitions[0].ErrorCode != kerr.TopicAuthorizationFailed.Code || len(fr.Topics[0].Partitions[0].RecordBatches) > 0 {
			t.Fatalf("Fetch v%d of %s by virtual ID: %+v; want TOPIC_AUTHORIZATION_FAILED, no records", f.Version, ownTopic, fr.Topics)
		}
	}

	lo := kmsg.NewPtrListOffsetsRequest()
	lo.Version = maxVersion(t, s, kmsg.ListOffsets)
	for _, n := range []string{ownTopic, "app"} {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Timestamp = -1
		lo.Topics = append(lo.Topics, kmsg.ListOffsetsRequestTopic{Topic: n, Partitions: []kmsg.ListOffsetsRequestTopicPartition{lp}})
	}
	codes = map[string]int16{}
	for _, rt := range call(lo).(*kmsg.ListOffsetsResponse).Topics {
		codes[rt.Topic] = rt.Partitions[0].ErrorCode
	}
	wantCodes(t, "ListOffsets", codes)

	oe := kmsg.NewPtrOffsetForLeaderEpochRequest()
	oe.Version, oe.ReplicaID = maxVersion(t, s, kmsg.OffsetForLeaderEpoch), -1
	for _, n := range []string{ownTopic, "app"} {
		op := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
		op.CurrentLeaderEpoch, op.LeaderEpoch = -1, 0
		oe.Topics = append(oe.Topics, kmsg.OffsetForLeaderEpochRequestTopic{Topic: n, Partitions: []kmsg.OffsetForLeaderEpochRequestTopicPartition{op}})
	}
	codes = map[string]int16{}
	for _, rt := range call(oe).(*kmsg.OffsetForLeaderEpochResponse).Topics {
		codes[rt.Topic] = rt.Partitions[0].ErrorCode
	}
	wantCodes(t, "OffsetForLeaderEpoch", codes)

	dp := kmsg.NewPtrDescribeProducersRequest()
	dp.Version = maxVersion(t, s, kmsg.DescribeProducers)
	for _, n := range []string{ownTopic, "app"} {
		dp.Topics = append(dp.Topics, kmsg.DescribeProducersRequestTopic{Topic: n, Partitions: []int32{0}})
	}
	codes = map[string]int16{}
	for _, rt := range call(dp).(*kmsg.DescribeProducersResponse).Topics {
		codes[rt.Topic] = rt.Partitions[0].ErrorCode
	}
	wantCodes(t, "DescribeProducers", codes)

	dr := kmsg.NewPtrDeleteRecordsRequest()
	dr.Version, dr.TimeoutMillis = maxVersion(t, s, kmsg.DeleteRecords), 5000
	for _, n := range []string{ownTopic, "app"} {
		dr.Topics = append(dr.Topics, kmsg.DeleteRecordsRequestTopic{Topic: n, Partitions: []kmsg.DeleteRecordsRequestTopicPartition{{Partition: 0, Offset: 1}}})
	}
	codes = map[string]int16{}
	for _, rt := range call(dr).(*kmsg.DeleteRecordsResponse).Topics {
		codes[rt.Topic] = rt.Partitions[0].ErrorCode
	}
	wantCodes(t, "DeleteRecords", codes)

	ownTopicIntact(ctx, t, direct)
	for _, api := range []string{"Produce", "Fetch", "ListOffsets", "OffsetForLeaderEpoch", "DescribeProducers", "DeleteRecords"} {
		if n := refusals(s, api, reasonInternalTopic); n < 1 {
			t.Errorf("ferry_refusals_total{api=%q,reason=internal_topic} = %v, want at least 1", api, n)
		}
	}
}

func produceCodes(r *kmsg.ProduceResponse) map[string]int16 {
	out := map[string]int16{}
	for _, rt := range r.Topics {
		out[rt.Topic] = rt.Partitions[0].ErrorCode
	}
	return out
}

// wantCodes: Ferry's own topic refused, app not.
func wantCodes(t *testing.T, api string, codes map[string]int16) {
	t.Helper()
	if codes[ownTopic] != kerr.TopicAuthorizationFailed.Code {
		t.Errorf("%s: %s answered %v; want TOPIC_AUTHORIZATION_FAILED", api, ownTopic, kerr.ErrorForCode(codes[ownTopic]))
	}
	if c, ok := codes["app"]; !ok || c == kerr.TopicAuthorizationFailed.Code || c == kerr.NotLeaderForPartition.Code || c == kerr.UnknownTopicOrPartition.Code {
		t.Errorf("%s: app answered %v (present %v); want it served with the refused topic", api, kerr.ErrorForCode(c), ok)
	}
}

// Admin requests naming Ferry's own topic: its items are refused, those
// naming other topics in the same request served, and the topic is left
// as it was.
func TestInternalTopicAdminRefused(t *testing.T) {
	_, s, addr, direct := internalFixture(t, "cluster_admin", "topic_delete", "topic_config")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, addr))

	// DeleteTopics: alone, and with a topic that goes.
	if _, err := direct.CreateTopic(ctx, 1, 1, nil, "scratch"); err != nil {
		t.Fatal(err)
	}
	dr, err := adm.DeleteTopic(ctx, ownTopic)
	if err == nil {
		err = dr.Err
	}
	wantErr(t, "DeleteTopics", err, kerr.TopicAuthorizationFailed)
	drs, err := adm.DeleteTopics(ctx, ownTopic, "scratch")
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "DeleteTopics with another", drs[ownTopic].Err, kerr.TopicAuthorizationFailed)
	if r, ok := drs["scratch"]; !ok || r.Err != nil {
		t.Fatalf("DeleteTopics of scratch with %s: %+v; want it deleted", ownTopic, drs)
	}
	call := caller(t, addr)
	if v := maxVersion(t, s, kmsg.DeleteTopics); v >= 6 {
		del := kmsg.NewPtrDeleteTopicsRequest()
		del.Version, del.TimeoutMillis = v, 5000
		vid := routing.VirtualTopicID("ferry-test", ownTopic)
		del.Topics = []kmsg.DeleteTopicsRequestTopic{{TopicID: vid}}
		r := call(del).(*kmsg.DeleteTopicsResponse)
		if len(r.Topics) != 1 || r.Topics[0].ErrorCode != kerr.TopicAuthorizationFailed.Code || r.Topics[0].TopicID != vid {
			t.Fatalf("DeleteTopics v%d by virtual ID: %+v; want TOPIC_AUTHORIZATION_FAILED for the ID", v, r.Topics)
		}
	}

	// Configs: the change of app goes, the state topic's is refused;
	// describing it is refused too.
	v := "1000"
	ac, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &v}}, ownTopic, "app")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ac {
		switch r.Name {
		case ownTopic:
			wantErr(t, "IncrementalAlterConfigs", r.Err, kerr.TopicAuthorizationFailed)
		case "app":
			if r.Err != nil {
				t.Fatalf("IncrementalAlterConfigs of app with %s: %v", ownTopic, r.Err)
			}
		}
	}
	if len(ac) != 2 {
		t.Fatalf("IncrementalAlterConfigs answers %+v, want 2", ac)
	}
	// With a broker resource the request policy refuses: each refusal
	// answered once, whether or not anything is left to forward.
	for _, names := range [][]string{{"0", ownTopic, "app"}, {"0", ownTopic}} {
		inc := kmsg.NewPtrIncrementalAlterConfigsRequest()
		inc.Version = maxVersion(t, s, kmsg.IncrementalAlterConfigs)
		for _, n := range names {
			res := kmsg.NewIncrementalAlterConfigsRequestResource()
			res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, n
			key := "retention.ms"
			if n == "0" {
				res.ResourceType, key = kmsg.ConfigResourceTypeBroker, "log.retention.ms"
			}
			res.Configs = []kmsg.IncrementalAlterConfigsRequestResourceConfig{{Name: key, Value: &v}}
			inc.Resources = append(inc.Resources, res)
		}
		got := map[string]int16{}
		r := call(inc).(*kmsg.IncrementalAlterConfigsResponse)
		for _, res := range r.Resources {
			got[res.ResourceName] = res.ErrorCode
		}
		want := map[string]int16{"0": kerr.ClusterAuthorizationFailed.Code, ownTopic: kerr.TopicAuthorizationFailed.Code}
		if len(names) == 3 {
			want["app"] = 0
		}
		if len(r.Resources) != len(names) || !maps.Equal(got, want) {
			t.Fatalf("IncrementalAlterConfigs of %v: %+v; want %v", names, r.Resources, want)
		}
	}
	legacy := kmsg.NewPtrAlterConfigsRequest()
	legacy.Version = maxVersion(t, s, kmsg.AlterConfigs)
	lr := kmsg.NewAlterConfigsRequestResource()
	lr.ResourceType, lr.ResourceName = kmsg.ConfigResourceTypeTopic, ownTopic
	lr.Configs = []kmsg.AlterConfigsRequestResourceConfig{{Name: "retention.ms", Value: &v}}
	legacy.Resources = append(legacy.Resources, lr)
	if r := call(legacy).(*kmsg.AlterConfigsResponse); len(r.Resources) != 1 || r.Resources[0].ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("AlterConfigs of %s: %+v; want TOPIC_AUTHORIZATION_FAILED", ownTopic, r.Resources)
	}
	dc := kmsg.NewPtrDescribeConfigsRequest()
	dc.Version = maxVersion(t, s, kmsg.DescribeConfigs)
	for _, n := range []string{ownTopic, "app"} {
		dc.Resources = append(dc.Resources, kmsg.DescribeConfigsRequestResource{ResourceType: kmsg.ConfigResourceTypeTopic, ResourceName: n})
	}
	codes := map[string]int16{}
	for _, r := range call(dc).(*kmsg.DescribeConfigsResponse).Resources {
		codes[r.ResourceName] = r.ErrorCode
		if r.ResourceName == ownTopic && len(r.Configs) > 0 {
			t.Fatalf("DescribeConfigs of %s answered %d configs", ownTopic, len(r.Configs))
		}
	}
	wantCodes(t, "DescribeConfigs", codes)
	if topicConfig(ctx, t, direct, ownTopic, "retention.ms") == v {
		t.Fatalf("%s retention.ms changed through Ferry", ownTopic)
	}

	// CreateTopics: refused, not TOPIC_ALREADY_EXISTS (the cluster's
	// answer); CreatePartitions: refused, the partition count kept.
	ct, err := adm.CreateTopic(ctx, 1, 1, nil, ownTopic)
	if err == nil {
		err = ct.Err
	}
	wantErr(t, "CreateTopics", err, kerr.TopicAuthorizationFailed)
	cp := kmsg.NewPtrCreatePartitionsRequest()
	cp.Version, cp.TimeoutMillis = maxVersion(t, s, kmsg.CreatePartitions), 5000
	for _, n := range []string{ownTopic, "app"} {
		cp.Topics = append(cp.Topics, kmsg.CreatePartitionsRequestTopic{Topic: n, Count: 3})
	}
	codes = map[string]int16{}
	for _, rt := range call(cp).(*kmsg.CreatePartitionsResponse).Topics {
		codes[rt.Topic] = rt.ErrorCode
	}
	wantCodes(t, "CreatePartitions", codes)

	// DescribeTopicPartitions: named, refused; for all topics, left out.
	dtp := kmsg.NewPtrDescribeTopicPartitionsRequest()
	dtp.Version, dtp.ResponsePartitionLimit = maxVersion(t, s, kmsg.DescribeTopicPartitions), 2000
	dtp.Topics = []kmsg.DescribeTopicPartitionsRequestTopic{{Topic: ownTopic}, {Topic: "app"}}
	codes = map[string]int16{}
	for _, rt := range call(dtp).(*kmsg.DescribeTopicPartitionsResponse).Topics {
		codes[*rt.Topic] = rt.ErrorCode
		if *rt.Topic == ownTopic && (len(rt.Partitions) > 0 || rt.TopicID != [16]byte{}) {
			t.Fatalf("DescribeTopicPartitions of %s: %+v; want no partitions, no ID", ownTopic, rt)
		}
	}
	wantCodes(t, "DescribeTopicPartitions", codes)
	// For all topics, a page at a time: "A" sorts before Ferry's topic,
	// "app" after it. A page cut just before Ferry's topic points past
	// it.
	if _, err := direct.CreateTopic(ctx, 1, 1, nil, "A"); err != nil {
		t.Fatal(err)
	}
	dtp.Topics, dtp.ResponsePartitionLimit = nil, 1
	var paged []string
	for page := 0; ; page++ {
		r := call(dtp).(*kmsg.DescribeTopicPartitionsResponse)
		for _, rt := range r.Topics {
			if *rt.Topic == ownTopic {
				t.Fatalf("DescribeTopicPartitions of all topics lists %s", ownTopic)
			}
			if !slices.Contains(paged, *rt.Topic) {
				paged = append(paged, *rt.Topic)
			}
		}
		if r.NextCursor == nil || page > 10 {
			break
		}
		if r.NextCursor.Topic == ownTopic {
			t.Fatalf("DescribeTopicPartitions' next cursor names %s", ownTopic)
		}
		dtp.Cursor = &kmsg.DescribeTopicPartitionsRequestCursor{Topic: r.NextCursor.Topic, Partition: r.NextCursor.Partition}
	}
	if !slices.Equal(paged, []string{"A", "app"}) {
		t.Fatalf("DescribeTopicPartitions of all topics, paged: %v; want A, app", paged)
	}

	// ListConfigResources (v1 lists topics among the resources).
	if v := maxVersion(t, s, kmsg.ListConfigResources); v >= 1 {
		lcr := kmsg.NewPtrListConfigResourcesRequest()
		lcr.Version = v
		var names []string
		for _, r := range call(lcr).(*kmsg.ListConfigResourcesResponse).ConfigResources {
			if r.Type == int8(kmsg.ConfigResourceTypeTopic) {
				names = append(names, r.Name)
			}
		}
		if slices.Contains(names, ownTopic) || !slices.Contains(names, "app") {
			t.Fatalf("ListConfigResources lists topics %v; want app and not %s", names, ownTopic)
		}
	}

	// Cluster operations (allowed by this Ferry's policy).
	el := kmsg.NewPtrElectLeadersRequest()
	el.Version, el.TimeoutMillis = maxVersion(t, s, kmsg.ElectLeaders), 5000
	el.Topics = []kmsg.ElectLeadersRequestTopic{{Topic: ownTopic, Partitions: []int32{0}}}
	if r := call(el).(*kmsg.ElectLeadersResponse); len(r.Topics) != 1 || r.Topics[0].Partitions[0].ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("ElectLeaders of %s: %+v; want TOPIC_AUTHORIZATION_FAILED", ownTopic, r.Topics)
	}
	apr := kmsg.NewPtrAlterPartitionAssignmentsRequest()
	apr.Version, apr.TimeoutMillis = maxVersion(t, s, kmsg.AlterPartitionAssignments), 5000
	apr.Topics = []kmsg.AlterPartitionAssignmentsRequestTopic{{Topic: ownTopic, Partitions: []kmsg.AlterPartitionAssignmentsRequestTopicPartition{{Partition: 0, Replicas: []int32{0}}}}}
	if r := call(apr).(*kmsg.AlterPartitionAssignmentsResponse); len(r.Topics) != 1 || r.Topics[0].Partitions[0].ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("AlterPartitionReassignments of %s: %+v; want TOPIC_AUTHORIZATION_FAILED", ownTopic, r)
	}
	lpr := kmsg.NewPtrListPartitionReassignmentsRequest()
	lpr.Version, lpr.TimeoutMillis = maxVersion(t, s, kmsg.ListPartitionReassignments), 5000
	lpr.Topics = []kmsg.ListPartitionReassignmentsRequestTopic{{Topic: ownTopic, Partitions: []int32{0}}}
	if r := call(lpr).(*kmsg.ListPartitionReassignmentsResponse); r.ErrorCode != kerr.TopicAuthorizationFailed.Code || len(r.Topics) != 0 {
		t.Fatalf("ListPartitionReassignments of %s: %+v; want TOPIC_AUTHORIZATION_FAILED", ownTopic, r)
	}

	ownTopicIntact(ctx, t, direct)
	if td, err := direct.ListTopics(ctx); err != nil || td.Has("scratch") {
		t.Fatalf("topics on the cluster %v (%v); want scratch deleted", td.Names(), err)
	}
	for _, api := range []string{"DeleteTopics", "IncrementalAlterConfigs", "AlterConfigs", "DescribeConfigs", "CreateTopics", "CreatePartitions",
		"DescribeTopicPartitions", "ElectLeaders", "AlterPartitionAssignments", "ListPartitionReassignments"} {
		if n := refusals(s, api, reasonInternalTopic); n < 1 {
			t.Errorf("ferry_refusals_total{api=%q,reason=internal_topic} = %v, want at least 1", api, n)
		}
	}
}

// A consumer group subscribed to every topic (regex .*) through Ferry
// consumes the application's records and never one of Ferry's own topic.
func TestInternalTopicNotConsumedByRegex(t *testing.T) {
	_, _, addr, direct := internalFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prod := newClient(t, addr, kgo.DefaultProduceTopic("app"))
	for i := 0; i < 5; i++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cons := newClient(t, addr, kgo.ConsumeRegex(), kgo.ConsumeTopics(".*"), kgo.ConsumerGroup("everything"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(100*time.Millisecond))
	seen := 0
	for seen < 5 {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("%d of app's 5 records consumed: %v", seen, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Errorf("consuming %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic != "app" {
				t.Fatalf("record of %s consumed through Ferry: %q", r.Topic, r.Value)
			}
			seen++
		})
	}
	// A while longer: the state's record was there before app's.
	more, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	for more.Err() == nil {
		cons.PollFetches(more).EachRecord(func(r *kgo.Record) {
			if r.Topic != "app" {
				t.Fatalf("record of %s consumed through Ferry: %q", r.Topic, r.Value)
			}
		})
	}
	// The state's record is there to consume, directly.
	ends, err := direct.ListEndOffsets(ctx, ownTopic)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup(ownTopic, 0); o.Offset != 1 {
		t.Fatalf("%s end offset %d, want 1", ownTopic, o.Offset)
	}
}

// TestInternalTopicNotAssignedByRegex: a KIP-848 member subscribing by
// regex has the broker resolve it, and ".*" matches Ferry's own topic,
// which is an ordinary topic to the broker. Ferry takes it out of the
// assignment the member is given: otherwise the member would fetch it and
// be refused (the Java consumer throws TopicAuthorizationException, and
// franz-go adopts a topic the broker assigned it).
//
// A ConsumerGroupDescribe answer shows the members' assignments, current
// and target: Ferry takes its own topic out of those too.
func TestInternalTopicNotAssignedByRegex(t *testing.T) {
	kf, s, addr, _ := internalFixture(t)
	call := caller(t, addr)
	regex := ".*"
	hb := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	hb.Version = maxVersion(t, s, kmsg.ConsumerGroupHeartbeat)
	hb.Group, hb.MemberID, hb.MemberEpoch = "by-regex", "m-1", 0
	hb.RebalanceTimeoutMillis = 30000
	hb.SubscribedTopicRegex = &regex
	hb.SubscribedTopicNames = []string{}
	hb.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	deadline := time.Now().Add(20 * time.Second)
	appID := routing.VirtualTopicID("ferry-test", "app")
	for {
		resp := call(hb).(*kmsg.ConsumerGroupHeartbeatResponse)
		if resp.ErrorCode != 0 {
			t.Fatalf("ConsumerGroupHeartbeat: %v %v", kerr.ErrorForCode(resp.ErrorCode), resp.ErrorMessage)
		}
		hb.MemberID, hb.MemberEpoch = *resp.MemberID, resp.MemberEpoch
		if resp.Assignment != nil {
			var app int
			for _, tp := range resp.Assignment.Topics {
				if tp.TopicID == routing.VirtualTopicID("ferry-test", ownTopic) {
					t.Fatalf("the member was assigned %s: %v", ownTopic, tp.Partitions)
				}
				if tp.TopicID == appID {
					app = len(tp.Partitions)
				}
			}
			if app == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no assignment of app's partitions: %+v", resp.Assignment)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The topics assigned, by name where the answer gives one, and by the
	// name of the ID (ids: physical for the cluster's own answer).
	describe := func(call func(kmsg.Request) kmsg.Response, ids map[string][16]byte) (topics map[string]bool) {
		t.Helper()
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Version = maxVersion(t, s, kmsg.ConsumerGroupDescribe)
		req.Groups = []string{"by-regex"}
		resp := call(req).(*kmsg.ConsumerGroupDescribeResponse)
		if len(resp.Groups) != 1 || resp.Groups[0].ErrorCode != 0 || len(resp.Groups[0].Members) != 1 {
			t.Fatalf("ConsumerGroupDescribe: %+v; want the group with its one member", resp.Groups)
		}
		topics = map[string]bool{}
		m := resp.Groups[0].Members[0]
		for _, a := range []kmsg.Assignment{m.Assignment, m.TargetAssignment} {
			for _, tp := range a.TopicPartitions {
				if tp.Topic != "" {
					topics[tp.Topic] = true
				}
				for n, id := range ids {
					if tp.TopicID == id {
						topics[n] = true
					}
				}
			}
		}
		return topics
	}
	// The broker's own answer shows the topic: the regex matched it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	phys := physicalIDs(ctx, t, kf, ownTopic, "app")
	if direct := describe(caller(t, kf.ListenAddrs()[0]), phys); !direct[ownTopic] || !direct["app"] {
		t.Fatalf("the group on the cluster directly has %v assigned; want app and %s", direct, ownTopic)
	}
	vids := map[string][16]byte{ownTopic: routing.VirtualTopicID("ferry-test", ownTopic), "app": appID}
	if through := describe(call, vids); through[ownTopic] || !through["app"] {
		t.Fatalf("the group described through Ferry has %v assigned; want app and not %s", through, ownTopic)
	}
}

// TestInternalTopicHiddenFromLogDirs: a DescribeLogDirs answer lists the
// partitions on a broker's disks; through Ferry, not Ferry's own.
func TestInternalTopicHiddenFromLogDirs(t *testing.T) {
	kf, s, addr, _ := internalFixture(t)
	describe := func(call func(kmsg.Request) kmsg.Response) map[string]bool {
		t.Helper()
		req := kmsg.NewPtrDescribeLogDirsRequest()
		req.Version = maxVersion(t, s, kmsg.DescribeLogDirs)
		req.Topics = nil // every topic
		topics := map[string]bool{}
		for _, d := range call(req).(*kmsg.DescribeLogDirsResponse).Dirs {
			for _, tp := range d.Topics {
				topics[tp.Topic] = true
			}
		}
		return topics
	}
	if direct := describe(caller(t, kf.ListenAddrs()[0])); !direct[ownTopic] || !direct["app"] {
		t.Fatalf("DescribeLogDirs on the cluster directly lists %v; want app and %s", direct, ownTopic)
	}
	if through := describe(caller(t, addr)); through[ownTopic] || !through["app"] {
		t.Fatalf("DescribeLogDirs through Ferry lists %v; want app and not %s", through, ownTopic)
	}
	// Named, the topic is left out as well.
	req := kmsg.NewPtrDescribeLogDirsRequest()
	req.Version = maxVersion(t, s, kmsg.DescribeLogDirs)
	req.Topics = []kmsg.DescribeLogDirsRequestTopic{{Topic: ownTopic, Partitions: []int32{0}}, {Topic: "app", Partitions: []int32{0}}}
	for _, d := range caller(t, addr)(req).(*kmsg.DescribeLogDirsResponse).Dirs {
		for _, tp := range d.Topics {
			if tp.Topic == ownTopic {
				t.Fatalf("DescribeLogDirs naming %s through Ferry lists it: %+v", ownTopic, tp)
			}
		}
	}
}

// TestInternalTopicNotAddedToTransactions: AddPartitionsToTxn naming Ferry's
// own topic and another has the former refused by Ferry and the latter
// forwarded: a transaction holding the topic would end with a marker
// written into it. (The broker's answer for the other is whatever it makes
// of the producer ID, which this test does not initialise.)
func TestInternalTopicNotAddedToTransactions(t *testing.T) {
	_, _, addr, _ := internalFixture(t)
	call := caller(t, addr)
	add := kmsg.NewPtrAddPartitionsToTxnRequest()
	add.Version = 3
	add.TransactionalID, add.ProducerID, add.ProducerEpoch = "txn-internal", 1, 0
	add.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "app", Partitions: []int32{0}}, {Topic: ownTopic, Partitions: []int32{0}}}
	resp := call(add).(*kmsg.AddPartitionsToTxnResponse)
	codes := map[string]int16{}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			codes[tp.Topic] = p.ErrorCode
		}
	}
	own, app := codes[ownTopic], codes["app"]
	if len(codes) != 2 || own != kerr.TopicAuthorizationFailed.Code || app == kerr.TopicAuthorizationFailed.Code || app == kerr.OperationNotAttempted.Code {
		t.Fatalf("AddPartitionsToTxn answered %v, want %s TOPIC_AUTHORIZATION_FAILED and app the broker's answer", codes, ownTopic)
	}
}

// TestInternalTransactionalIDRefused: the transactional ID under which
// members write the routing state is never initialised, ended, described
// or used by a client through Ferry (a client that initialised it would
// fence Ferry's writes of the state): each request naming it is answered
// TRANSACTIONAL_ID_AUTHORIZATION_FAILED and counted; a client's own
// transactional ID beside it is forwarded.
func TestInternalTransactionalIDRefused(t *testing.T) {
	_, s, addr, direct := internalFixture(t)
	ferryTxnID := routing.StoreTransactionalID(ownTopic, "ferry-test")
	call := caller(t, addr)

	init := kmsg.NewPtrInitProducerIDRequest()
	init.TransactionalID, init.TransactionTimeoutMillis = kmsg.StringPtr(ferryTxnID), 60000
	if r := call(init).(*kmsg.InitProducerIDResponse); r.ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Errorf("InitProducerId(%s) answered %v, want TRANSACTIONAL_ID_AUTHORIZATION_FAILED", ferryTxnID, kerr.ErrorForCode(r.ErrorCode))
	}
	end := kmsg.NewPtrEndTxnRequest()
	end.TransactionalID, end.ProducerID, end.ProducerEpoch = ferryTxnID, 1, 0
	if r := call(end).(*kmsg.EndTxnResponse); r.ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Errorf("EndTxn(%s) answered %v, want TRANSACTIONAL_ID_AUTHORIZATION_FAILED", ferryTxnID, kerr.ErrorForCode(r.ErrorCode))
	}
	addOffsets := kmsg.NewPtrAddOffsetsToTxnRequest()
	addOffsets.TransactionalID, addOffsets.Group = ferryTxnID, "g"
	if r := call(addOffsets).(*kmsg.AddOffsetsToTxnResponse); r.ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Errorf("AddOffsetsToTxn(%s) answered %v, want TRANSACTIONAL_ID_AUTHORIZATION_FAILED", ferryTxnID, kerr.ErrorForCode(r.ErrorCode))
	}
	add := kmsg.NewPtrAddPartitionsToTxnRequest()
	add.Version = 3
	add.TransactionalID = ferryTxnID
	add.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "app", Partitions: []int32{0}}}
	if r := call(add).(*kmsg.AddPartitionsToTxnResponse); len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1 || r.Topics[0].Partitions[0].ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Errorf("AddPartitionsToTxn(%s) answered %+v, want app[0] TRANSACTIONAL_ID_AUTHORIZATION_FAILED", ferryTxnID, r.Topics)
	}
	describe := kmsg.NewPtrDescribeTransactionsRequest()
	describe.TransactionalIDs = []string{ferryTxnID, "app-txn"}
	r := call(describe).(*kmsg.DescribeTransactionsResponse)
	codes := map[string]int16{}
	for _, st := range r.TransactionStates {
		codes[st.TransactionalID] = st.ErrorCode
	}
	if len(codes) != 2 || codes[ferryTxnID] != kerr.TransactionalIDAuthorizationFailed.Code || codes["app-txn"] == kerr.TransactionalIDAuthorizationFailed.Code {
		t.Errorf("DescribeTransactions answered %v, want %s TRANSACTIONAL_ID_AUTHORIZATION_FAILED and app-txn the broker's answer", codes, ferryTxnID)
	}
	if n := refusals(s, "InitProducerID", reasonInternalTxnID); n != 1 {
		t.Errorf("ferry_refusals_total{api=InitProducerID,reason=%s} = %v, want 1", reasonInternalTxnID, n)
	}

	// Nothing reached the cluster for Ferry's transactional ID.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dt, err := direct.DescribeTransactions(ctx, ferryTxnID)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := dt[ferryTxnID]; ok && d.Err == nil && d.ProducerID >= 0 {
		t.Errorf("the cluster knows %s (producer ID %d): a client's request for it was forwarded", ferryTxnID, d.ProducerID)
	}
}
