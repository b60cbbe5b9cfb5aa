package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// TestKafkaInternalTopicsRealKafka runs `ferry serve` in front of a real
// Kafka cluster, its clients acting under Ferry's identity. With the
// default request policy, deleting a topic and setting retention.ms on
// __consumer_offsets are refused with TOPIC_AUTHORIZATION_FAILED. With
// policy.allow [topic_delete, topic_config], an ordinary topic is deleted,
// and __consumer_offsets still cannot be changed nor deleted. The cluster
// is read directly after each.
func TestKafkaInternalTopicsRealKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka")
	}
	const offsets = "__consumer_offsets"
	c := kafkatest.Start(t, 1, kafkatest.WithName("kinternal"))
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	// A new client for each look: kgo answers metadata requests from its
	// cache.
	direct := func() *kadm.Client { return kadm.NewClient(newClient(t, kgo.SeedBrokers(c.Addrs()...))) }
	if r, err := direct().CreateTopic(ctx, 1, 1, nil, "victim"); err != nil || r.Err != nil {
		t.Fatalf("creating victim: %v %v", err, r.Err)
	}
	// A group's commit makes the cluster create __consumer_offsets.
	commit := kadm.Offsets{}
	commit.Add(kadm.Offset{Topic: "victim", Partition: 0, At: 0, LeaderEpoch: -1})
	for {
		r, err := direct().CommitOffsets(ctx, "kinternal-group", commit)
		if err == nil && r.Error() == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("committing an offset directly: %v %v", err, r.Error())
		}
		time.Sleep(200 * time.Millisecond)
	}
	retention := func() string {
		t.Helper()
		rcs, err := direct().DescribeTopicConfigs(ctx, offsets)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rcs.On(offsets, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range rc.Configs {
			if kv.Key == "retention.ms" {
				return kv.MaybeValue()
			}
		}
		t.Fatalf("%s has no retention.ms", offsets)
		return ""
	}
	retention0 := retention()
	topics := func() kadm.TopicDetails {
		t.Helper()
		td, err := direct().ListTopicsWithInternal(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return td
	}
	ids0 := topics()

	serve := func(policy string) (addr, adminAddr string, stop func()) {
		path := writeConfig(t, fmt.Sprintf(`
cluster_id: ferry-kinternal-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - {name: only, bootstrap: [%s]}
%s`, c.Bootstrap(), policy))
		p := startFerry(t, "serve", "--config", path)
		adminAddr = p.waitFor(t, adminLog, 60*time.Second)[1]
		addr = p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 90*time.Second)[1]
		return addr, adminAddr, func() { p.stop(t, 15*time.Second) }
	}
	setRetention := func(adm *kadm.Client) error {
		t.Helper()
		v := "1000"
		r, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &v}}, offsets)
		if err == nil && len(r) != 1 {
			t.Fatalf("IncrementalAlterConfigs of %s: %d answers", offsets, len(r))
		}
		if err == nil {
			err = r[0].Err
		}
		return err
	}
	deleteTopic := func(adm *kadm.Client, topic string) error {
		t.Helper()
		r, err := adm.DeleteTopic(ctx, topic)
		if err == nil {
			err = r.Err
		}
		return err
	}
	metric := func(adminAddr, series string) {
		t.Helper()
		if _, body := httpGet(t, "http://"+adminAddr+"/metrics"); !strings.Contains(body, series) {
			t.Fatalf("/metrics has no %s", series)
		}
	}

	// The default policy.
	addr, adminAddr, stop := serve("")
	adm := kadm.NewClient(newClient(t, kgo.SeedBrokers(addr)))
	if err := deleteTopic(adm, "victim"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("deleting victim through Ferry by default: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	if err := setRetention(adm); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("setting %s's retention.ms through Ferry by default: %v, want TOPIC_AUTHORIZATION_FAILED", offsets, err)
	}
	metric(adminAddr, `ferry_refusals_total{api="DeleteTopics",reason="policy"} 1`)
	metric(adminAddr, `ferry_refusals_total{api="IncrementalAlterConfigs",reason="policy"} 1`)
	if td := topics(); td["victim"].ID != ids0["victim"].ID || td[offsets].ID != ids0[offsets].ID {
		t.Fatalf("after refused changes victim %+v, %s %+v; want both as they were", td["victim"], offsets, td[offsets])
	}
	if r := retention(); r != retention0 {
		t.Fatalf("%s retention.ms %q after a refused change, want %q", offsets, r, retention0)
	}
	stop()

	// Opted in: the ordinary topic goes; Kafka's internal topic stays as
	// it is.
	addr, adminAddr, stop = serve("policy:\n  allow: [topic_delete, topic_config]\n")
	defer stop()
	adm = kadm.NewClient(newClient(t, kgo.SeedBrokers(addr)))
	if err := setRetention(adm); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("setting %s's retention.ms through Ferry, topic_config allowed: %v, want TOPIC_AUTHORIZATION_FAILED", offsets, err)
	}
	if err := deleteTopic(adm, offsets); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("deleting %s through Ferry, topic_delete allowed: %v, want TOPIC_AUTHORIZATION_FAILED", offsets, err)
	}
	if err := deleteTopic(adm, "victim"); err != nil {
		t.Fatalf("deleting victim through Ferry, topic_delete allowed: %v", err)
	}
	metric(adminAddr, `ferry_refusals_total{api="DeleteTopics",reason="kafka_internal_topic"} 1`)
	metric(adminAddr, `ferry_refusals_total{api="IncrementalAlterConfigs",reason="kafka_internal_topic"} 1`)
	for {
		td := topics()
		if td[offsets].ID != ids0[offsets].ID {
			t.Fatalf("%s on the cluster %+v; want it as it was", offsets, td[offsets])
		}
		if !td.Has("victim") {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("victim is still on the cluster after its deletion was answered")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r := retention(); r != retention0 {
		t.Fatalf("%s retention.ms %q after a refused change, want %q", offsets, r, retention0)
	}
}
