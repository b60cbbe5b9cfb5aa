package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	adminapi "github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// A member of a fleet killed with SIGKILL under continuous traffic from the
// Java, librdkafka and kafka-python client programs' stream mode (franz-go
// is covered by cmd/ferry/fleet_kafka_test.go; confluent-kafka-go v2.6.1,
// whose librdkafka cannot follow the leader moves, is declared out by
// ignoresSameEpochLeader).

const (
	fleetSize       = 3
	fleetPartitions = 6
	// fleetRate is each producer's records per second.
	fleetRate = 100
	// fleetRecovery bounds how long after the kill every role must make
	// progress again: generous, for a busy 2-core machine.
	fleetRecovery = 60 * time.Second
	// fleetProgress is the progress a role must make on every partition
	// after the kill: acknowledgments, or records read among those
	// acknowledged after the kill.
	fleetProgress = 20
)

// freeGossipAddr is a loopback host:port free for TCP and UDP (memberlist
// binds both).
func freeGossipAddr(t *testing.T) string {
	t.Helper()
	addr, err := benchutil.FreeGossipAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startFerryFleet runs n `ferry serve` members seeded with each other and
// sharing a gossip key, and returns once every member lists all n alive.
// Each seat is handed to configure, if any, first.
func startFerryFleet(t *testing.T, bin string, primary, standby *kafkatest.Cluster, n int, configure ...func(*fleetSeat)) []*ferryServe {
	t.Helper()
	keyFile, err := benchutil.WriteGossipKey(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	seats := make([]*fleetSeat, n)
	var seeds []string
	for i := range seats {
		seats[i] = &fleetSeat{nodeID: int32(i), gossip: freeGossipAddr(t), keyFile: keyFile}
		seeds = append(seeds, seats[i].gossip)
	}
	var ms []*ferryServe
	for _, s := range seats {
		s.seeds = seeds
		for _, c := range configure {
			c(s)
		}
		ms = append(ms, startFerryMember(t, bin, primary, standby, s))
	}
	waitAlive(t, ms, nil, time.Minute)
	return ms
}

// fleetAddrs is the members' Kafka addresses, a client's bootstrap list.
func fleetAddrs(ms []*ferryServe) []string {
	addrs := make([]string, len(ms))
	for i, m := range ms {
		addrs[i] = m.addr
	}
	return addrs
}

// status reads the member's /status.
func (f *ferryServe) status() (adminapi.Status, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + f.admin + "/status")
	if err != nil {
		return adminapi.Status{}, err
	}
	defer resp.Body.Close()
	var st adminapi.Status
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/status: %s", resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// kill ends the member with SIGKILL and waits until it is gone.
func (f *ferryServe) kill(t *testing.T) {
	t.Helper()
	if err := f.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s: %v", f.name(), err)
	}
	<-f.exited
}

// waitAlive waits until every member of ms but dead lists exactly those
// members alive.
func waitAlive(t *testing.T, ms []*ferryServe, dead *ferryServe, timeout time.Duration) {
	t.Helper()
	var want []int32
	for _, m := range ms {
		if m != dead {
			want = append(want, m.seat.nodeID)
		}
	}
	testwait.Eventually(t, timeout, fmt.Sprintf("members listing %v alive", want), func() error {
		for _, m := range ms {
			if m == dead {
				continue
			}
			st, err := m.status()
			if got := st.Alive(); err != nil || !slices.Equal(got, want) {
				return fmt.Errorf("%s lists %v alive (%v)", m.name(), got, err)
			}
		}
		return nil
	})
}

// mirrorOwners is, from m's /status, the owner of every mirrored partition
// of topics.
func mirrorOwners(t *testing.T, m *ferryServe, topics []string) (map[string]map[int32]int32, adminapi.MirrorStatus, error) {
	t.Helper()
	st, err := m.status()
	owners := map[string]map[int32]int32{}
	for _, p := range st.Mirror.Partitions {
		if slices.Contains(topics, p.Topic) {
			if owners[p.Topic] == nil {
				owners[p.Topic] = map[int32]int32{}
			}
			owners[p.Topic][p.Partition] = p.Owner
		}
	}
	return owners, st.Mirror, err
}

// waitMirrorListed waits until m's /status lists every partition of topics
// with an owner for which ok holds, and returns the owners.
func waitMirrorListed(t *testing.T, m *ferryServe, topics []string, parts int, ok func(owner int32) bool, timeout time.Duration) map[string]map[int32]int32 {
	t.Helper()
	var owners map[string]map[int32]int32
	testwait.Eventually(t, timeout, fmt.Sprintf("%s's /status listing all %d partitions of %v with a fitting owner", m.name(), parts*len(topics), topics), func() error {
		var ms adminapi.MirrorStatus
		var err error
		owners, ms, err = mirrorOwners(t, m, topics)
		n := 0
		for _, ps := range owners {
			for _, o := range ps {
				if ok(o) {
					n++
				}
			}
		}
		if err != nil || n != parts*len(topics) {
			return fmt.Errorf("%d of %d: owners %v, summary %+v (%v)", n, parts*len(topics), owners, ms.Summary, err)
		}
		return nil
	})
	return owners
}

// TestFleetMemberKillClients runs the Java (classic and consumer group
// protocols), librdkafka (both too) and kafka-python (classic) programs'
// stream mode against a fleet
// of three `ferry serve` members, bootstrap listing all three, and kills
// with SIGKILL the member that leads and mirrors the most partitions. Per
// client:
//   - the idempotent producer acknowledges, and each consumer group reads
//     records acknowledged after the kill, on every partition, within
//     fleetRecovery of the kill; both go on once the dead member's mirror
//     partitions have moved to the survivors;
//   - no error the client calls fatal; the producer's record errors are
//     counted (logged);
//   - every acknowledged record is on the primary at its acknowledged
//     offset, each value once, each partition in the order sent;
//   - each group read every acknowledged record, and only what the primary
//     holds at the offsets it read;
//   - once a surviving member's /status has the mirror caught up, with
//     the dead member's partitions owned by the survivors, the standby
//     holds the primary's records at the same offsets.
func TestFleetMemberKillClients(t *testing.T) {
	if testing.Short() {
		t.Skip("conformance: real Kafka and client programs are not run in -short mode")
	}
	cls := clients(t)
	javaClasses(t)
	// The Java, librdkafka and kafka-python programs, each with every group
	// protocol it has (kafkajs is not run here); confluent-kafka-go is
	// declared unable to follow the leader moves a member's death makes
	// (ignoresSameEpochLeader), and is left out saying so.
	var families []*client
	for _, name := range []string{"java", "librdkafka", "kafka-python", "confluent-kafka-go"} {
		cl := clientNamed(t, cls, name)
		if cl.ignoresSameEpochLeader {
			t.Logf("%s not run: declared to keep a partition on its old leader when metadata names a new one with the same epoch (ignoresSameEpochLeader)", name)
			continue
		}
		families = append(families, cl)
	}
	begin := time.Now()
	bin, primary, standby := startPair(t, "fleet-primary", "fleet-standby")
	members := startFerryFleet(t, bin, primary, standby, fleetSize)
	addrs := fleetAddrs(members)
	bootstrap := strings.Join(addrs, ",")
	t.Logf("clusters, ferry binary and a fleet of %d members (%s) up in %v", fleetSize, bootstrap, time.Since(begin).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sfx := randomSuffix()
	viaFleet, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer viaFleet.Close()
	adm := kadm.NewClient(viaFleet)

	var window atomic.Int32 // 1 once the member is killed
	var procs []*streamProc
	var topics []string
	for _, fam := range families {
		topic := fmt.Sprintf("fleet-%s-%s", fam.name, sfx)
		resp, err := adm.CreateTopic(ctx, fleetPartitions, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating %s through the fleet: %v", topic, err)
		}
		topics = append(topics, topic)
		p := &streamProc{name: fam.name, window: &window, roles: map[string]*streamRole{}}
		p.addRole(&streamRole{name: "produce", kind: "produce", topic: topic})
		args := []string{"stream", "--bootstrap", bootstrap, "--partitions", strconv.Itoa(fleetPartitions),
			"--rate", strconv.Itoa(fleetRate), "--produce", topic}
		for _, proto := range fam.groupProtocols {
			r := &streamRole{name: proto, kind: "consume", topic: topic, group: fmt.Sprintf("fleet-%s-%s-%s", fam.name, proto, sfx)}
			p.addRole(r)
			args = append(args, "--consume", strings.Join([]string{r.name, r.topic, r.group, proto, "read_uncommitted"}, ":"))
		}
		p.cmd = fam.command(ctx, t, args...)
		procs = append(procs, p)
	}
	for _, p := range procs {
		p.start(t)
	}
	defer func() {
		for _, p := range procs {
			p.stdin.Close()
		}
		if t.Failed() {
			for _, p := range procs {
				p.mu.Lock()
				t.Logf("%s stderr:\n%s\nunexpected lines: %q", p.name, tail(p.stderr.String(), 3000), p.bad[:min(5, len(p.bad))])
				p.mu.Unlock()
			}
		}
	}()

	start := time.Now()
	waitStreams(t, procs, 90*time.Second, true, "every role under way", func(r *streamRole) string {
		switch {
		case r.kind == "produce" && len(r.acks) < 200:
			return fmt.Sprintf("%d acks", len(r.acks))
		case r.kind == "consume" && len(r.recs) < 100:
			return fmt.Sprintf("%d records read", len(r.recs))
		}
		return ""
	})
	t.Logf("every role under way: %v", time.Since(start).Round(time.Millisecond))

	// The victim: the member that leads, and mirrors, the most partitions
	// of the topics, so that its death moves both.
	owners := waitMirrorListed(t, members[0], topics, fleetPartitions, func(int32) bool { return true }, time.Minute)
	md, err := adm.Metadata(ctx, topics...)
	if err != nil {
		t.Fatal(err)
	}
	memberOf := map[int32]int32{} // virtual broker → member node ID
	for _, b := range md.Brokers {
		for _, m := range members {
			if _, port, _ := net.SplitHostPort(m.addr); port == strconv.Itoa(int(b.Port)) {
				memberOf[b.NodeID] = m.seat.nodeID
			}
		}
	}
	leads, mirrors := map[int32]int{}, map[int32]int{}
	for _, tp := range topics {
		for _, p := range md.Topics[tp].Partitions {
			leader, ok := memberOf[p.Leader]
			if !ok {
				t.Fatalf("%s[%d]: leader %d is no member's broker (brokers %v)", tp, p.Partition, p.Leader, md.Brokers)
			}
			leads[leader]++
		}
		for _, o := range owners[tp] {
			mirrors[o]++
		}
	}
	var groups []string
	for _, p := range procs {
		for _, r := range p.roles {
			if r.kind == "consume" {
				groups = append(groups, r.group)
			}
		}
	}
	coords := map[int32]int{}
	for g, c := range adm.FindGroupCoordinators(ctx, groups...) {
		m, ok := memberOf[c.NodeID]
		if c.Err != nil || !ok {
			t.Fatalf("coordinator of %s through the fleet: %d (%v), brokers %v", g, c.NodeID, c.Err, md.Brokers)
		}
		coords[m]++
	}
	// Rendezvous hashing of random names: a member that leads, mirrors
	// and coordinates something all but always exists; the most
	// coordinating one among those is taken.
	score := func(id int32) []int {
		all := 0
		if leads[id] > 0 && mirrors[id] > 0 && coords[id] > 0 {
			all = 1
		}
		return []int{all, coords[id], leads[id] + mirrors[id]}
	}
	var victim *ferryServe
	for _, m := range members {
		if victim == nil || slices.Compare(score(m.seat.nodeID), score(victim.seat.nodeID)) > 0 {
			victim = m
		}
	}
	if mirrors[victim.seat.nodeID] == 0 {
		t.Fatalf("no member mirrors a partition: mirror writers by member %v", mirrors)
	}
	survivor := members[0]
	if survivor == victim {
		survivor = members[1]
	}
	var lost []string // the victim's mirror partitions
	for _, tp := range topics {
		for p, o := range owners[tp] {
			if o == victim.seat.nodeID {
				lost = append(lost, fmt.Sprintf("%s[%d]", tp, p))
			}
		}
	}
	sort.Strings(lost)
	t.Logf("partition leaders by member %v, mirror writers by member %v, group coordinators by member %v; killing member %d",
		leads, mirrors, coords, victim.seat.nodeID)

	// kill -9, then every role must make progress on every partition.
	victim.kill(t)
	killed := time.Now()
	window.Store(1)
	gone := make(chan time.Duration, 1)
	go func() {
		// When the survivors stop listing the victim alive, for the log.
		want := []int32{}
		for _, m := range members {
			if m != victim {
				want = append(want, m.seat.nodeID)
			}
		}
		for time.Since(killed) < 2*fleetRecovery {
			st, err := survivor.status()
			if err == nil && slices.Equal(st.Alive(), want) {
				gone <- time.Since(killed)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		gone <- -1
	}()
	recovered := map[string]time.Duration{}
	waitStreams(t, procs, fleetRecovery, false, "every role making progress on every partition after the kill", func(r *streamRole) string {
		if _, ok := recovered[r.label()]; ok {
			return ""
		}
		per := map[int32]int{}
		switch r.kind {
		case "produce":
			for _, e := range r.acks {
				if e.window >= 1 {
					per[e.Partition]++
				}
			}
		case "consume":
			// Records read that the producer acknowledged after the kill.
			after := map[string]bool{}
			for _, e := range procsRole(procs, r.client, false).acks {
				if e.window >= 1 {
					after[e.Value] = true
				}
			}
			for _, e := range r.recs {
				if after[e.Value] {
					per[e.Partition]++
				}
			}
		}
		var short []string
		for p := range int32(fleetPartitions) {
			if per[p] < fleetProgress {
				short = append(short, fmt.Sprintf("p%d:%d", p, per[p]))
			}
		}
		if len(short) > 0 {
			return "short on " + strings.Join(short, " ")
		}
		recovered[r.label()] = time.Since(killed)
		return ""
	})
	var took []string
	for _, p := range procs {
		for _, name := range p.order {
			if d, ok := recovered[p.name+"/"+name]; ok {
				took = append(took, fmt.Sprintf("%s %v", p.name+"/"+name, d.Round(time.Millisecond)))
			}
		}
	}
	t.Logf("after kill -9 of member %d, %d acknowledged or read on every partition within: %s",
		victim.seat.nodeID, fleetProgress, strings.Join(took, ", "))

	// The victim's mirror partitions move to the survivors.
	waitMirrorListed(t, survivor, topics, fleetPartitions, func(o int32) bool { return o != victim.seat.nodeID }, fleetRecovery)
	moved, _, _ := mirrorOwners(t, survivor, topics)
	var now []string
	for _, l := range lost {
		tp, p, _ := strings.Cut(strings.TrimSuffix(l, "]"), "[")
		n, _ := strconv.Atoi(p)
		now = append(now, fmt.Sprintf("%s→%d", l, moved[tp][int32(n)]))
	}
	t.Logf("the victim's mirror partitions, %v after the kill: %s", time.Since(killed).Round(time.Millisecond), strings.Join(now, " "))
	// The clients go on, and the records the survivors mirror now are
	// checked on the standby below.
	window.Store(2)
	start = time.Now()
	waitStreams(t, procs, fleetRecovery, false, "every role going on after the mirror moved", func(r *streamRole) string {
		switch {
		case r.kind == "produce" && countFrom(r.acks, 2) < 200:
			return fmt.Sprintf("%d acks", countFrom(r.acks, 2))
		case r.kind == "consume" && countFrom(r.recs, 2) < 100:
			return fmt.Sprintf("%d records read", countFrom(r.recs, 2))
		}
		return ""
	})
	t.Logf("every role going on after the mirror moved: %v", time.Since(start).Round(time.Millisecond))
	if d := <-gone; d >= 0 {
		t.Logf("member %d's survivors stopped listing it alive %v after the kill", victim.seat.nodeID, d.Round(time.Millisecond))
	} else {
		t.Errorf("member %s still lists member %d alive %v after its kill", survivor.name(), victim.seat.nodeID, 2*fleetRecovery)
	}

	// Stop the producers, then the consumers once they have read every
	// record acknowledged.
	for _, p := range procs {
		p.stop(t, "produce")
	}
	waitStreams(t, procs, 90*time.Second, true, "producers done", func(r *streamRole) string {
		if r.kind == "produce" && !r.done {
			return "not done"
		}
		return ""
	})
	stopped := time.Now()
	waitStreams(t, procs, 90*time.Second, false, "consumers caught up", func(r *streamRole) string {
		if r.kind != "consume" {
			return ""
		}
		read := distinct(r.recs)
		missing := 0
		for at := range expected(procsRole(procs, r.client, false)) {
			if _, ok := read[at]; !ok {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Sprintf("%d acknowledged records still to read", missing)
		}
		return ""
	})
	stopStreams(t, procs)

	onPrimary := readCommitted(t, ctx, primary, topics)
	for _, p := range procs {
		prod := p.roles["produce"]
		checkKillProduced(t, prod, onPrimary[prod.topic])
		for _, name := range p.order {
			if r := p.roles[name]; r.kind == "consume" {
				checkKillConsumed(t, r, expected(prod), onPrimary[r.topic])
			}
		}
	}

	// The mirror, the victim's partitions now written by the survivors:
	// caught up with the primary's end offsets, then the standby holds
	// the primary's records at the same offsets.
	waitFleetMirrored(t, ctx, survivor, victim.seat.nodeID, primary, topics, 2*time.Minute)
	onStandby := readCommitted(t, ctx, standby, topics)
	for _, tp := range topics {
		checkSame(t, tp, onPrimary[tp], onStandby[tp])
	}
	pe, se := endOffsets(t, ctx, primary, topics), endOffsets(t, ctx, standby, topics)
	if !equalEnds(pe, se) {
		t.Errorf("end offsets: primary %v, standby %v", pe, se)
	}
	n := 0
	for _, tp := range topics {
		n += len(onStandby[tp])
	}
	t.Logf("the mirror caught up (within %v of the producers' end); the standby holds the primary's %d records at the same offsets",
		time.Since(stopped).Round(time.Millisecond), n)
	reportStreams(t, procs, nil)
	t.Logf("total %v", time.Since(begin).Round(time.Millisecond))
}

// checkKillProduced: every acknowledged record on the primary at its
// offset, once; each partition in the order sent. Record errors the client
// reported are logged, not failed: what the client was told failed is not
// acknowledged (a fatal error fails the test in waitStreams).
func checkKillProduced(t *testing.T, r *streamRole, on map[partOff]string) {
	t.Helper()
	codes := map[string]int{}
	for _, e := range r.errs {
		codes[e.Code]++
	}
	checkNoFatal(t, r)
	if len(r.errs) > 0 {
		t.Logf("%s: %d record errors reported by the client: %v; first: %s", r.label(), len(r.errs), codes, head(r.errs[0].Error, 300))
	}
	acked := distinct(r.acks)
	if len(acked) != len(r.acks) {
		t.Errorf("%s: %d acknowledgments for %d offsets", r.label(), len(r.acks), len(acked))
	}
	bad := 0
	for at, v := range acked {
		if got, ok := on[at]; !ok || got != v {
			if bad++; bad <= 3 {
				t.Errorf("%s: acknowledged %s at %d/%d; the primary holds %q there", r.label(), v, at.p, at.o, got)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d acknowledged records not on the primary at their offsets", r.label(), bad, len(acked))
	}
	where := map[string][]partOff{}
	for at, v := range on {
		where[v] = append(where[v], at)
	}
	dup := 0
	for v, ats := range where {
		if len(ats) > 1 {
			if dup++; dup <= 3 {
				t.Errorf("%s: %q is on the primary %d times: %v", r.label(), v, len(ats), ats)
			}
		}
	}
	if extra := len(on) - len(acked); extra != 0 {
		t.Logf("%s: %d records on the primary, %d acknowledged", r.label(), len(on), len(acked))
	}
	checkOrder(t, r.label(), on)
}

// checkNoFatal: no error the client called fatal, to the end (waitStreams
// sees those while it waits).
func checkNoFatal(t *testing.T, r *streamRole) {
	t.Helper()
	for _, e := range r.errs {
		if e.Fatal {
			t.Errorf("%s: fatal error (window %d): %s %s", r.label(), e.window, e.Code, head(e.Error, 500))
		}
	}
}

// checkKillConsumed: every acknowledged record read, and every record read
// is what the primary holds at its offset.
func checkKillConsumed(t *testing.T, r *streamRole, want, on map[partOff]string) {
	t.Helper()
	checkNoFatal(t, r)
	read := map[partOff]string{}
	wrong := 0
	for _, e := range r.recs {
		at := partOff{e.Partition, e.Offset}
		if got, ok := on[at]; !ok || got != e.Value {
			if wrong++; wrong <= 3 {
				t.Errorf("%s: read %q at %d/%d; the primary holds %q there", r.label(), e.Value, at.p, at.o, got)
			}
		}
		read[at] = e.Value
	}
	missing := 0
	for at, v := range want {
		if got, ok := read[at]; !ok || got != v {
			if missing++; missing <= 3 {
				t.Errorf("%s: did not read %q at %d/%d (read %q)", r.label(), v, at.p, at.o, got)
			}
		}
	}
	if missing > 0 {
		t.Errorf("%s: %d of %d acknowledged records not read", r.label(), missing, len(want))
	}
}

// waitFleetMirrored polls m's /status until the fleet's mirror has every
// partition of topics listed, owned by a member other than dead, none
// halted, all caught up, each at the source's end offset as read on the
// primary.
func waitFleetMirrored(t *testing.T, ctx context.Context, m *ferryServe, dead int32, primary *kafkatest.Cluster, topics []string, timeout time.Duration) {
	t.Helper()
	ends := endOffsets(t, ctx, primary, topics)
	testwait.Eventually(t, timeout, fmt.Sprintf("%s's /status: the mirror caught up with the primary", m.name()), func() error {
		st, err := m.status()
		if err != nil {
			return err
		}
		var wrong []string
		n := 0
		for _, p := range st.Mirror.Partitions {
			if !slices.Contains(topics, p.Topic) {
				continue
			}
			n++
			switch {
			case p.State == "halted":
				t.Fatalf("%s[%d] halted on member %d: %s %s", p.Topic, p.Partition, p.Owner, p.HaltReason, p.Error)
			case p.Owner == dead:
				wrong = append(wrong, fmt.Sprintf("%s[%d] owned by the dead member", p.Topic, p.Partition))
			case p.MirroredOffset != ends[p.Topic][p.Partition]:
				wrong = append(wrong, fmt.Sprintf("%s[%d] %s mirrored to %d of %d", p.Topic, p.Partition, p.State, p.MirroredOffset, ends[p.Topic][p.Partition]))
			}
		}
		if n != len(topics)*fleetPartitions {
			wrong = append(wrong, fmt.Sprintf("%d partitions listed", n))
		}
		if len(wrong) != 0 || !st.Mirror.Summary.AllCaughtUp {
			return fmt.Errorf("all_caught_up %v; %s", st.Mirror.Summary.AllCaughtUp, strings.Join(wrong, "; "))
		}
		return nil
	})
}

// endOffsets is each partition's end offset of topics on a cluster.
func endOffsets(t *testing.T, ctx context.Context, c *kafkatest.Cluster, topics []string) map[string]map[int32]int64 {
	t.Helper()
	ends, err := admin(t, c).ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if out[o.Topic] == nil {
			out[o.Topic] = map[int32]int64{}
		}
		out[o.Topic][o.Partition] = o.Offset
	})
	return out
}

func equalEnds(a, b map[string]map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for tp, ps := range a {
		if len(ps) != len(b[tp]) {
			return false
		}
		for p, o := range ps {
			if b[tp][p] != o {
				return false
			}
		}
	}
	return true
}

// checkSame: the standby holds the primary's records of topic at the same
// offsets, and nothing else.
func checkSame(t *testing.T, topic string, primary, standby map[partOff]string) {
	t.Helper()
	bad := 0
	for at, v := range primary {
		if got, ok := standby[at]; !ok || got != v {
			if bad++; bad <= 3 {
				t.Errorf("%s: the primary holds %q at %d/%d, the standby %q", topic, v, at.p, at.o, got)
			}
		}
	}
	for at, v := range standby {
		if _, ok := primary[at]; !ok {
			if bad++; bad <= 6 {
				t.Errorf("%s: the standby holds %q at %d/%d, the primary nothing", topic, v, at.p, at.o)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d differences between the primary (%d records) and the standby (%d)", topic, bad, len(primary), len(standby))
	}
}
