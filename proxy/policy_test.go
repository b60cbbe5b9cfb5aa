package proxy

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// refusals reads ferry_refusals_total{api,reason}.
func refusals(s *Server, api, reason string) float64 {
	return testutil.ToFloat64(s.metrics.refusals.WithLabelValues(api, reason))
}

func wantErr(t *testing.T, what string, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Fatalf("%s: error %v, want %v", what, got, want)
	}
}

// privileged makes one change of each class refused by default through
// adm, and returns each change's error: the request's, else its item's
// (kadm reports some refusals one way, some the other).
func privileged(ctx context.Context, adm *kadm.Client) map[string]error {
	out := map[string]error{}
	either := func(err, item error) error {
		if err != nil {
			return err
		}
		return item
	}
	scram, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "mallory", Mechanism: kadm.ScramSha256, Iterations: 4096, Password: "pw"}})
	out["AlterUserSCRAMCredentials"] = either(err, scram["mallory"].Err)

	acl := kadm.NewACLs().Allow("User:mallory").AllowHosts().Topics("any").Operations(kadm.OpAll).ResourcePatternType(kadm.ACLPatternLiteral)
	created, err := adm.CreateACLs(ctx, acl)
	if err == nil && len(created) != 1 {
		err = fmt.Errorf("%d results, want 1", len(created))
	}
	if err == nil {
		err = created[0].Err
	}
	out["CreateACLs"] = err

	del := kadm.NewACLs().Allow("User:alice").AllowHosts().Topics("keep").Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral)
	deleted, err := adm.DeleteACLs(ctx, del)
	if err == nil && len(deleted) != 1 {
		err = fmt.Errorf("%d results, want 1", len(deleted))
	}
	if err == nil {
		err = deleted[0].Err
	}
	out["DeleteACLs"] = err

	client := "mallory-app"
	quotas, err := adm.AlterClientQuotas(ctx, []kadm.AlterClientQuotaEntry{{
		Entity: kadm.ClientQuotaEntity{{Type: "client-id", Name: &client}},
		Ops:    []kadm.AlterClientQuotaOp{{Key: "producer_byte_rate", Value: 1024}},
	}})
	if err == nil && len(quotas) != 1 {
		err = fmt.Errorf("%d results, want 1", len(quotas))
	}
	if err == nil {
		err = quotas[0].Err
	}
	out["AlterClientQuotas"] = err

	v := "1234567"
	bc, err := adm.AlterBrokerConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "log.retention.ms", Value: &v}}, 0)
	if err == nil && len(bc) != 1 {
		err = fmt.Errorf("%d results, want 1", len(bc))
	}
	if err == nil {
		err = bc[0].Err
	}
	out["IncrementalAlterConfigs"] = err
	return out
}

// privilegedState is what the cluster holds of the changes privileged
// makes, read directly.
func privilegedState(ctx context.Context, t *testing.T, cl *kgo.Client) (scramUsers, acls, quotas int, retention string) {
	t.Helper()
	direct := kadm.NewClient(cl)
	users, err := direct.DescribeUserSCRAMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acls = len(describeAllACLs(ctx, t, cl))
	qs, err := direct.DescribeClientQuotas(ctx, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	bc, err := direct.DescribeBrokerConfigs(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := bc.On("0", nil)
	for _, c := range rc.Configs {
		if c.Key == "log.retention.ms" {
			retention = c.MaybeValue()
		}
	}
	return len(users), acls, len(qs), retention
}

// describeAllACLs lists every ACL (a filter of ANY everywhere).
func describeAllACLs(ctx context.Context, t *testing.T, cl *kgo.Client) []kmsg.DescribeACLsResponseResourceACL {
	t.Helper()
	req := kmsg.NewPtrDescribeACLsRequest()
	req.ResourceType, req.ResourcePatternType = kmsg.ACLResourceTypeAny, kmsg.ACLResourcePatternTypeAny
	req.Operation, req.PermissionType = kmsg.ACLOperationAny, kmsg.ACLPermissionTypeAny
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("DescribeACLs: %v", err)
	}
	var out []kmsg.DescribeACLsResponseResourceACL
	for _, r := range resp.Resources {
		out = append(out, r.ACLs...)
	}
	return out
}

// By default an anonymous client cannot use Ferry's identity to create
// users, change ACLs or quotas, or reconfigure brokers: each change is
// answered with Kafka's authorizer code, the cluster is unchanged, and the
// connection keeps serving. A Ferry that allows these classes lets the
// same changes through, which shows the checks below can see them.
func TestPolicyRefusesPrivilegedAdminByDefault(t *testing.T) {
	kf := newKfake(t, 1)
	directCl := newClient(t, kf.ListenAddrs()[0])
	direct := kadm.NewClient(directCl)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	keep := kadm.NewACLs().Allow("User:alice").AllowHosts().Topics("keep").Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral)
	if res, err := direct.CreateACLs(ctx, keep); err != nil || res[0].Err != nil {
		t.Fatalf("creating an ACL directly: %v %v", res, err)
	}
	_, _, _, retention0 := privilegedState(ctx, t, directCl)

	s, addr := startFerry(t, kf.ListenAddrs())
	cl := newClient(t, addr)
	adm := kadm.NewClient(cl)
	for api, err := range privileged(ctx, adm) {
		wantErr(t, api, err, kerr.ClusterAuthorizationFailed)
		if got := refusals(s, api, reasonPolicy); got != 1 {
			t.Errorf("ferry_refusals_total{api=%q,reason=policy} = %v, want 1", api, got)
		}
	}
	// Cluster operations: an election and a feature update.
	set := kadm.TopicsSet{}
	set.Add("keep", 0)
	el, err := adm.ElectLeaders(ctx, kadm.ElectPreferredReplica, set)
	if err == nil {
		r := el["keep"][0]
		err = r.Err
	}
	wantErr(t, "ElectLeaders", err, kerr.ClusterAuthorizationFailed)
	uf := kmsg.NewPtrUpdateFeaturesRequest()
	fu := kmsg.NewUpdateFeaturesRequestFeatureUpdate()
	fu.Feature, fu.MaxVersionLevel = "transaction.version", 0
	uf.FeatureUpdates = append(uf.FeatureUpdates, fu)
	ufr, err := uf.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	// v2 answers have no per-feature results; earlier ones carry the
	// code for the feature too.
	perFeature := ufr.Version >= 2 || (len(ufr.Results) == 1 && ufr.Results[0].ErrorCode == kerr.ClusterAuthorizationFailed.Code)
	if ufr.ErrorCode != kerr.ClusterAuthorizationFailed.Code || !perFeature {
		t.Fatalf("UpdateFeatures v%d answer %+v; want CLUSTER_AUTHORIZATION_FAILED", ufr.Version, ufr)
	}

	users, acls, quotas, retention := privilegedState(ctx, t, directCl)
	if users != 0 || acls != 1 || quotas != 0 || retention != retention0 {
		t.Fatalf("after refused changes the cluster has %d SCRAM users, %d ACLs, %d quotas, log.retention.ms %q; want 0, 1, 0, %q", users, acls, quotas, retention, retention0)
	}
	// Read-only requests of the same kinds, and the connection, still work.
	if n := len(describeAllACLs(ctx, t, cl)); n != 1 {
		t.Fatalf("DescribeACLs through Ferry: %d ACLs, want 1", n)
	}
	if _, err := adm.DescribeBrokerConfigs(ctx, 0); err != nil {
		t.Fatalf("DescribeConfigs through Ferry: %v", err)
	}

	all := []string{"acl_admin", "scram_admin", "quota_admin", "broker_config", "cluster_admin"}
	_, open := startFerry(t, kf.ListenAddrs(), WithRequestPolicy(all, nil))
	for api, err := range privileged(ctx, kadm.NewClient(newClient(t, open))) {
		if err != nil {
			t.Errorf("%s through a Ferry that allows it: %v", api, err)
		}
	}
	users, acls, quotas, retention = privilegedState(ctx, t, directCl)
	if users != 1 || acls != 1 || quotas != 1 || retention != "1234567" {
		t.Fatalf("after allowed changes the cluster has %d SCRAM users, %d ACLs (one created, one deleted), %d quotas, log.retention.ms %q; want 1, 1, 1, 1234567", users, acls, quotas, retention)
	}
}

// A config change naming a topic and a broker: the topic's change is
// made, the broker's refused, in one answer.
func TestPolicyMixedConfigChangeRefusesOnlyTheBroker(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithRequestPolicy([]string{"topic_config"}, nil))
	direct := kadm.NewClient(newClient(t, kf.ListenAddrs()[0]))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(newClient(t, addr)).CreateTopic(ctx, 1, 1, nil, "mixed"); err != nil {
		t.Fatal(err)
	}

	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	req.SetVersion(1)
	topicV, brokerV := "5555", "7777777"
	for _, r := range []struct {
		typ        kmsg.ConfigResourceType
		name, k, v string
	}{{kmsg.ConfigResourceTypeBroker, "0", "log.retention.ms", brokerV}, {kmsg.ConfigResourceTypeTopic, "mixed", "retention.ms", topicV}} {
		res := kmsg.NewIncrementalAlterConfigsRequestResource()
		res.ResourceType, res.ResourceName = r.typ, r.name
		cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		cfg.Name, cfg.Value = r.k, kmsg.StringPtr(r.v)
		res.Configs = append(res.Configs, cfg)
		req.Resources = append(req.Resources, res)
	}
	c := dialRaw(t, addr)
	writeReq(t, c, req, 5)
	b := readResp(t, c)
	resp := kmsg.NewPtrIncrementalAlterConfigsResponse()
	resp.SetVersion(1)
	if err := resp.ReadFrom(b[5:]); err != nil { // correlation ID, empty header tags
		t.Fatal(err)
	}
	got := map[string]int16{}
	for _, r := range resp.Resources {
		got[r.ResourceName] = r.ErrorCode
	}
	if len(resp.Resources) != 2 || got["mixed"] != 0 || got["0"] != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("answer %+v; want topic mixed 0 and broker 0 CLUSTER_AUTHORIZATION_FAILED", resp.Resources)
	}
	if n := refusals(s, "IncrementalAlterConfigs", reasonPolicy); n != 1 {
		t.Fatalf("refusals %v, want 1", n)
	}

	bc, err := direct.DescribeBrokerConfigs(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := bc.On("0", nil)
	if v := topicConfig(ctx, t, direct, "mixed", "retention.ms"); v != topicV {
		t.Fatalf("topic retention.ms = %q, want %s: the allowed part must be applied", v, topicV)
	}
	if v := configValue(rb, "log.retention.ms"); v == brokerV {
		t.Fatal("the broker's config changed; want it refused")
	}

	// The same connection goes on serving.
	writeReq(t, c, kmsg.NewPtrApiVersionsRequest(), 6)
	readResp(t, c)
}

// topicConfig reads a topic's config value from the cluster.
func topicConfig(ctx context.Context, t *testing.T, direct *kadm.Client, topic, key string) string {
	t.Helper()
	tc, err := direct.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := tc.On(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	return configValue(rc, key)
}

func configValue(rc kadm.ResourceConfig, key string) string {
	for _, c := range rc.Configs {
		if c.Key == key {
			return c.MaybeValue()
		}
	}
	return ""
}

// Topic creation is allowed by default; deleting topics and records and
// changing topic configs are refused by default, and allowed when opted
// in; denied, each class is answered TOPIC_AUTHORIZATION_FAILED per topic
// and nothing changes.
func TestPolicyTopicClasses(t *testing.T) {
	kf := newKfake(t, 1)
	direct := kadm.NewClient(newClient(t, kf.ListenAddrs()[0]))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	def, defAddr := startFerry(t, kf.ListenAddrs())
	adm := kadm.NewClient(newClient(t, defAddr))
	for _, topic := range []string{"scratch", "doomed"} {
		if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
			t.Fatalf("creating a topic by default: %v", err)
		}
	}
	// Records and config of topic, and doomed deleted.
	destructive := func(adm *kadm.Client, topic string) (del, cfg, recs error) {
		t.Helper()
		v := "100000"
		ac, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &v}}, topic)
		if cfg = err; cfg == nil {
			if len(ac) != 1 {
				t.Fatalf("AlterTopicConfigs: %d answers, want 1", len(ac))
			}
			cfg = ac[0].Err
		}
		offsets := kadm.Offsets{}
		offsets.Add(kadm.Offset{Topic: topic, Partition: 0, At: 0})
		rs, err := adm.DeleteRecords(ctx, offsets)
		if recs = err; recs == nil {
			r, _ := rs.Lookup(topic, 0)
			recs = r.Err
		}
		dr, err := adm.DeleteTopic(ctx, "doomed")
		if del = err; del == nil {
			del = dr.Err
		}
		return del, cfg, recs
	}
	delErr, cfgErr, recsErr := destructive(adm, "scratch")
	wantErr(t, "DeleteTopics by default", delErr, kerr.TopicAuthorizationFailed)
	wantErr(t, "IncrementalAlterConfigs by default", cfgErr, kerr.TopicAuthorizationFailed)
	wantErr(t, "DeleteRecords by default", recsErr, kerr.TopicAuthorizationFailed)
	for _, api := range []string{"DeleteTopics", "IncrementalAlterConfigs", "DeleteRecords"} {
		if got := refusals(def, api, reasonPolicy); got != 1 {
			t.Errorf("default policy: ferry_refusals_total{api=%q,reason=policy} = %v, want 1", api, got)
		}
	}
	// New clients: kgo answers a metadata request from its cache.
	topics := func() (kadm.TopicDetails, error) {
		return kadm.NewClient(newClient(t, kf.ListenAddrs()[0])).ListTopics(ctx)
	}
	if td, err := topics(); err != nil || !td.Has("doomed") {
		t.Fatalf("topics on the cluster after refused deletes: %v %v; want doomed kept", td.Names(), err)
	}
	if v := topicConfig(ctx, t, direct, "scratch", "retention.ms"); v == "100000" {
		t.Fatal("scratch's retention.ms changed by default; want the change refused")
	}

	_, optIn := startFerry(t, kf.ListenAddrs(), WithRequestPolicy([]string{"topic_delete", "topic_config", "records_delete"}, nil))
	adm = kadm.NewClient(newClient(t, optIn))
	if del, cfg, recs := destructive(adm, "scratch"); del != nil || cfg != nil || recs != nil {
		t.Fatalf("opted in: DeleteTopics %v, IncrementalAlterConfigs %v, DeleteRecords %v; want all served", del, cfg, recs)
	}
	if td, err := topics(); err != nil || td.Has("doomed") {
		t.Fatalf("topics on the cluster after an allowed delete: %v %v; want doomed gone", td.Names(), err)
	}
	if v := topicConfig(ctx, t, direct, "scratch", "retention.ms"); v != "100000" {
		t.Fatalf("scratch's retention.ms = %q after an allowed change, want 100000", v)
	}

	s, addr := startFerry(t, kf.ListenAddrs(), WithRequestPolicy(nil, []string{"topic_create", "topic_delete", "topic_config", "records_delete"}))
	adm = kadm.NewClient(newClient(t, addr))
	if _, err := direct.CreateTopic(ctx, 1, 1, nil, "kept"); err != nil {
		t.Fatal(err)
	}
	r, err := adm.CreateTopic(ctx, 1, 1, nil, "denied")
	if err == nil {
		err = r.Err
	}
	wantErr(t, "CreateTopics", err, kerr.TopicAuthorizationFailed)
	cp, err := adm.CreatePartitions(ctx, 2, "kept")
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "CreatePartitions", cp["kept"].Err, kerr.TopicAuthorizationFailed)
	dr, err := adm.DeleteTopic(ctx, "kept")
	if err == nil {
		err = dr.Err
	}
	wantErr(t, "DeleteTopics", err, kerr.TopicAuthorizationFailed)
	v := "1000"
	ac, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &v}}, "kept")
	if err != nil || len(ac) != 1 {
		t.Fatalf("AlterTopicConfigs: %v %v", ac, err)
	}
	wantErr(t, "IncrementalAlterConfigs", ac[0].Err, kerr.TopicAuthorizationFailed)
	offsets := kadm.Offsets{}
	offsets.Add(kadm.Offset{Topic: "kept", Partition: 0, At: 0})
	recs, err := adm.DeleteRecords(ctx, offsets)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := recs.Lookup("kept", 0)
	wantErr(t, "DeleteRecords", rec.Err, kerr.TopicAuthorizationFailed)
	for _, api := range []string{"CreateTopics", "CreatePartitions", "DeleteTopics", "IncrementalAlterConfigs", "DeleteRecords"} {
		if got := refusals(s, api, reasonPolicy); got != 1 {
			t.Errorf("ferry_refusals_total{api=%q,reason=policy} = %v, want 1", api, got)
		}
	}

	td, err := direct.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if td.Has("denied") || !td.Has("kept") || len(td["kept"].Partitions) != 1 {
		t.Fatalf("topics after refused changes: %v; want kept with 1 partition, no denied", td.Names())
	}
	if topicConfig(ctx, t, direct, "kept", "retention.ms") == v {
		t.Fatal("retention.ms changed; want the change refused")
	}
}

func TestPolicyConfigErrors(t *testing.T) {
	kf := newKfake(t, 1)
	for _, tc := range []struct{ allow, deny []string }{
		{[]string{"acl_admn"}, nil},
		{nil, []string{"produce"}},
		{[]string{"topic_delete"}, []string{"topic_delete"}},
	} {
		_, err := New(WithClusterID("x"), WithClusters(upstream.Config{Name: "a", Bootstrap: kf.ListenAddrs()}),
			WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{Host: "h", Port: 1})), WithRequestPolicy(tc.allow, tc.deny))
		if !errors.Is(err, ErrConfig) {
			t.Errorf("allow %v deny %v: error %v, want a configuration error", tc.allow, tc.deny, err)
		}
	}
}
