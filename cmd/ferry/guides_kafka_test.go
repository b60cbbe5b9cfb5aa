package main

// The two guides, docs/MIGRATION.md and docs/RUNBOOK.md, followed step by
// step: `ferry serve` runs as its own process in front of two real Apache
// Kafka clusters, the operator's commands are the ferry CLI (`ferry status`,
// `ferry switchover`), and franz-go clients are the applications (skipped
// under -short). Each step's comment names the guide's section, so that
// the guide and its test can be read side by side.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

// guideFerry is the one `ferry serve` of a guide, on addresses it keeps
// across restarts (clients reconnect to the same bootstrap).
type guideFerry struct {
	config, kafka, admin string
	p                    *proc
}

// newGuideFerry writes the configuration body (everything but the
// listeners) with fixed listen and admin addresses, and starts Ferry.
func newGuideFerry(t *testing.T, body string) *guideFerry {
	t.Helper()
	g := &guideFerry{kafka: freeAddr(t), admin: freeAddr(t)}
	g.config = writeConfig(t, fmt.Sprintf("listen: %s\nadmin_listen: %s\n%s", g.kafka, g.admin, body))
	g.start(t)
	return g
}

// start runs `ferry serve --config FILE` and waits until it serves clients.
func (g *guideFerry) start(t *testing.T) {
	t.Helper()
	g.p = startFerry(t, "serve", "--config", g.config)
	g.p.waitFor(t, servingLine, 2*time.Minute)
}

// status is `ferry status` as the operator reads it.
func (g *guideFerry) status(t *testing.T) string {
	t.Helper()
	code, out, errOut := runCLI(t, "status", "--admin", g.admin)
	if code != 0 {
		t.Fatalf("ferry status: exit %d\n%s%s", code, out, errOut)
	}
	return out
}

// statusJSON is `ferry status --json`: /status as the member answers it.
func (g *guideFerry) statusJSON(t *testing.T) admin.Status {
	t.Helper()
	code, out, errOut := runCLI(t, "status", "--admin", g.admin, "--json")
	var st admin.Status
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("ferry status --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	return st
}

// waitStatus polls `ferry status` until every one of lines is in it.
func (g *guideFerry) waitStatus(t *testing.T, timeout time.Duration, lines ...string) string {
	t.Helper()
	var out string
	testwait.Eventually(t, timeout, fmt.Sprintf("ferry status showing %q", lines), func() error {
		out = g.status(t)
		for _, l := range lines {
			if !strings.Contains(out, l) {
				return fmt.Errorf("no %q in:\n%s", l, out)
			}
		}
		return nil
	})
	return out
}

// switchover is `ferry switchover --admin ADMIN args...`.
func (g *guideFerry) switchover(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLI(t, append([]string{"switchover", "--admin", g.admin}, args...)...)
}

// ledger is what the applications of the migration guide were told:
// partition → offset → value of every record acknowledged.
type ledger map[int32]map[int64]string

// produceRoundRobin produces n records round-robin over the topic's
// partitions through addrs, one at a time, and records each in l. Every
// acknowledged offset must be the partition's next one: the offsets go on
// where they were, whichever cluster or path acknowledges them.
func (l ledger) produceRoundRobin(t *testing.T, ctx context.Context, addrs []string, topic string, parts int32, prefix string, n int) {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer cl.Close()
	for i := range n {
		p := int32(i) % parts
		r := &kgo.Record{Partition: p, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "%s-%04d", prefix, i)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce %s through %v: %v", r.Value, addrs, err)
		}
		if l[p] == nil {
			l[p] = map[int64]string{}
		}
		if next := int64(len(l[p])); r.Offset != next {
			t.Fatalf("%s acknowledged at %s[%d] offset %d, want the partition's next offset %d", r.Value, topic, p, r.Offset, next)
		}
		l[p][r.Offset] = string(r.Value)
	}
}

// consumeInGroup joins group through addrs, reads n records and commits
// them, and returns the group's committed offsets read back through addrs.
// Every partition must be read on from exactly from[partition] (0 where the
// group has no offset), each record the one acknowledged at its offset.
func (l ledger) consumeInGroup(t *testing.T, ctx context.Context, addrs []string, group, topic string, n int, from map[int32]int64) map[int32]int64 {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	next := maps.Clone(from)
	if next == nil {
		next = map[int32]int64{}
	}
	for got := 0; got < n; {
		fs := cl.PollRecords(ctx, n-got)
		if ctx.Err() != nil {
			t.Fatalf("group %s through %v: read %d of %d records", group, addrs, got, n)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Logf("group %s: fetch %s[%d]: %v", group, topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			got++
			if r.Offset != next[r.Partition] || l[r.Partition][r.Offset] != string(r.Value) {
				t.Fatalf("group %s through %v read %s[%d] offset %d = %q; want offset %d = %q (where it left off, the record acknowledged there)",
					group, addrs, topic, r.Partition, r.Offset, r.Value, next[r.Partition], l[r.Partition][next[r.Partition]])
			}
			next[r.Partition]++
		})
	}
	if err := cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("group %s: commit through %v: %v", group, addrs, err)
	}
	cl.Close() // leaves the group
	got := committed(t, addrs, group, topic)
	if fmt.Sprint(got) != fmt.Sprint(next) {
		t.Fatalf("group %s: committed %v read back through %v, want %v", group, got, addrs, next)
	}
	return got
}

// lines lists l as readAll does: "partition/offset=value", sorted.
func (l ledger) lines() []string {
	var out []string
	for p, offs := range l {
		for o, v := range offs {
			out = append(out, fmt.Sprintf("%d/%d=%s", p, o, v))
		}
	}
	slices.Sort(out)
	return out
}

// listedOffsets is a topic's earliest and latest offsets listed directly on
// a cluster, "partition:earliest-latest".
func listedOffsets(t *testing.T, ctx context.Context, addrs []string, topic string) string {
	t.Helper()
	adm := kadm.NewClient(newClient(t, kgo.SeedBrokers(addrs...)))
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		t.Fatalf("start offsets of %s on %v: %v", topic, addrs, err)
	}
	ends := endOffsets(t, addrs, topic)
	var out []string
	starts.Each(func(o kadm.ListedOffset) {
		out = append(out, fmt.Sprintf("%d:%d-%d", o.Partition, o.Offset, ends[o.Partition]))
	})
	slices.Sort(out)
	return strings.Join(out, " ")
}

// readThrough reads one partition directly from a cluster, read_uncommitted
// (a transaction may be open there), from its start through offset last,
// and returns offset → value.
func readThrough(t *testing.T, addrs []string, topic string, partition int32, last int64) map[int64]string {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
		topic: {partition: kgo.NewOffset().AtStart()},
	}), kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := map[int64]string{}
	for at := int64(-1); at < last; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s[%d] on %v: read through offset %d of %d", topic, partition, addrs, at, last)
		}
		fs.EachRecord(func(r *kgo.Record) {
			out[r.Offset] = string(r.Value)
			at = max(at, r.Offset)
		})
	}
	return out
}

// createTopicOn creates a topic directly on a cluster.
func createTopicOn(t *testing.T, ctx context.Context, addrs []string, topic string, parts int32) {
	t.Helper()
	resp, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addrs...))).CreateTopic(ctx, parts, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create %s on %v: %v", topic, addrs, err)
	}
}

// topicNames lists the topics of a cluster, internal ones included.
func topicNames(t *testing.T, ctx context.Context, addrs []string) []string {
	t.Helper()
	td, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addrs...))).ListTopicsWithInternal(ctx)
	if err != nil {
		t.Fatalf("topics on %v: %v", addrs, err)
	}
	return td.Names()
}

// TestMigrationGuide follows docs/MIGRATION.md: applications on an old
// cluster move behind Ferry, the mirror copies the old cluster to the new
// one, a planned switchover makes the new one active, and the applications
// are then pointed at the new cluster directly, where a consumer group
// resumes at exactly its committed offsets and every record is at the offset
// it was acknowledged at; Ferry and the old cluster are retired.
func TestMigrationGuide(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const topic, parts, group = "orders", 3, "billing"
	want := ledger{}

	// §1 Where you start: the applications use the old cluster directly.
	// It holds records and a group's committed offsets before Ferry exists.
	oldC := kafkatest.Start(t, 1, kafkatest.WithName("old"))
	newC := kafkatest.Start(t, 1, kafkatest.WithName("new"))
	createTopicOn(t, ctx, oldC.Addrs(), topic, parts)
	createTopicOn(t, ctx, oldC.Addrs(), "scratch-1", 1)
	want.produceRoundRobin(t, ctx, oldC.Addrs(), topic, parts, "direct-old", 90)
	offs := want.consumeInGroup(t, ctx, oldC.Addrs(), group, topic, 30, nil)

	// §2 Configure Ferry: the old cluster active, the new one the standby,
	// the mirror on (sync_interval 1s here to keep the test short; the
	// guide keeps the default 5s), scratch topics and console consumers'
	// groups not copied.
	g := newGuideFerry(t, fmt.Sprintf(`
cluster_id: ferry-migration
clusters:
  - {name: old, bootstrap: [%s]}
  - {name: new, bootstrap: [%s]}
active: old
mirror:
  sync_interval: 1s
  topics: {exclude: ['scratch-.*']}
  groups: {exclude: ['console-consumer-.*']}
`, oldC.Bootstrap(), newC.Bootstrap()))

	// §3 Point the applications at Ferry: the group resumes through Ferry
	// where it left off on the old cluster, and what is produced through
	// Ferry lands on the old cluster at its next offsets.
	ferry := []string{g.kafka}
	offs = want.consumeInGroup(t, ctx, ferry, group, topic, 30, offs)
	want.produceRoundRobin(t, ctx, ferry, topic, parts, "via-ferry-old", 90)
	offs = want.consumeInGroup(t, ctx, ferry, group, topic, 60, offs)
	// A console consumer's group, which the configuration excludes.
	scratch := newClient(t, kgo.SeedBrokers(ferry...), kgo.ConsumerGroup("console-consumer-1"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if fs := scratch.PollRecords(ctx, 5); fs.NumRecords() == 0 {
		t.Fatalf("console-consumer-1 read nothing: %v", fs.Errors())
	}
	if err := scratch.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	scratch.Close()

	// §4 Let the mirror copy: `ferry status` shows the mirror caught up,
	// every selected partition with lag 0; the new cluster holds the same
	// offsets and records, and the group's committed offsets; the excluded
	// topic and group are not there.
	out := g.waitStatus(t, time.Minute, "routing    generation 0, active old, serving",
		"mirror     running old -> new: 3 partitions, 3 caught up, 0 halted, max lag 0 offsets / 0.0s")
	t.Logf("ferry status, mirror caught up:\n%s", out)
	if ms := g.statusJSON(t).Mirror; !ms.Summary.AllCaughtUp || ms.Summary.MaxLagRecords != 0 {
		t.Fatalf("ferry status --json: mirror %+v", ms.Summary)
	}
	if o, n := listedOffsets(t, ctx, oldC.Addrs(), topic), listedOffsets(t, ctx, newC.Addrs(), topic); o != n {
		t.Fatalf("offsets of %s: old %s, new %s", topic, o, n)
	}
	if got := readAll(t, newC.Addrs(), topic); !slices.Equal(got, want.lines()) {
		t.Fatalf("the new cluster holds %d records of %s, want the %d acknowledged at their offsets:\n%q\n%q", len(got), topic, len(want.lines()), got, want.lines())
	}
	testwait.Eventually(t, time.Minute, "the group's offsets copied to the new cluster", func() error {
		if got := committed(t, newC.Addrs(), group, topic); fmt.Sprint(got) != fmt.Sprint(offs) {
			return fmt.Errorf("on new %v, committed %v", got, offs)
		}
		return nil
	})
	if slices.Contains(topicNames(t, ctx, newC.Addrs()), "scratch-1") {
		t.Fatal("scratch-1, excluded, was created on the new cluster")
	}
	if got := committed(t, newC.Addrs(), "console-consumer-1", topic); len(got) != 0 {
		t.Fatalf("console-consumer-1, excluded, has offsets on the new cluster: %v", got)
	}

	// §5 Switch over, planned: one command; Ferry then serves the new
	// cluster and mirrors it back to the old one.
	code, out, errOut := g.switchover(t, "--to", "new")
	if code != 0 || !strings.Contains(out, "Switched from old to new (planned) in ") ||
		!strings.Contains(out, "generation  1") || !strings.Contains(out, "active      new") {
		t.Fatalf("ferry switchover --to new: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("ferry switchover --to new:\n%s", out)
	g.waitStatus(t, time.Minute, "routing    generation 1, active new, serving", "planned switch old -> new",
		"mirror     running new -> old: 3 partitions, 3 caught up, 0 halted, max lag 0 offsets")

	// §6 Run on the new cluster through Ferry: records go on at the next
	// offsets, and the group resumes where it committed.
	want.produceRoundRobin(t, ctx, ferry, topic, parts, "via-ferry-new", 60)
	offs = want.consumeInGroup(t, ctx, ferry, group, topic, 60, offs)
	if got := readAll(t, newC.Addrs(), topic); !slices.Equal(got, want.lines()) {
		t.Fatalf("the new cluster holds %d records of %s, want %d", len(got), topic, len(want.lines()))
	}

	// §7 Point the applications at the new cluster directly. First the
	// mirror back to the old cluster has caught up (it stays a fallback
	// until retired): the offsets listed on both are identical.
	g.waitStatus(t, time.Minute, "mirror     running new -> old: 3 partitions, 3 caught up, 0 halted, max lag 0 offsets / 0.0s")
	if o, n := listedOffsets(t, ctx, oldC.Addrs(), topic), listedOffsets(t, ctx, newC.Addrs(), topic); o != n {
		t.Fatalf("offsets of %s before going direct: old %s, new %s", topic, o, n)
	}
	if got := readAll(t, oldC.Addrs(), topic); !slices.Equal(got, want.lines()) {
		t.Fatalf("the old cluster holds %d records of %s, want %d", len(got), topic, len(want.lines()))
	}
	// The consumer, restarted with bootstrap.servers the new cluster's,
	// resumes in its group at exactly the offsets it committed through
	// Ferry, reading the records acknowledged there.
	offs = want.consumeInGroup(t, ctx, newC.Addrs(), group, topic, 30, offs)
	// What differs directly: the cluster ID and topic IDs are the new
	// cluster's own, not the virtual cluster's.
	viaFerry, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(ferry...))).Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(newC.Addrs()...))).Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if viaFerry.Cluster != "ferry-migration" || direct.Cluster != newC.ClusterID() || viaFerry.Topics[topic].ID == direct.Topics[topic].ID {
		t.Fatalf("cluster ID through Ferry %q, direct %q (want ferry-migration, %s); topic IDs %v, %v (want them different)",
			viaFerry.Cluster, direct.Cluster, newC.ClusterID(), viaFerry.Topics[topic].ID, direct.Topics[topic].ID)
	}

	// §8 Retire Ferry: it stops cleanly; the applications, direct, carry
	// on at the next offsets, and the group where it committed.
	g.p.stop(t, 30*time.Second)
	want.produceRoundRobin(t, ctx, newC.Addrs(), topic, parts, "direct-new", 30)
	offs = want.consumeInGroup(t, ctx, newC.Addrs(), group, topic, 60, offs)
	if got := readAll(t, newC.Addrs(), topic); !slices.Equal(got, want.lines()) {
		t.Fatalf("the new cluster holds %d records of %s, want %d", len(got), topic, len(want.lines()))
	}
	t.Logf("migrated: %d records at their offsets on the new cluster; group %s committed %v", len(want.lines()), group, offs)
}

// TestRunbookDisasterRecovery follows docs/RUNBOOK.md: steady traffic
// through Ferry, the active cluster killed, a forced switchover to the
// standby after reading the mirror lag, clients carrying on there, the old
// cluster back, its diverged topic refused for failback and repaired as the
// runbook says (Ferry running: the topic deleted on the old cluster, the
// halted partitions restarted with `ferry mirror restart --halted`), and a
// planned switch back.
func TestRunbookDisasterRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const topic, parts, group = "payments", 3, "ledger"
	east := kafkatest.Start(t, 1, kafkatest.WithName("east"))
	west := kafkatest.Start(t, 1, kafkatest.WithName("west"))
	g := newGuideFerry(t, fmt.Sprintf(`
cluster_id: ferry-dr
clusters:
  - {name: east, bootstrap: [%s]}
  - {name: west, bootstrap: [%s]}
active: east
mirror: {sync_interval: 1s}
`, east.Bootstrap(), west.Bootstrap()))
	createTopicVia(t, ctx, g.kafka, topic, parts)
	tr := startTraffic(t, g.kafka, topic, parts, group)
	tr.waitMore(300, time.Minute)

	// §1 What to watch: ready, the routing, both clusters reachable, the
	// mirror running with nothing halted; the lag per partition in
	// /metrics.
	out := g.waitStatus(t, time.Minute, "ready      yes", "routing    generation 0, active east, serving",
		"clusters   east reachable (active)", "west reachable", "mirror     running east -> west: 3 partitions,", " 0 halted,")
	t.Logf("ferry status, steady:\n%s", out)
	testwait.Eventually(t, time.Minute, "ferry_mirror_lag_records in /metrics", func() error {
		if code, body := httpGet(t, "http://"+g.admin+"/metrics"); code != 200 || !strings.Contains(body, `ferry_mirror_lag_records{partition="0",topic="payments"}`) {
			return fmt.Errorf("/metrics = %d without ferry_mirror_lag_records for %s[0]", code, topic)
		}
		return nil
	})

	// A batch job leaves a transaction open on partition 0: the mirror
	// copies decided records only, so that partition's lag grows (§1,
	// "What the lag means, and why it grows").
	job := newClient(t, kgo.SeedBrokers(g.kafka), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionalID("nightly-job"), kgo.TransactionTimeout(5*time.Minute))
	if err := job.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := job.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("job-open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// The lag now shows ordinary backlog too (the source's ends are listed
	// every second), so the open transaction's is told by the mirror
	// standing still at the last stable offset while the lag grows.
	var stuckAt int64 = -1
	testwait.Eventually(t, time.Minute, "partition 0's lag to grow behind the open transaction", func() error {
		for _, p := range g.statusJSON(t).Mirror.Partitions {
			if p.Topic != topic || p.Partition != 0 {
				continue
			}
			if p.MirroredOffset != p.SourceStable || p.LagRecords < 50 {
				stuckAt = -1
				return fmt.Errorf("partition 0: %+v", p)
			}
			if stuckAt != p.MirroredOffset {
				stuckAt = p.MirroredOffset
				time.Sleep(time.Second)
				return fmt.Errorf("partition 0 at %d, waiting to see it stay there", stuckAt)
			}
			return nil
		}
		return fmt.Errorf("mirror %+v", g.statusJSON(t).Mirror.Partitions)
	})

	// §4.1 The active cluster dies. `ferry status` says it is unreachable
	// and the member not ready; producers' records wait, retried.
	if err := east.Kill(east.NodeIDs()[0]); err != nil {
		t.Fatal(err)
	}
	g.waitStatus(t, time.Minute, "ready      no: not ready: active cluster \"east\" unreachable", "clusters   east unreachable: ")
	// What the producer had been told before the death.
	tr.mu.Lock()
	acked := map[int32]map[int64]string{}
	for p, offs := range tr.acked {
		acked[p] = maps.Clone(offs)
	}
	tr.mu.Unlock()

	// §4.2 Before forcing, read what would be lost: each partition's
	// lag_records in `ferry status --json` (the summary line gives the
	// largest).
	var lagRead int64
	lagBy := map[int32]int64{}
	for _, p := range g.statusJSON(t).Mirror.Partitions {
		if p.Topic == topic {
			lagRead += p.LagRecords
			lagBy[p.Partition] = p.LagRecords
		}
	}
	t.Logf("lag read before forcing: %d offsets (%v)", lagRead, lagBy)
	if lagBy[0] < 50 {
		t.Fatalf("partition 0's lag read after the death is %d, want the open transaction's backlog; mirror %+v", lagBy[0], g.statusJSON(t).Mirror.Partitions)
	}

	// §4.3 The forced switchover: the answer lists what west never received.
	code, out, errOut := g.switchover(t, "--to", "west", "--forced")
	if code != 0 || !strings.Contains(out, "Switched from east to west (forced) in ") || !strings.Contains(out, "generation  1") ||
		!strings.Contains(out, "lost        offsets east acknowledged and west never received, in ") || !strings.Contains(out, topic+"[0]  offsets ") {
		t.Fatalf("ferry switchover --to west --forced: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("ferry switchover --to west --forced:\n%s", out)
	// §4.5 The same ranges stay in `ferry status` until the next switch.
	last := g.statusJSON(t).Routing.LastSwitch
	if last == nil || last.Mode != routing.Forced || last.Outcome != "switched" || len(last.Lost) == 0 {
		t.Fatalf("last switch in ferry status --json: %+v", last)
	}
	var listed int64
	lostRange := map[int32]routing.LostRange{}
	for _, r := range last.Lost {
		listed += r.To - r.From
		lostRange[r.Partition] = r
	}
	if listed > lagRead {
		t.Fatalf("the forced switch lists %d offsets lost (%v), more than the %d the lag showed before it", listed, last.Lost, lagRead)
	}

	// §4.4 After the forced switch: clients carry on on west without an
	// error (the records held while east was dead go to west).
	tr.waitMore(300, 2*time.Minute)
	g.waitStatus(t, time.Minute, "routing    generation 1, active west, serving", "ready      yes")
	// What was lost: acknowledged by east and not on west at its offset:
	// exactly what east acknowledged at or above the fence, each
	// partition's end on west at the flip (/status/routing). The listed
	// ranges start at the fence; what east acknowledged after the
	// mirror's last fetch from it lies beyond them, unlisted, and is found
	// once east is back (§5.3).
	code, body := httpGet(t, "http://"+g.admin+"/status/routing")
	var rst routing.State
	if err := json.Unmarshal([]byte(body), &rst); code != 200 || err != nil || len(rst.Fences) == 0 || rst.Fences[len(rst.Fences)-1].Generation != 0 {
		t.Fatalf("/status/routing = %d %v: %s", code, err, body)
	}
	fence := rst.Fences[len(rst.Fences)-1].Ends[topic]
	if len(fence) != parts {
		t.Fatalf("fence of generation 0 for %s: %v", topic, fence)
	}
	for _, r := range last.Lost {
		if r.From != fence[r.Partition] {
			t.Fatalf("lost range %v does not start at the fence %d", r, fence[r.Partition])
		}
	}
	onWest := map[string]bool{}
	for _, l := range readAll(t, west.Addrs(), topic) {
		onWest[l] = true
	}
	lost := map[int32]map[int64]string{}
	var nLost, beyond int
	for p, offs := range acked {
		for o, v := range offs {
			if onWest[fmt.Sprintf("%d/%d=%s", p, o, v)] != (o < fence[p]) {
				t.Fatalf("%s[%d] offset %d (%s), acknowledged by east: on west %v, fence %d", topic, p, o, v, !(o < fence[p]), fence[p])
			}
			if o < fence[p] {
				continue
			}
			if lost[p] == nil {
				lost[p] = map[int64]string{}
			}
			lost[p][o] = v
			nLost++
			if r, ok := lostRange[p]; !ok || o >= r.To {
				beyond++
			}
		}
	}
	t.Logf("lost %d acknowledged records (%d beyond the listed ranges %v, fence %v); lag read before forcing %d", nLost, beyond, last.Lost, fence, lagRead)
	if int64(nLost-beyond) > listed {
		t.Fatalf("%d acknowledged records lost inside the listed ranges, which hold %d offsets", nLost-beyond, listed)
	}

	// §5.1 The old primary returns. The mirror now runs west -> east and
	// halts the partitions east holds records of that west never had;
	// `ferry status` names them.
	if err := east.Restart(east.NodeIDs()[0]); err != nil {
		t.Fatal(err)
	}
	out = g.waitStatus(t, 2*time.Minute, "east reachable", "mirror     running west -> east:", "halted "+topic+"[0]: ")
	t.Logf("ferry status, east back:\n%s", out)
	if code, body := httpGet(t, "http://"+g.admin+"/metrics"); code != 200 || !regexp.MustCompile(`ferry_mirror_partition_halted\{partition="0",reason="[a-z_]+",topic="payments"\} 1`).MatchString(body) {
		t.Fatalf("/metrics = %d without ferry_mirror_partition_halted for %s[0]", code, topic)
	}
	// §5.3 The records lost are on east, at their offsets: the operator
	// can read them there (and replay them) before repairing.
	for p, offs := range lost {
		onEast := readThrough(t, east.Addrs(), topic, p, slices.Max(slices.Collect(maps.Keys(offs))))
		for o, v := range offs {
			if onEast[o] != v {
				t.Fatalf("%s[%d] offset %d (%s), lost in the switch, is not on east (%q there)", topic, p, o, v, onEast[o])
			}
		}
	}

	// §5.2 A failback is refused while partitions are halted, naming them.
	code, out, errOut = g.switchover(t, "--to", "east")
	if code != 1 || !strings.Contains(errOut, "switchover to east refused (409 mirror_halted)") || !strings.Contains(errOut, "\n  "+topic+"[0]: ") {
		t.Fatalf("ferry switchover --to east with %s[0] halted: exit %d\n%s%s", topic, code, out, errOut)
	}
	t.Logf("failback refused:\n%s", errOut)

	// §5.4 Repair, Ferry running: halt what still mirrors of the topic
	// (here every partition already is: the answer keeps each one's
	// reason), delete it on east directly (the halted writers append
	// nothing meanwhile); the mirror's
	// sync loop creates it again on east; `ferry mirror restart --halted`
	// starts a new writer for each halted partition, which copies it from
	// west at the same offsets. Clients go on throughout.
	code, out, errOut = runCLI(t, "mirror", "halt", "--admin", g.admin, "--topic", topic)
	if code != 0 || !strings.Contains(out, "Halted 3 partitions") || !strings.Contains(out, "  "+topic+"[0]  member ") || !strings.Contains(out, "was halted (diverged)") {
		t.Fatalf("ferry mirror halt --topic %s: exit %d\n%s%s", topic, code, out, errOut)
	}
	t.Logf("ferry mirror halt --topic %s:\n%s", topic, out)
	resp, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(east.Addrs()...))).DeleteTopic(ctx, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("delete %s on east: %v", topic, err)
	}
	repairStart := time.Now()
	eastAdm := kadm.NewClient(newClient(t, kgo.SeedBrokers(east.Addrs()...)))
	testwait.Eventually(t, time.Minute, topic+" created again on east by the mirror", func() error {
		ends, err := eastAdm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
		if err != nil || len(ends[topic]) != parts {
			return fmt.Errorf("east's ends %v: %v", ends, err)
		}
		if o, _ := ends.Lookup(topic, 0); o.Offset != 0 {
			return fmt.Errorf("%s[0] on east ends at %d, not a new empty topic", topic, o.Offset)
		}
		return nil
	})
	// Still halted: nothing restarts on its own.
	if out := g.status(t); !strings.Contains(out, "halted "+topic+"[0]: ") {
		t.Fatalf("ferry status after the topic was recreated, before the restart:\n%s", out)
	}
	code, out, errOut = runCLI(t, "mirror", "restart", "--admin", g.admin, "--halted")
	if code != 0 || !strings.Contains(out, "Restarted ") || !strings.Contains(out, "  "+topic+"[0]  member ") {
		t.Fatalf("ferry mirror restart --halted: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("ferry mirror restart --halted:\n%s", out)
	out = g.waitStatus(t, 2*time.Minute, "routing    generation 1, active west, serving",
		"mirror     running west -> east: 3 partitions, 3 caught up, 0 halted, max lag 0 offsets")
	t.Logf("ferry status, repaired in %s without stopping Ferry:\n%s", time.Since(repairStart).Round(time.Millisecond), out)
	tr.waitMore(300, 2*time.Minute)

	// §5.5 Fail back, planned: nothing acknowledged is lost.
	code, out, errOut = g.switchover(t, "--to", "east")
	if code != 0 || !strings.Contains(out, "Switched from west to east (planned) in ") || !strings.Contains(out, "generation  2") {
		t.Fatalf("ferry switchover --to east (failback): exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("ferry switchover --to east:\n%s", out)
	g.waitStatus(t, time.Minute, "routing    generation 2, active east, serving", "mirror     running east -> west:")
	tr.waitMore(300, 2*time.Minute)
	tr.stopProducing()

	// §5.5 and §6, checks: no produce failed; east holds every acknowledged record
	// at its offset but those lost in the forced switch; the consumer
	// group read them all.
	tr.mu.Lock()
	failed := tr.failed
	final := map[int32]map[int64]string{}
	for p, offs := range tr.acked {
		final[p] = maps.Clone(offs)
	}
	unplaced := maps.Clone(tr.unplaced) // acknowledged at -1 (written before, in the failback)
	tr.mu.Unlock()
	if len(failed) > 0 {
		t.Fatalf("%d produces failed, e.g. %v", len(failed), failed[0])
	}
	onEast := map[string]bool{}
	for _, l := range readAll(t, east.Addrs(), topic) {
		onEast[l] = true
	}
	total := 0
	heldOnEast := map[string]bool{} // "partition/value"
	for l := range onEast {
		p, rest, _ := strings.Cut(l, "/")
		_, v, _ := strings.Cut(rest, "=")
		heldOnEast[p+"/"+v] = true
	}
	for p, vs := range unplaced {
		for _, v := range vs {
			total++
			if !heldOnEast[fmt.Sprintf("%d/%s", p, v)] {
				t.Fatalf("%s[%d]: %s, acknowledged (at -1), is not on east after the failback", topic, p, v)
			}
		}
	}
	for p, offs := range final {
		for o, v := range offs {
			if lost[p][o] == v {
				continue // acknowledged by east before it died, never on west
			}
			total++
			if !onEast[fmt.Sprintf("%d/%d=%s", p, o, v)] {
				t.Fatalf("%s[%d] offset %d (%s), acknowledged, is not on east after the failback", topic, p, o, v)
			}
		}
	}
	testwait.Eventually(t, time.Minute, "the group to read every record kept", func() error {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for p, offs := range final {
			for o, v := range offs {
				if lost[p][o] != v && tr.seen[p][o] != v {
					return fmt.Errorf("%s[%d] offset %d (%s) not read (read %q there)", topic, p, o, v, tr.seen[p][o])
				}
			}
		}
		for p, vs := range unplaced {
			read := valuesOf(tr.seen[p])
			for _, v := range vs {
				if !read[v] {
					return fmt.Errorf("%s[%d]: %s (acknowledged at -1) not read", topic, p, v)
				}
			}
		}
		return nil
	})
	tr.stop()
	t.Logf("%d records acknowledged and kept across a forced switch and a failback; %d lost in the forced switch (lag read %d); %d re-read",
		total, nLost, lagRead, tr.rereads())
}
