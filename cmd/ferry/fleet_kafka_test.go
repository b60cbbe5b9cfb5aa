package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

// fleetMember is one `ferry serve` process of a test fleet, with the
// addresses it keeps across restarts.
type fleetMember struct {
	id                   int32
	kafka, admin, gossip string
	config               string
	cutFile              string // the broker addresses it is cut off from (a fleet built for faults)
	p                    *proc
}

// testFleet is three members in front of a primary and a standby.
type testFleet struct {
	// t is the test the processes live as long as (not a subtest's).
	t                *testing.T
	primary, standby *kafkatest.Cluster
	members          []*fleetMember
	key              string // key file path
	extra            string // more of every member's configuration (YAML)
	faults           string // the ferry binary built with -tags faults, or "": the test binary
}

// freeAddr is a loopback host:port free for TCP and UDP.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := benchutil.FreeGossipAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func writeKey(t *testing.T, seed byte) string {
	t.Helper()
	path, err := benchutil.WriteGossipKey(t.TempDir(), seed)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// startTestFleet starts a primary and a standby (one broker each) and n
// members seeded with each other, and waits until every member sees all.
func startTestFleet(t *testing.T, n int) *testFleet {
	t.Helper()
	return startTestFleetWith(t, n, "")
}

// startTestFleetWith is startTestFleet with extra added to every member's
// configuration.
func startTestFleetWith(t *testing.T, n int, extra string) *testFleet {
	t.Helper()
	return startFleet(t, n, extra, false)
}

// startTestFleetCuttable is startTestFleetWith with members built for
// fault injection, each of which f.cut cuts off from a cluster.
func startTestFleetCuttable(t *testing.T, n int, extra string) *testFleet {
	t.Helper()
	return startFleet(t, n, extra, true)
}

func startFleet(t *testing.T, n int, extra string, faults bool) *testFleet {
	t.Helper()
	if testing.Short() {
		t.Skip("real Kafka")
	}
	f := &testFleet{
		t:       t,
		primary: kafkatest.Start(t, 1, kafkatest.WithName("primary")),
		standby: kafkatest.Start(t, 1, kafkatest.WithName("standby")),
		key:     writeKey(t, 1),
		extra:   extra,
	}
	if faults {
		f.faults = buildFaultsBinary(t)
	}
	cuts := t.TempDir()
	// A port found free can be taken before the member binds it (by
	// another test's listener, or as the local port of a connection):
	// then the fleet starts again on new addresses.
	for attempt := 1; ; attempt++ {
		f.members = f.members[:0]
		for i := range n {
			f.members = append(f.members, &fleetMember{id: int32(i), kafka: freeAddr(t), admin: freeAddr(t), gossip: freeAddr(t),
				cutFile: filepath.Join(cuts, fmt.Sprintf("cut-%d", i))})
		}
		var seeds []string
		for _, m := range f.members {
			seeds = append(seeds, m.gossip)
		}
		clash := false
		for _, m := range f.members {
			m.config = writeConfig(t, f.configFor(m.id, m.kafka, m.admin, m.gossip, seeds, f.key))
			m.p = f.run(m)
			if m.p.waitOrExit(t, servingLine, 2*time.Minute) {
				continue
			}
			if attempt < 3 && strings.Contains(m.p.output(), "already in use") {
				clash = true
				break
			}
			t.Fatalf("member %d exited (%v) before serving", m.id, m.p.err)
		}
		if !clash {
			break
		}
		t.Logf("attempt %d: a member's address was taken before it bound it; the fleet starts again on new addresses", attempt)
		for _, m := range f.members {
			if m.p != nil {
				m.p.kill()
			}
		}
	}
	f.waitAlive(t, f.ids()...)
	return f
}

func (f *testFleet) configFor(id int32, kafka, adminAddr, gossip string, seeds []string, key string) string {
	return fmt.Sprintf(`
cluster_id: ferry-fleet-test
node_id: %d
listen: %s
admin_listen: %s
lanes: 1
clusters:
  - {name: primary, bootstrap: [%s]}
  - {name: standby, bootstrap: [%s]}
mirror: {sync_interval: 1s}
fleet:
  bind: %s
  seeds: [%s]
  key_file: %s
%s`, id, kafka, adminAddr, f.primary.Bootstrap(), f.standby.Bootstrap(), gossip, strings.Join(seeds, ", "), key, f.extra)
}

func (f *testFleet) ids() []int32 {
	var ids []int32
	for _, m := range f.members {
		ids = append(ids, m.id)
	}
	return ids
}

// bootstrap lists every member's Kafka address.
func (f *testFleet) bootstrap() string {
	var addrs []string
	for _, m := range f.members {
		addrs = append(addrs, m.kafka)
	}
	return strings.Join(addrs, ",")
}

var servingLine = regexp.MustCompile(`"msg":"serving Kafka clients"`)

// start runs m's process for as long as the whole test.
func (f *testFleet) start(t *testing.T, m *fleetMember) {
	t.Helper()
	m.p = f.run(m)
	m.p.waitFor(t, servingLine, 2*time.Minute)
}

// run starts m's process for as long as the whole test.
func (f *testFleet) run(m *fleetMember) *proc {
	args := []string{"serve", "--config", m.config}
	if f.faults == "" {
		return startFerry(f.t, args...)
	}
	cmd := exec.Command(f.faults, args...)
	cmd.Env = append(os.Environ(), "FERRY_FAULT_CUT_FILE="+m.cutFile)
	return startCmd(f.t, cmd, args)
}

// cut cuts m off from the brokers at addrs (none: joins it up again), at
// its next read of its cut file (every 100 ms): its dials to them fail and
// its connections to them close (protocol/clusterauth/faults.go).
func (f *testFleet) cut(t *testing.T, m *fleetMember, addrs []string) {
	t.Helper()
	if f.faults == "" {
		t.Fatal("cut: the fleet was not built for faults (startTestFleetCuttable)")
	}
	if err := os.WriteFile(m.cutFile, []byte(strings.Join(addrs, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
}

// buildFaultsBinary builds ferry with -tags faults for the test.
func buildFaultsBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ferry-faults")
	start := time.Now()
	if out, err := exec.Command("go", "build", "-tags=faults", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags faults: %v\n%s", err, out)
	}
	t.Logf("ferry built with -tags faults in %v", time.Since(start).Round(time.Millisecond))
	return bin
}

// status reads the member's /status, or fails.
func (m *fleetMember) status(t *testing.T) (admin.Status, error) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + m.admin + "/status")
	if err != nil {
		return admin.Status{}, err
	}
	defer resp.Body.Close()
	var st admin.Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// waitAlive waits until every running member lists exactly ids alive.
func (f *testFleet) waitAlive(t *testing.T, ids ...int32) {
	t.Helper()
	want := slices.Clone(ids)
	slices.Sort(want)
	testwait.Eventually(t, time.Minute, fmt.Sprintf("members agreeing on %v alive", want), func() error {
		for _, m := range f.members {
			if !slices.Contains(want, m.id) {
				continue
			}
			st, err := m.status(t)
			if got := st.Alive(); err != nil || !slices.Equal(got, want) {
				return fmt.Errorf("member %d: alive %v (%v)", m.id, got, err)
			}
		}
		return nil
	})
}

// metadataBrokers is the broker list a client gets through addr.
func metadataBrokers(t *testing.T, ctx context.Context, addr string) []string {
	t.Helper()
	md, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addr))).BrokerMetadata(ctx)
	if err != nil {
		t.Fatalf("metadata through %s: %v", addr, err)
	}
	var out []string
	for _, b := range md.Brokers {
		out = append(out, fmt.Sprintf("%d@%s:%d", b.NodeID, b.Host, b.Port))
	}
	slices.Sort(out)
	return out
}

// TestFleetRealKafka runs three `ferry serve` processes as one fleet in
// front of real Kafka, and takes them through what an operator does to a
// fleet, in order: serve one cluster through any member, refuse bad gossip,
// lose a member to kill -9 under traffic, restart every member in turn
// under traffic, switch over while a member is paused, and restart the
// whole fleet after the switch.
func TestFleetRealKafka(t *testing.T) {
	f := startTestFleet(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const topic, parts = "fleet", 6

	if !t.Run("one cluster through every member", func(t *testing.T) {
		want := metadataBrokers(t, ctx, f.members[0].kafka)
		if len(want) != 3 {
			t.Fatalf("metadata through member 0 names %v, want the three members", want)
		}
		for _, m := range f.members[1:] {
			if got := metadataBrokers(t, ctx, m.kafka); !slices.Equal(got, want) {
				t.Fatalf("metadata through member %d names %v, through member 0 %v", m.id, got, want)
			}
		}
		createTopicVia(t, ctx, f.members[0].kafka, topic, parts)
		// Produce through member 1 alone as bootstrap, consume through
		// member 2 alone.
		prod := newClient(t, kgo.SeedBrokers(f.members[1].kafka), kgo.DefaultProduceTopic(topic))
		for i := range 60 {
			if err := prod.ProduceSync(ctx, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)}).FirstErr(); err != nil {
				t.Fatalf("produce through member 1: %v", err)
			}
		}
		cons := newClient(t, kgo.SeedBrokers(f.members[2].kafka), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		got := map[string]bool{}
		for len(got) < 60 {
			fs := cons.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("consumed %d of 60 through member 2", len(got))
			}
			fs.EachRecord(func(r *kgo.Record) { got[string(r.Value)] = true })
		}
		// The mirror's writers are spread: every partition has an owner
		// and more than one member owns some, in every member's view.
		var st admin.Status
		testwait.Eventually(t, time.Minute, fmt.Sprintf("the mirror of %s spread and caught up in member 2's /status", topic), func() error {
			var err error
			st, err = f.members[2].status(t)
			owners := map[int32]bool{}
			n := 0
			for _, p := range st.Mirror.Partitions {
				if p.Topic == topic {
					owners[p.Owner] = true
					n++
				}
			}
			if err != nil || n != parts || len(owners) <= 1 || !st.Mirror.Summary.AllCaughtUp {
				return fmt.Errorf("%d partitions, owners %v, caught up %v (%v)", n, owners, st.Mirror.Summary.AllCaughtUp, err)
			}
			return nil
		})
		// Each member as /status lists it: its addresses, and its share
		// of the mirror and of the clients.
		mirrored := 0
		for _, m := range st.Members {
			fm := f.members[m.NodeID]
			if m.Gossip != fm.gossip || len(m.Ports) != 1 || fmt.Sprintf("%s:%d", m.Host, m.Ports[0]) != fm.kafka || m.Admin != fm.admin {
				t.Fatalf("member %d in /status: %+v; configured gossip %s, kafka %s, admin %s", m.NodeID, m, fm.gossip, fm.kafka, fm.admin)
			}
			if m.Connections < 0 || m.MirrorPartitions < 0 {
				t.Fatalf("member %d did not say its connections or mirror partitions: %+v", m.NodeID, m)
			}
			mirrored += m.MirrorPartitions
		}
		if mirrored != parts {
			t.Fatalf("the members' mirror partitions add up to %d, want %d: %+v", mirrored, parts, st.Members)
		}
	}) {
		return
	}

	if !t.Run("bad gossip refused", func(t *testing.T) {
		target := f.members[0].gossip
		// Garbage on the gossip port, TCP and UDP.
		if c, err := net.Dial("tcp", target); err == nil {
			c.Write([]byte("GET / HTTP/1.0\r\n\r\n\x00\x01\x02garbage"))
			c.Close()
		}
		if c, err := net.Dial("udp", target); err == nil {
			for range 10 {
				c.Write([]byte("\x01\x02\x03 not memberlist"))
			}
			c.Close()
		}
		// A process with another key, and one with a node ID in use.
		seeds := []string{target}
		wrongKey := &fleetMember{id: 7, kafka: freeAddr(t), admin: freeAddr(t), gossip: freeAddr(t)}
		wrongKey.config = writeConfig(t, f.configFor(7, wrongKey.kafka, wrongKey.admin, wrongKey.gossip, seeds, writeKey(t, 9)))
		dup := &fleetMember{id: 1, kafka: freeAddr(t), admin: freeAddr(t), gossip: freeAddr(t)}
		dup.config = writeConfig(t, f.configFor(1, dup.kafka, dup.admin, dup.gossip, seeds, f.key))
		for _, m := range []*fleetMember{wrongKey, dup} {
			m.p = startFerry(t, "serve", "--config", m.config)
		}
		dup.p.waitFor(t, regexp.MustCompile(`(?i)node.?id 1 .*(in use|held|duplicate)|duplicate.*node`), time.Minute)
		// Neither joined: the fleet still lists its three, and each
		// intruder's /readyz says why it is not ready.
		f.waitAlive(t, 0, 1, 2)
		for _, m := range []*fleetMember{wrongKey, dup} {
			testwait.Eventually(t, time.Minute, fmt.Sprintf("member %d refused by the fleet: /readyz 503 naming the fleet", m.id), func() error {
				if code, body := httpGet(t, "http://"+m.admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "fleet") {
					return fmt.Errorf("/readyz %d %q", code, body)
				}
				return nil
			})
			m.p.cmd.Process.Kill()
			<-m.p.done
		}
		for _, m := range f.members {
			st, err := m.status(t)
			if err != nil || !slices.Equal(st.Alive(), []int32{0, 1, 2}) {
				t.Fatalf("member %d after the intruders: alive %v (%v)", m.id, st.Alive(), err)
			}
		}
	}) {
		return
	}

	if !t.Run("kill -9 under traffic", func(t *testing.T) {
		const topic = "fleet-kill"
		createTopicVia(t, ctx, f.members[0].kafka, topic, parts)
		tr := startTraffic(t, f.bootstrap(), topic, parts, "fleet-kill")
		tr.waitMore(300, time.Minute)
		victim := f.members[1]
		victim.p.cmd.Process.Kill()
		<-victim.p.done
		killed := time.Now()
		f.waitAlive(t, 0, 2)
		tr.waitMore(500, 2*time.Minute)
		t.Logf("after kill -9 of member 1: 500 more acknowledged and consumed within %v", time.Since(killed))
		// The dead member's mirror partitions resume on the others.
		waitMirrorOwners(t, f.members[0], topic, parts, []int32{0, 2})
		f.start(t, victim)
		f.waitAlive(t, 0, 1, 2)
		tr.stopProducing()
		tr.waitConsumed(time.Minute)
		tr.stop()
		total := tr.verifyOn(ctx, f.primary.Addrs())
		waitMirrored(t, f, topic)
		t.Logf("%d records acknowledged, all on the primary at their offsets and on the standby at the same", total)
	}) {
		return
	}

	if !t.Run("rolling restart under traffic", func(t *testing.T) {
		const topic = "fleet-rolling"
		createTopicVia(t, ctx, f.members[0].kafka, topic, parts)
		tr := startTraffic(t, f.bootstrap(), topic, parts, "fleet-rolling")
		tr.waitMore(300, time.Minute)
		for _, m := range f.members {
			m.p.stop(t, time.Minute)
			others := slices.DeleteFunc(f.ids(), func(id int32) bool { return id == m.id })
			f.waitAlive(t, others...)
			tr.waitMore(200, 2*time.Minute)
			f.start(t, m)
			f.waitAlive(t, f.ids()...)
			tr.waitMore(200, 2*time.Minute)
		}
		tr.stopProducing()
		tr.waitConsumed(time.Minute)
		tr.stop()
		total := tr.verifyOn(ctx, f.primary.Addrs())
		t.Logf("%d records acknowledged across a rolling restart of three members", total)
	}) {
		return
	}

	if !t.Run("switch while a member is paused", func(t *testing.T) {
		// A producer that reaches the cluster through the paused member
		// only: its requests wait there across the switch.
		const topic = "fleet-paused"
		createTopicVia(t, ctx, f.members[0].kafka, topic, parts)
		paused := f.members[2]
		tr := startTraffic(t, f.bootstrap(), topic, parts, "fleet-paused")
		tr.waitMore(300, time.Minute)
		if err := paused.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// Gossip finds it gone; the switch runs without it.
		f.waitAlive(t, 0, 1)
		out, err := ferryCmd(t, "switchover", "--admin", f.members[0].admin, "--to", "standby").CombinedOutput()
		if err != nil {
			t.Fatalf("ferry switchover: %v\n%s", err, out)
		}
		t.Logf("switchover with member 2 paused:\n%s", out)
		time.Sleep(2 * time.Second) // the paused member's lease has long ended
		if err := paused.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		f.waitAlive(t, 0, 1, 2)
		for _, m := range f.members {
			waitGeneration(t, m, 1, "standby")
		}
		// Each member's /status lists every member at the generation it
		// answers serving: not gossip's view, which memberlist can leave
		// a push-pull (30 s) behind.
		for _, m := range f.members {
			testwait.Eventually(t, 10*time.Second, fmt.Sprintf("member %d's /status listing all 3 members at generation 1", m.id), func() error {
				st, err := m.status(t)
				behind := []int32{}
				for _, mm := range st.Members {
					if mm.Generation != 1 {
						behind = append(behind, mm.NodeID)
					}
				}
				if err != nil || len(st.Members) != 3 || len(behind) != 0 {
					return fmt.Errorf("members %v below generation 1 (%d listed, %v): %+v", behind, len(st.Members), err, st.Members)
				}
				return nil
			})
		}
		tr.waitMore(500, 2*time.Minute)
		tr.stopProducing()
		tr.waitConsumed(time.Minute)
		tr.stop()
		// Every record is on the standby at its offset, and the primary
		// (now mirrored to) holds the same: nothing reached the primary
		// after the flip but the mirror. Writes the paused member had
		// sent before it stopped landed, and were mirrored, but their
		// answers came too late: the producer sent them again after
		// the switch, under a new producer ID, and Ferry answers those
		// DUPLICATE_SEQUENCE_NUMBER (success at offset -1, checked by
		// value) from where the producer stopped on the primary. Only
		// when that read fails are they written twice
		// (docs/ARCHITECTURE.md, "The fleet").
		total, dups := tr.verify(ctx, f.standby.Addrs(), true)
		tr.mu.Lock()
		atUnknown := 0
		for _, vs := range tr.unplaced {
			atUnknown += len(vs)
		}
		tr.mu.Unlock()
		t.Logf("%d records acknowledged, %d of them at -1 (written before the switch, answer lost); %d written twice (in flight at the paused member): %v", total, atUnknown, len(dups), dups)
		waitMirrored(t, f, topic)
		if h := haltedPartitions(t, f.members[0]); len(h) > 0 {
			t.Fatalf("mirror partitions halted after the switch: %v", h)
		}
	}) {
		return
	}

	if !t.Run("full restart after the switch", func(t *testing.T) {
		for _, m := range f.members {
			m.p.stop(t, time.Minute)
		}
		for _, m := range f.members {
			f.start(t, m)
		}
		f.waitAlive(t, f.ids()...)
		for _, m := range f.members {
			waitGeneration(t, m, 1, "standby")
		}
		before := endOffsets(t, f.standby.Addrs(), topic)
		prod := newClient(t, kgo.SeedBrokers(strings.Split(f.bootstrap(), ",")...), kgo.DefaultProduceTopic(topic))
		for i := range 30 {
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: fmt.Appendf(nil, "after-restart-%d", i)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if after := endOffsets(t, f.standby.Addrs(), topic); sumEnds(after)-sumEnds(before) != 30 {
			t.Fatalf("the standby's end offsets went from %v to %v for 30 records produced after the restart", before, after)
		}
	}) {
		return
	}

	t.Run("forced switch across the fleet", func(t *testing.T) {
		waitMirrored(t, f, topic)
		// Member 2 is paused just before: gossip still has it alive when
		// the switch stops the mirror, and it answers for none of the
		// partitions its writers copy. Their fence is still recorded.
		paused := f.members[2]
		owned := map[string]bool{}
		st, err := paused.status(t)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Mirror.Partitions {
			if p.Owner == paused.id {
				owned[fmt.Sprintf("%s[%d]", p.Topic, p.Partition)] = true
			}
		}
		if err := paused.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		out, err := ferryCmd(t, "switchover", "--admin", f.members[1].admin, "--to", "primary", "--forced").CombinedOutput()
		if err := paused.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err != nil {
			t.Fatalf("ferry switchover --forced: %v\n%s", err, out)
		}
		f.waitAlive(t, 0, 1, 2)
		for _, m := range f.members {
			waitGeneration(t, m, 2, "primary")
		}
		routed := routingState(t, f.members[0])
		var fence *routing.Fence
		for i := range routed.Fences {
			if routed.Fences[i].Generation == 1 {
				fence = &routed.Fences[i]
			}
		}
		if fence == nil {
			t.Fatalf("no fence of generation 1 in %+v", routed.Fences)
		}
		for _, p := range st.Mirror.Partitions {
			if e := fence.Ends[p.Topic]; int(p.Partition) >= len(e) || e[p.Partition] < 0 {
				t.Errorf("generation 1's fence has no end for %s[%d] (its writer on member %d; member 2 was paused, owning %d partitions): %v",
					p.Topic, p.Partition, p.Owner, len(owned), fence.Ends[p.Topic])
			}
		}
		t.Logf("forced switch with member 2 (writer of %d partitions) paused:\n%s", len(owned), out)
		before := endOffsets(t, f.primary.Addrs(), topic)
		prod := newClient(t, kgo.SeedBrokers(strings.Split(f.bootstrap(), ",")...), kgo.DefaultProduceTopic(topic))
		for i := range 30 {
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: fmt.Appendf(nil, "after-forced-%d", i)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if after := endOffsets(t, f.primary.Addrs(), topic); sumEnds(after)-sumEnds(before) != 30 {
			t.Fatalf("the primary's end offsets went from %v to %v for 30 records produced after the forced switch", before, after)
		}
		// The mirror runs the other way on every member, and the
		// standby catches up.
		waitMirrored(t, f, topic)
	})
}

// waitMirrorOwners waits until m's /status shows every partition of topic
// owned by one of owners.
func waitMirrorOwners(t *testing.T, m *fleetMember, topic string, parts int, owners []int32) {
	t.Helper()
	testwait.Eventually(t, time.Minute, fmt.Sprintf("all %d partitions of %s owned by %v in member %d's /status", parts, topic, owners, m.id), func() error {
		st, err := m.status(t)
		n := 0
		for _, p := range st.Mirror.Partitions {
			if p.Topic == topic && slices.Contains(owners, p.Owner) {
				n++
			}
		}
		if err != nil || n != parts {
			return fmt.Errorf("%d of %d (%v)", n, parts, err)
		}
		return nil
	})
}

// waitMirrored waits until the mirror target's end offsets equal the
// source's for topic, and its records are the same at every offset.
func waitMirrored(t *testing.T, f *testFleet, topic string) {
	t.Helper()
	st, err := f.members[0].status(t)
	if err != nil {
		t.Fatal(err)
	}
	src, dst := f.primary, f.standby
	if st.Routing.Active == "standby" {
		src, dst = f.standby, f.primary
	}
	testwait.Eventually(t, 2*time.Minute, "the mirror target's ends equal to the source's", func() error {
		// The target's topic may not be created yet.
		a, err := tryEndOffsets(t, src.Addrs(), topic)
		if err != nil {
			return err
		}
		b, err := tryEndOffsets(t, dst.Addrs(), topic)
		if err != nil {
			return err
		}
		if fmt.Sprint(a) != fmt.Sprint(b) {
			return fmt.Errorf("mirror target ends %v, source %v", b, a)
		}
		return nil
	})
	if a, b := readAll(t, src.Addrs(), topic), readAll(t, dst.Addrs(), topic); !slices.Equal(a, b) {
		t.Fatalf("the mirror target differs from the source (%d and %d records)", len(b), len(a))
	}
}

// readAll reads every record of topic on a cluster, read_uncommitted, as
// "partition/offset=value" sorted.
func readAll(t *testing.T, addrs []string, topic string) []string {
	t.Helper()
	ends := endOffsets(t, addrs, topic)
	want := sumEnds(ends)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []string
	for int64(len(out)) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(out), want, topic)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, fmt.Sprintf("%d/%d=%s", r.Partition, r.Offset, r.Value)) })
	}
	slices.Sort(out)
	return out
}

// waitGeneration waits until m serves generation gen with active active.
func waitGeneration(t *testing.T, m *fleetMember, gen uint32, active string) {
	t.Helper()
	testwait.Eventually(t, time.Minute, fmt.Sprintf("member %d serving generation %d on %q", m.id, gen, active), func() error {
		st, err := m.status(t)
		if err != nil || st.Routing.Generation != gen || st.Routing.Active != active {
			return fmt.Errorf("member %d serves generation %d on %q (%v)", m.id, st.Routing.Generation, st.Routing.Active, err)
		}
		return nil
	})
}

// haltedPartitions lists the mirror partitions m's /status shows halted.
func haltedPartitions(t *testing.T, m *fleetMember) []string {
	t.Helper()
	st, err := m.status(t)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range st.Mirror.Partitions {
		if p.State == "halted" {
			out = append(out, fmt.Sprintf("%s[%d]: %s", p.Topic, p.Partition, p.Error))
		}
	}
	return out
}

// routingState is m's GET /status/routing.
func routingState(t *testing.T, m *fleetMember) routing.State {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + m.admin + "/status/routing")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st routing.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/status/routing: %s, %v", resp.Status, err)
	}
	return st
}
