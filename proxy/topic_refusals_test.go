package proxy

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
)

// physicalIDs reads the topics' IDs from the cluster directly, as a client
// that reached the brokers would.
func physicalIDs(ctx context.Context, t *testing.T, kf *kfake.Cluster, topics ...string) map[string][16]byte {
	t.Helper()
	td, err := kadm.NewClient(newClient(t, kf.ListenAddrs()[0])).ListTopics(ctx, topics...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][16]byte{}
	for _, n := range topics {
		if td[n].Err != nil || td[n].ID == ([16]byte{}) {
			t.Fatalf("%s on the cluster: %+v", n, td[n])
		}
		out[n] = td[n].ID
	}
	return out
}

// wantVersion fails unless Ferry advertises key at v or later: the
// request under test carries topic IDs from v on.
// scratchOnlyDeleted: of the topics a DeleteTopics named, only scratch is
// gone from the cluster; Ferry's own topic and app are intact.
func scratchOnlyDeleted(ctx context.Context, t *testing.T, kf *kfake.Cluster, direct *kadm.Client) {
	t.Helper()
	ownTopicIntact(ctx, t, direct)
	td, err := kadm.NewClient(newClient(t, kf.ListenAddrs()[0])).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !td.Has("app") || td.Has("scratch") {
		t.Fatalf("topics on the cluster %v; want app kept and scratch deleted", td.Names())
	}
}

func wantVersion(t *testing.T, s *Server, key kmsg.Key, v int16) {
	t.Helper()
	if got := maxVersion(t, s, key); got < v {
		t.Fatalf("%s advertised up to v%d, want v%d (topic IDs)", kmsg.NameForKey(int16(key)), got, v)
	}
}

// TestUnknownTopicIDsRefused: in every API whose requests carry topic IDs,
// an ID that is not a virtual ID Ferry issued (here the physical IDs of
// Ferry's own topic and of an application topic, read from the cluster
// directly) is answered UNKNOWN_TOPIC_ID and never forwarded; the items
// naming topics by virtual ID are served in the same request.
func TestUnknownTopicIDsRefused(t *testing.T) {
	kf, s, addr, direct := internalFixture(t, "topic_delete")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := direct.CreateTopic(ctx, 1, 1, nil, "scratch"); err != nil {
		t.Fatal(err)
	}
	phys := physicalIDs(ctx, t, kf, ownTopic, "app")
	vid := func(n string) [16]byte { return routing.VirtualTopicID("ferry-test", n) }
	call := caller(t, addr)
	unknown := kerr.UnknownTopicID.Code
	// scratch's ID as a client learns it: from Ferry's Metadata.
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 12
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr("scratch")}}
	if mr := call(md).(*kmsg.MetadataResponse); len(mr.Topics) != 1 || mr.Topics[0].ErrorCode != 0 || mr.Topics[0].TopicID != vid("scratch") {
		t.Fatalf("Metadata for scratch through Ferry: %+v; want its virtual ID", mr.Topics)
	}

	// OffsetCommit v10: by virtual ID committed, by physical not.
	wantVersion(t, s, kmsg.OffsetCommit, 10)
	oc := kmsg.NewPtrOffsetCommitRequest()
	oc.Version, oc.Group, oc.Generation = 10, "ids", -1
	oc.Topics = []kmsg.OffsetCommitRequestTopic{
		{TopicID: vid("app"), Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1, LeaderEpoch: -1}}},
		{TopicID: phys["app"], Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 1, Offset: 2, LeaderEpoch: -1}}},
	}
	got := map[[16]byte]int16{}
	for _, rt := range call(oc).(*kmsg.OffsetCommitResponse).Topics {
		for _, p := range rt.Partitions {
			got[rt.TopicID] = p.ErrorCode
		}
	}
	if len(got) != 2 || got[vid("app")] != 0 || got[phys["app"]] != unknown {
		t.Fatalf("OffsetCommit v10 answered %v; want the virtual ID committed and the physical UNKNOWN_TOPIC_ID", got)
	}
	committed, err := direct.FetchOffsets(ctx, "ids")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := committed.Lookup("app", 0); !ok || o.At != 1 {
		t.Fatalf("app/0 committed %+v (%v); want 1", o, ok)
	}
	if o, ok := committed.Lookup("app", 1); ok {
		t.Fatalf("app/1 committed %+v by a physical ID; want nothing committed", o)
	}

	// OffsetFetch v10: the physical ID answered UNKNOWN_TOPIC_ID, not
	// with the group's offset.
	wantVersion(t, s, kmsg.OffsetFetch, 10)
	of := kmsg.NewPtrOffsetFetchRequest()
	of.Version = 10
	of.Groups = []kmsg.OffsetFetchRequestGroup{{Group: "ids", MemberEpoch: -1, Topics: []kmsg.OffsetFetchRequestGroupTopic{
		{TopicID: vid("app"), Partitions: []int32{0}}, {TopicID: phys["app"], Partitions: []int32{0}},
	}}}
	ofr := call(of).(*kmsg.OffsetFetchResponse)
	type answer struct {
		code   int16
		offset int64
	}
	fetched := map[[16]byte]answer{}
	for _, g := range ofr.Groups {
		if g.Group != "ids" || g.ErrorCode != 0 {
			t.Fatalf("OffsetFetch v10 group answer %+v", g)
		}
		for _, rt := range g.Topics {
			for _, p := range rt.Partitions {
				fetched[rt.TopicID] = answer{p.ErrorCode, p.Offset}
			}
		}
	}
	if len(ofr.Groups) != 1 || fetched[vid("app")] != (answer{0, 1}) || fetched[phys["app"]].code != unknown {
		t.Fatalf("OffsetFetch v10 answered %+v; want offset 1 by the virtual ID and UNKNOWN_TOPIC_ID for the physical", fetched)
	}

	// TxnOffsetCommit v6: by physical ID alone, answered by Ferry.
	wantVersion(t, s, kmsg.TxnOffsetCommit, 6)
	toc := kmsg.NewPtrTxnOffsetCommitRequest()
	toc.Version, toc.TransactionalID, toc.Group, toc.ProducerID, toc.ProducerEpoch = 6, "txn-ids", "ids", 1, 0
	toc.Topics = []kmsg.TxnOffsetCommitRequestTopic{{TopicID: phys["app"], Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Partition: 1, Offset: 3, LeaderEpoch: -1}}}}
	tocr := call(toc).(*kmsg.TxnOffsetCommitResponse)
	if len(tocr.Topics) != 1 || tocr.Topics[0].TopicID != phys["app"] || len(tocr.Topics[0].Partitions) != 1 || tocr.Topics[0].Partitions[0].ErrorCode != unknown {
		t.Fatalf("TxnOffsetCommit v6 answered %+v; want UNKNOWN_TOPIC_ID for the physical ID", tocr.Topics)
	}

	// Fetch v13+ and Metadata v10+ by the physical ID.
	wantVersion(t, s, kmsg.Fetch, 13)
	f := kmsg.NewPtrFetchRequest()
	f.Version, f.ReplicaID, f.MaxWaitMillis, f.MaxBytes, f.SessionEpoch = 13, -1, 100, 1<<20, -1
	f.Topics = []kmsg.FetchRequestTopic{{TopicID: phys[ownTopic], Partitions: []kmsg.FetchRequestTopicPartition{{Partition: 0, PartitionMaxBytes: 1 << 20, CurrentLeaderEpoch: -1, LastFetchedEpoch: -1}}}}
	fr := call(f).(*kmsg.FetchResponse)
	if len(fr.Topics) != 1 || len(fr.Topics[0].Partitions) != 1 || fr.Topics[0].Partitions[0].ErrorCode != unknown || len(fr.Topics[0].Partitions[0].RecordBatches) != 0 {
		t.Fatalf("Fetch v13 by the physical ID answered %+v; want UNKNOWN_TOPIC_ID and no records", fr.Topics)
	}
	md.Topics = []kmsg.MetadataRequestTopic{{TopicID: phys["app"]}}
	mr := call(md).(*kmsg.MetadataResponse)
	if len(mr.Topics) != 1 || mr.Topics[0].ErrorCode != unknown || mr.Topics[0].Topic != nil {
		t.Fatalf("Metadata v12 by the physical ID answered %+v; want UNKNOWN_TOPIC_ID and no name", mr.Topics)
	}

	// Produce v13 by the physical ID: nothing written.
	wantVersion(t, s, kmsg.Produce, 13)
	before := endOffset(t, kf, "app")
	p := oneRecordProduce("")
	p.Version, p.Topics[0].TopicID = 13, phys["app"]
	pr := call(p).(*kmsg.ProduceResponse)
	if len(pr.Topics) != 1 || len(pr.Topics[0].Partitions) != 1 || pr.Topics[0].Partitions[0].ErrorCode != unknown {
		t.Fatalf("Produce v13 by the physical ID answered %+v; want UNKNOWN_TOPIC_ID", pr.Topics)
	}
	if after := endOffset(t, kf, "app"); after != before {
		t.Fatalf("app/0 end offset %d after a produce by its physical ID, want %d", after, before)
	}

	// ConsumerGroupHeartbeat: a physical ID among the partitions the
	// member says it owns is left out; the heartbeat is served.
	hb := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	hb.Version = maxVersion(t, s, kmsg.ConsumerGroupHeartbeat)
	hb.Group, hb.MemberID, hb.MemberEpoch, hb.RebalanceTimeoutMillis = "ids-848", "m-1", 0, 30000
	hb.SubscribedTopicNames = []string{"app"}
	hb.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{{TopicID: phys["app"], Partitions: []int32{0}}}
	if r := call(hb).(*kmsg.ConsumerGroupHeartbeatResponse); r.ErrorCode != 0 {
		t.Fatalf("ConsumerGroupHeartbeat: %v %v", kerr.ErrorForCode(r.ErrorCode), r.ErrorMessage)
	}

	// DeleteTopics v6 (last: unrefused, it deletes app): the physical IDs
	// refused, scratch by its virtual ID deleted.
	wantVersion(t, s, kmsg.DeleteTopics, 6)
	del := kmsg.NewPtrDeleteTopicsRequest()
	del.Version, del.TimeoutMillis = 6, 5000
	del.Topics = []kmsg.DeleteTopicsRequestTopic{{TopicID: phys[ownTopic]}, {TopicID: phys["app"]}, {TopicID: vid("scratch")}}
	got = map[[16]byte]int16{}
	for _, rt := range call(del).(*kmsg.DeleteTopicsResponse).Topics {
		got[rt.TopicID] = rt.ErrorCode
	}
	if len(got) != 3 || got[phys[ownTopic]] != unknown || got[phys["app"]] != unknown || got[vid("scratch")] != 0 {
		t.Fatalf("DeleteTopics v6 answered %v; want both physical IDs UNKNOWN_TOPIC_ID and scratch deleted", got)
	}
	scratchOnlyDeleted(ctx, t, kf, direct)

	for _, api := range []string{"DeleteTopics", "OffsetCommit", "OffsetFetch", "TxnOffsetCommit", "ConsumerGroupHeartbeat"} {
		if n := refusals(s, api, reasonUnknownTopicID); n != 1 {
			t.Fatalf("ferry_refusals_total{api=%q,reason=unknown_topic_id} = %v, want 1", api, n)
		}
	}
}

// TestKafkaInternalTopicsRefused: with every topic class allowed, deleting
// Kafka's internal topics or their records and changing their configs or
// partitions is refused TOPIC_AUTHORIZATION_FAILED per topic, and the same
// requests' other topics are served. Internal: __consumer_offsets by its
// "__" prefix, and a topic the cluster's Metadata marks internal.
func TestKafkaInternalTopicsRefused(t *testing.T) {
	const offsets = "__consumer_offsets"
	kf := newKfake(t, 1, kfake.SeedTopics(1, offsets, "app", "doomed"))
	direct := kadm.NewClient(newClient(t, kf.ListenAddrs()[0]))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := direct.CreateTopic(ctx, 1, 1, map[string]*string{"kfake.is_internal": kmsg.StringPtr("true")}, "marked"); err != nil {
		t.Fatal(err)
	}
	dcl := newClient(t, kf.ListenAddrs()[0])
	for _, topic := range []string{offsets, "marked", "app"} {
		for range 2 {
			if err := dcl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, addr := startFerry(t, kf.ListenAddrs(), WithRequestPolicy([]string{"topic_create", "topic_delete", "topic_config", "records_delete"}, nil))
	adm := kadm.NewClient(newClient(t, addr))
	internal := []string{offsets, "marked"}

	// Configs: the internal topics' refused, app's changed.
	v := "100000"
	ac, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &v}}, offsets, "marked", "app")
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]error{}
	for _, r := range ac {
		codes[r.Name] = r.Err
	}
	for _, n := range internal {
		wantErr(t, "IncrementalAlterConfigs of "+n, codes[n], kerr.TopicAuthorizationFailed)
	}
	if len(codes) != 3 || codes["app"] != nil {
		t.Fatalf("IncrementalAlterConfigs answered %v; want app's change made", codes)
	}
	legacy, err := adm.AlterTopicConfigsState(ctx, []kadm.AlterConfig{{Name: "retention.ms", Value: &v}}, offsets)
	if err != nil {
		t.Fatal(err)
	}
	if len(legacy) != 1 {
		t.Fatalf("AlterConfigs answered %+v", legacy)
	}
	wantErr(t, "AlterConfigs of "+offsets, legacy[0].Err, kerr.TopicAuthorizationFailed)

	// Records.
	del := kadm.Offsets{}
	for _, n := range append(internal, "app") {
		del.Add(kadm.Offset{Topic: n, Partition: 0, At: 2})
	}
	recs, err := adm.DeleteRecords(ctx, del)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range internal {
		r, _ := recs.Lookup(n, 0)
		wantErr(t, "DeleteRecords of "+n, r.Err, kerr.TopicAuthorizationFailed)
	}
	if r, _ := recs.Lookup("app", 0); r.Err != nil || r.LowWatermark != 2 {
		t.Fatalf("DeleteRecords of app: %+v; want served, low watermark 2", r)
	}

	// Partitions: 2 more each.
	cp, err := adm.CreatePartitions(ctx, 2, offsets, "marked", "app")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range internal {
		wantErr(t, "CreatePartitions of "+n, cp[n].Err, kerr.TopicAuthorizationFailed)
	}
	if cp["app"].Err != nil {
		t.Fatalf("CreatePartitions of app: %v", cp["app"].Err)
	}

	// Deletes, by name and (v6) by virtual ID.
	dr, err := adm.DeleteTopics(ctx, offsets, "marked", "doomed")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range internal {
		wantErr(t, "DeleteTopics of "+n, dr[n].Err, kerr.TopicAuthorizationFailed)
	}
	if dr["doomed"].Err != nil {
		t.Fatalf("DeleteTopics of doomed: %v", dr["doomed"].Err)
	}
	wantVersion(t, s, kmsg.DeleteTopics, 6)
	byID := kmsg.NewPtrDeleteTopicsRequest()
	byID.Version, byID.TimeoutMillis = 6, 5000
	byID.Topics = []kmsg.DeleteTopicsRequestTopic{{TopicID: routing.VirtualTopicID("ferry-test", offsets)}}
	r := rawCall(t, dialRaw(t, addr), byID, 1).(*kmsg.DeleteTopicsResponse)
	if len(r.Topics) != 1 || r.Topics[0].ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("DeleteTopics v6 of %s by virtual ID answered %+v; want TOPIC_AUTHORIZATION_FAILED", offsets, r.Topics)
	}

	for api, want := range map[string]float64{"IncrementalAlterConfigs": 1, "AlterConfigs": 1, "DeleteRecords": 1, "CreatePartitions": 1, "DeleteTopics": 2} {
		if n := refusals(s, api, reasonKafkaInternalTopic); n != want {
			t.Fatalf("ferry_refusals_total{api=%q,reason=kafka_internal_topic} = %v, want %v", api, n, want)
		}
	}

	// On the cluster: the internal topics as they were, app changed.
	td, err := kadm.NewClient(newClient(t, kf.ListenAddrs()[0])).ListTopicsWithInternal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range internal {
		if !td.Has(n) || len(td[n].Partitions) != 1 {
			t.Fatalf("%s on the cluster: %+v; want it with its 1 partition", n, td[n])
		}
		if got := topicConfig(ctx, t, direct, n, "retention.ms"); got == v {
			t.Fatalf("%s retention.ms changed to %s", n, got)
		}
		starts, err := direct.ListStartOffsets(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if o, _ := starts.Lookup(n, 0); o.Offset != 0 {
			t.Fatalf("%s start offset %d, want 0: its records must stay", n, o.Offset)
		}
	}
	if td.Has("doomed") || len(td["app"].Partitions) != 3 {
		t.Fatalf("topics on the cluster %v, app %d partitions; want doomed deleted and app grown by 2 to 3", td.Names(), len(td["app"].Partitions))
	}
	if got := topicConfig(ctx, t, direct, "app", "retention.ms"); got != v {
		t.Fatalf("app retention.ms = %q, want %s", got, v)
	}
}

// TestKafkaInternalTopicNames: what Ferry takes for one of Kafka's
// internal topics without asking the cluster.
func TestKafkaInternalTopicNames(t *testing.T) {
	for name, want := range map[string]bool{
		"__consumer_offsets": true, "__transaction_state": true, "__share_group_state": true,
		"__remote_log_metadata": true, "__ferry_routing": true,
		"app": false, "_schemas": false, "connect-offsets": false, "": false,
	} {
		if got := kafkaInternal(context.Background(), nil, name, [16]byte{}); got != want {
			t.Fatalf("kafkaInternal(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestEveryTopicIDRequestChecked: every served request that can carry a
// topic ID has its IDs checked: by the unknown-ID rule (topicIDKeys), or
// by its handler (Produce and Fetch in splitTopics, Metadata). A Kafka
// version adding topic IDs to another request fails this until it is.
func TestEveryTopicIDRequestChecked(t *testing.T) {
	byHandler := keySet(kmsg.Produce, kmsg.Fetch, kmsg.Metadata)
	var carries func(reflect.Type, map[reflect.Type]bool) bool
	carries = func(tp reflect.Type, seen map[reflect.Type]bool) bool {
		switch tp.Kind() {
		case reflect.Pointer, reflect.Slice:
			return carries(tp.Elem(), seen)
		case reflect.Struct:
			if seen[tp] {
				return false
			}
			seen[tp] = true
			for i := 0; i < tp.NumField(); i++ {
				f := tp.Field(i)
				if f.IsExported() && (f.Name == "TopicID" && f.Type == uuidType || carries(f.Type, seen)) {
					return true
				}
			}
		}
		return false
	}
	checked := 0
	for _, k := range clientKeys() {
		if !carries(reflect.TypeOf(kmsg.RequestForKey(k)), map[reflect.Type]bool{}) {
			continue
		}
		checked++
		if !topicIDKeys[k] && !byHandler[k] {
			t.Errorf("%s carries topic IDs and nothing checks them", kmsg.NameForKey(k))
		}
	}
	if checked < 8 {
		t.Fatalf("%d served requests carry topic IDs; want at least the 8 known", checked)
	}
}

// TestItemRulesInOneRequest: one DeleteTopics v6 naming an item for each
// rule (Ferry's own topic by virtual ID, a physical ID, one of Kafka's
// internal topics by name) and one to serve has each refused item answered
// by its rule and the rest served; naming only refused items, the request
// is answered whole, every item by its rule.
func TestItemRulesInOneRequest(t *testing.T) {
	kf, s, addr, direct := internalFixture(t, "topic_delete")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := direct.CreateTopic(ctx, 1, 1, nil, "scratch"); err != nil {
		t.Fatal(err)
	}
	// Ferry learns scratch's virtual ID from the cluster's metadata.
	if td, err := kadm.NewClient(newClient(t, addr)).ListTopics(ctx, "scratch"); err != nil || td["scratch"].Err != nil {
		t.Fatalf("Metadata for scratch through Ferry: %v %v", err, td["scratch"].Err)
	}
	wantVersion(t, s, kmsg.DeleteTopics, 6)
	phys := physicalIDs(ctx, t, kf, "app")
	vid := func(n string) [16]byte { return routing.VirtualTopicID("ferry-test", n) }
	call := caller(t, addr)
	deleteTopics := func(topics ...kmsg.DeleteTopicsRequestTopic) map[string]int16 {
		t.Helper()
		del := kmsg.NewPtrDeleteTopicsRequest()
		del.Version, del.TimeoutMillis = 6, 5000
		del.Topics = topics
		got := map[string]int16{}
		for _, rt := range call(del).(*kmsg.DeleteTopicsResponse).Topics {
			k := fmt.Sprintf("%x", rt.TopicID) // by ID: the refused are answered without a name
			if rt.Topic != nil {
				k = *rt.Topic
			}
			got[k] = rt.ErrorCode
		}
		return got
	}
	key := func(id [16]byte) string { return fmt.Sprintf("%x", id) }
	const offsets = "__consumer_offsets"
	refusedItems := []kmsg.DeleteTopicsRequestTopic{{TopicID: vid(ownTopic)}, {TopicID: phys["app"]}, {Topic: kmsg.StringPtr(offsets)}}
	want := map[string]int16{
		key(vid(ownTopic)): topicAuthFailed,
		key(phys["app"]):   kerr.UnknownTopicID.Code,
		offsets:            topicAuthFailed,
	}

	got := deleteTopics(append(refusedItems, kmsg.DeleteTopicsRequestTopic{TopicID: vid("scratch")})...)
	want["scratch"] = 0 // the cluster's answer names it
	if !maps.Equal(got, want) {
		t.Fatalf("DeleteTopics v6 answered %v; want %v", got, want)
	}
	delete(want, "scratch")
	if got := deleteTopics(refusedItems...); !maps.Equal(got, want) {
		t.Fatalf("DeleteTopics v6 of refused items only answered %v; want %v", got, want)
	}
	scratchOnlyDeleted(ctx, t, kf, direct)
	for reason, n := range map[string]float64{reasonInternalTopic: 2, reasonUnknownTopicID: 2, reasonKafkaInternalTopic: 2} {
		if got := refusals(s, "DeleteTopics", reason); got != n {
			t.Fatalf("ferry_refusals_total{api=DeleteTopics,reason=%s} = %v, want %v", reason, got, n)
		}
	}
}
