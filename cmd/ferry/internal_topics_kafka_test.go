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
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/routing"
)

// TestRoutingTopicHiddenRealKafka runs `ferry serve` in front of a real
// Kafka cluster: the routing state's topic, which Ferry creates at start,
// is listed on the cluster but not through Ferry, and deleting it through
// Ferry is refused with TOPIC_AUTHORIZATION_FAILED and leaves it there.
// Deleting it by its physical topic ID, read from the cluster directly, is
// answered UNKNOWN_TOPIC_ID and leaves it there too. DescribeLogDirs through
// Ferry does not list it. The policy allows topic deletes: Ferry's own
// topic is refused whatever it allows.
func TestRoutingTopicHiddenRealKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka")
	}
	c := kafkatest.Start(t, 1, kafkatest.WithName("hidden"))
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: ferry-hidden-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - {name: only, bootstrap: [%s]}
policy:
  allow: [topic_delete]
`, c.Bootstrap()))
	p := startFerry(t, "serve", "--config", path)
	adminAddr := p.waitFor(t, adminLog, 60*time.Second)[1]
	addr := p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 90*time.Second)[1]
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	createTopicVia(t, ctx, addr, "app", 1)

	const topic = routing.DefaultStoreTopic
	direct := kadm.NewClient(newClient(t, kgo.SeedBrokers(c.Addrs()...)))
	for { // created right after the listener opens
		td, err := direct.ListTopics(ctx)
		if err == nil && td.Has(topic) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s never appeared on the cluster: %v", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A topic just created reaches the broker's metadata a moment after
	// CreateTopics answers (KRaft): listed through Ferry until app shows
	// (in CI once, the first listing had neither), and the routing
	// state's topic in none of the listings.
	through := kadm.NewClient(newClient(t, kgo.SeedBrokers(addr)))
	for {
		listed, err := through.ListTopics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if listed.Has(topic) {
			t.Fatalf("topics through Ferry %v: %s is listed", listed.Names(), topic)
		}
		if listed.Has("app") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("topics through Ferry %v: app never listed", listed.Names())
		}
		time.Sleep(200 * time.Millisecond)
	}

	dr, err := through.DeleteTopic(ctx, topic)
	if err == nil {
		err = dr.Err
	}
	if !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("deleting %s through Ferry: %v, want TOPIC_AUTHORIZATION_FAILED", topic, err)
	}
	time.Sleep(time.Second) // a deletion that got through would show by now
	if td, err := direct.ListTopics(ctx); err != nil || !td.Has(topic) {
		t.Fatalf("topics on the cluster after the refused deletion %v (%v); want %s still there", td.Names(), err, topic)
	}
	if _, body := httpGet(t, "http://"+adminAddr+"/metrics"); !strings.Contains(body, `ferry_refusals_total{api="DeleteTopics",reason="internal_topic"} 1`) {
		t.Fatal("/metrics does not count the refusal in ferry_refusals_total{reason=internal_topic}")
	}

	// By its physical ID (DeleteTopics v6), as a client that reached the
	// brokers would read it.
	fresh := func() kadm.TopicDetails { // a new client: kgo answers metadata requests from its cache
		t.Helper()
		td, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(c.Addrs()...))).ListTopics(ctx, topic)
		if err != nil || td[topic].Err != nil {
			t.Fatalf("%s on the cluster: %+v %v", topic, td[topic], err)
		}
		return td
	}
	phys := fresh()[topic].ID
	del := kmsg.NewPtrDeleteTopicsRequest()
	del.Version, del.TimeoutMillis = 6, 15000
	del.Topics = []kmsg.DeleteTopicsRequestTopic{{TopicID: phys}}
	resp, err := del.RequestWith(ctx, newClient(t, kgo.SeedBrokers(addr)))
	if err != nil {
		t.Fatalf("DeleteTopics v6 through Ferry: %v", err)
	}
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != kerr.UnknownTopicID.Code {
		t.Fatalf("DeleteTopics v6 of %s by its physical ID answered %+v; want UNKNOWN_TOPIC_ID", topic, resp.Topics)
	}
	// The answer comes after the controller's; a deletion that got
	// through would leave the topic gone, or made anew with another ID.
	if id := fresh()[topic].ID; id != phys {
		t.Fatalf("%s's ID on the cluster is %x after the refused deletion by ID, was %x: deleted and made anew", topic, id, phys)
	}
	if _, body := httpGet(t, "http://"+adminAddr+"/metrics"); !strings.Contains(body, `ferry_refusals_total{api="DeleteTopics",reason="unknown_topic_id"} 1`) {
		t.Fatal("/metrics does not count the refusal in ferry_refusals_total{reason=unknown_topic_id}")
	}

	// DescribeLogDirs lists the partitions on the broker's disks: the
	// cluster's own answer has the topic, Ferry's does not.
	logDirTopics := func(cl *kgo.Client) map[string]bool {
		t.Helper()
		resp, err := kmsg.NewPtrDescribeLogDirsRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("DescribeLogDirs: %v", err)
		}
		out := map[string]bool{}
		for _, d := range resp.Dirs {
			for _, tp := range d.Topics {
				out[tp.Topic] = true
			}
		}
		return out
	}
	if on := logDirTopics(newClient(t, kgo.SeedBrokers(c.Addrs()...))); !on[topic] || !on["app"] {
		t.Fatalf("DescribeLogDirs on the cluster lists %v; want app and %s", on, topic)
	}
	if via := logDirTopics(newClient(t, kgo.SeedBrokers(addr))); via[topic] || !via["app"] {
		t.Fatalf("DescribeLogDirs through Ferry lists %v; want app and not %s", via, topic)
	}
	p.stop(t, 15*time.Second)
}
