package mirror

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

func topicConfig(ctx context.Context, c *kafkatest.Cluster, t *testing.T, topic, key string) string {
	adm := kadm.NewClient(newClient(t, c))
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil || len(rcs) != 1 {
		return ""
	}
	for _, c := range rcs[0].Configs {
		if c.Key == key && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}

// TestMirrorMetadataSync: a topic created while the mirror runs is created
// on the standby with its configs and mirrored; partitions added and config
// changes propagate; group offsets are copied and clamped to what is
// mirrored; ACLs are copied.
func TestMirrorMetadataSync(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m := startMirror(t, Topics([]string{"meta-.*"}, nil), Groups([]string{"g-.*"}, nil))
	const topic = "meta-a"
	createTopic(t, a, topic, 1, map[string]*string{"retention.ms": kadm.StringPtr("123456789")})
	cl := newClient(t, a, manualPartitioner())
	produceN(t, cl, topic, 0, 10, 5, "meta")
	waitCaughtUp(t, m, topic)
	if got := topicConfig(ctx, s, t, topic, "retention.ms"); got != "123456789" {
		t.Fatalf("standby retention.ms = %q", got)
	}
	if got := topicConfig(ctx, s, t, topic, "compression.type"); got != "producer" {
		t.Fatalf("standby compression.type = %q", got)
	}

	srcAdm := kadm.NewClient(cl)
	if _, err := srcAdm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: kadm.StringPtr("987654321")}}, topic); err != nil {
		t.Fatal(err)
	}
	if _, err := srcAdm.UpdatePartitions(ctx, 3, topic); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, "config change on the standby", func() error {
		if got := topicConfig(ctx, s, t, topic, "retention.ms"); got != "987654321" {
			return errors.New("retention.ms is " + got)
		}
		return nil
	})
	produceN(t, newClient(t, a, manualPartitioner()), topic, 2, 7, 7, "p2")
	waitCaughtUp(t, m, topic)
	sameBatches(t, topic, 2)
	sameRecords(t, topic, 2)

	// Group offsets: one below the end, one beyond it (clamped).
	var o kadm.Offsets
	o.AddOffset(topic, 0, 4, -1)
	o.AddOffset(topic, 2, 1000, -1)
	if resp, err := srcAdm.CommitOffsets(ctx, "g-1", o); err != nil || resp.Error() != nil {
		t.Fatalf("commit: %v %v", err, resp.Error())
	}
	dstAdm := kadm.NewClient(newClient(t, s))
	testwait.Eventually(t, 30*time.Second, "group offsets on the standby", func() error {
		got, err := dstAdm.FetchOffsets(ctx, "g-1")
		if err != nil {
			return err
		}
		p0, _ := got.Lookup(topic, 0)
		p2, _ := got.Lookup(topic, 2)
		if p0.At != 4 || p2.At != 7 {
			return errors.New("offsets not (yet) 4 and 7 (clamped)")
		}
		return nil
	})

	// ACLs.
	b := kadm.NewACLs().Allow("User:alice").AllowHosts().Topics(topic).Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral)
	if res, err := srcAdm.CreateACLs(ctx, b); err != nil || res[0].Err != nil {
		t.Fatalf("creating ACL: %v %+v", err, res)
	}
	testwait.Eventually(t, 30*time.Second, "ACL on the standby", func() error {
		d := kadm.NewACLs().Allow("User:alice").AllowHosts().Topics(topic).Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral)
		res, err := dstAdm.DescribeACLs(ctx, d)
		if err != nil {
			return err
		}
		if len(res) == 0 || res[0].Err != nil || len(res[0].Described) == 0 {
			return errors.New("ACL not on the standby")
		}
		return nil
	})
}

// TestMirrorSourceTruncated: the source lost what was mirrored (here: the
// topic was deleted and recreated shorter, or with other data — what an
// unclean leader election does to a partition) — the writer halts with a
// typed error and never writes.
func TestMirrorSourceTruncated(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topics := []string{"trunc-short", "trunc-other"}
	cl := newClient(t, a, manualPartitioner())
	for _, tp := range topics {
		createTopic(t, a, tp, 1, nil)
		produceN(t, cl, tp, 0, 50, 10, "first")
	}
	m := startMirror(t, Topics(topics, nil))
	waitCaughtUp(t, m, topics...)
	m.Close()

	adm := kadm.NewClient(cl)
	if _, err := adm.DeleteTopics(ctx, topics...); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, "topics recreated", func() error {
		for _, tp := range topics {
			if r, err := adm.CreateTopic(ctx, 1, 1, nil, tp); err != nil || (r.Err != nil && !errors.Is(r.Err, kerrTopicExists)) {
				return errors.Join(err, r.Err)
			}
		}
		return nil
	})
	cl2 := newClient(t, a, manualPartitioner())
	testwait.Eventually(t, 30*time.Second, "producing to the recreated topics", func() error {
		return cl2.ProduceSync(ctx, &kgo.Record{Topic: "trunc-short", Value: []byte("x")}).FirstErr()
	})
	produceN(t, cl2, "trunc-short", 0, 19, 10, "second")
	produceN(t, cl2, "trunc-other", 0, 50, 10, "other")
	_, before := offsetsOf(t, s, "trunc-short", 0)

	m2 := startMirror(t, Topics(topics, nil))
	testwait.Eventually(t, 30*time.Second, "writers halted", func() error {
		st := m2.Status()
		if len(st) != 2 {
			return errors.New("no writers yet")
		}
		if !errors.Is(st[1].Err, ErrSourceTruncated) || st[1].State != StateHalted {
			return errors.New("trunc-short not halted as truncated: " + st[1].State.String())
		}
		if !errors.Is(st[0].Err, ErrDiverged) || st[0].State != StateHalted {
			return errors.New("trunc-other not halted as diverged: " + st[0].State.String())
		}
		return nil
	})
	if err := m2.WaitCaughtUp(ctx, topics...); err == nil {
		t.Fatal("WaitCaughtUp succeeded with halted partitions")
	}
	if _, after := offsetsOf(t, s, "trunc-short", 0); after != before {
		t.Fatalf("the standby moved from %d to %d after the halt", before, after)
	}
}

var kerrTopicExists = kerr.TopicAlreadyExists

// TestMirrorConfigsEveryConfigRound: the configs of topics already
// mirrored are described (on both clusters) once every configEvery sync
// rounds, not every round; a new topic's are copied in the first round that
// sees it, and a config changed on the source reaches the standby at the
// next config round.
func TestMirrorConfigsEveryConfigRound(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic = "meta-rounds"
	createTopic(t, a, topic, 2, map[string]*string{"retention.ms": kadm.StringPtr("123456789")})
	var src, dst requestCounts
	m := newMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false),
		func(c *config) { c.srcHooks, c.dstHooks = append(c.srcHooks, &src), append(c.dstHooks, &dst) })

	// The topic is copied in the first round that sees it (a new topic's
	// metadata may take a round or two to show on the source).
	testwait.Eventually(t, 30*time.Second, "the standby topic with the source's retention.ms", func() error {
		m.syncOnce(ctx)
		if got := topicConfig(ctx, s, t, topic, "retention.ms"); got != "123456789" {
			return fmt.Errorf("standby retention.ms %q after round %d", got, m.syncRound)
		}
		return nil
	})
	// Then up to a config round, so that the change below waits for the
	// next one.
	for m.syncRound%configEvery != 1 {
		m.syncOnce(ctx)
	}
	srcAdm := kadm.NewClient(newClient(t, a))
	if _, err := srcAdm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: kadm.StringPtr("987654321")}}, topic); err != nil {
		t.Fatal(err)
	}
	src.reset()
	dst.reset()
	for range configEvery - 1 { // the rounds up to the next config round
		m.syncOnce(ctx)
	}
	if n, d := src.get(kmsg.DescribeConfigs), dst.get(kmsg.DescribeConfigs); n != 0 || d != 0 {
		t.Errorf("%d rounds after a config round described configs %d times on the source and %d on the standby, want none", configEvery-1, n, d)
	}
	// Nothing moved on the source but a config: the standby's topics are
	// not listed either (the source's are, every round).
	if n, d := src.get(kmsg.Metadata), dst.get(kmsg.Metadata); n < configEvery-1 || d != 0 {
		t.Errorf("%d rounds after a config round asked Metadata %d times of the source and %d of the standby, want every round and none", configEvery-1, n, d)
	}
	if got := topicConfig(ctx, s, t, topic, "retention.ms"); got != "123456789" {
		t.Errorf("standby retention.ms between config rounds = %q, want the old value still", got)
	}
	m.syncOnce(ctx) // the next config round
	if n := src.get(kmsg.DescribeConfigs); n == 0 {
		t.Errorf("the config round described no config on the source")
	}
	if got := topicConfig(ctx, s, t, topic, "retention.ms"); got != "987654321" {
		t.Fatalf("standby retention.ms after the config round = %q, want the source's 987654321", got)
	}

	// Partitions added on the source are added between config rounds.
	if _, err := srcAdm.UpdatePartitions(ctx, 3, topic); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, "the partition added on the standby", func() error {
		m.syncOnce(ctx)
		tds, err := kadm.NewClient(newClient(t, s)).ListTopics(ctx, topic)
		if err != nil {
			return err
		}
		if n := len(tds[topic].Partitions); n != 3 {
			return fmt.Errorf("%d partitions on the standby", n)
		}
		return nil
	})
}

// TestMirrorCreatesTopicsInFewRequests: topics that appear on the source
// together are created on the standby in one CreateTopics a round (up to
// createTopicsBatch of them), each with its own partition count and the
// source's configs: a mirror started in front of a thousand topics used to
// create them one request after another.
func TestMirrorCreatesTopicsInFewRequests(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 30
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("many-%02d", i))
	}
	srcAdm := kadm.NewClient(newClient(t, a))
	resps, err := srcAdm.CreateTopics(ctx, 2, 1, map[string]*string{"retention.ms": kadm.StringPtr("7654321")}, names...)
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srcAdm.UpdatePartitions(ctx, 3, names[0]); err != nil {
		t.Fatal(err)
	}
	var dst requestCounts
	m := newMirror(t, Topics([]string{"many-.*"}, nil), SyncGroups(false), SyncACLs(false),
		func(c *config) { c.dstHooks = append(c.dstHooks, &dst) })
	dstAdm := kadm.NewClient(newClient(t, s))
	rounds := 0
	testwait.Eventually(t, time.Minute, "every topic on the standby", func() error {
		m.syncOnce(ctx)
		rounds++
		tds, err := dstAdm.ListTopics(ctx, names...)
		if err != nil {
			return err
		}
		for i, name := range names {
			want := 2
			if i == 0 {
				want = 3
			}
			if got := len(tds[name].Partitions); got != want {
				return fmt.Errorf("%s: %d partitions on the standby, want %d", name, got, want)
			}
		}
		return nil
	})
	if got := topicConfig(ctx, s, t, names[n-1], "retention.ms"); got != "7654321" {
		t.Errorf("standby %s retention.ms = %q, want the source's", names[n-1], got)
	}
	if c := dst.get(kmsg.CreateTopics); c == 0 || c > rounds {
		t.Errorf("%d topics created with %d CreateTopics in %d rounds, want at most one a round", n, c, rounds)
	}
}
