package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// overlapWatch samples the members' writers every few milliseconds and
// records an error when a partition's writer runs on two members at once
// for longer than the handover: the member that owns it (under the
// ownership read in the same sample) may list it next to the loser's only
// while its own writer is still starting — taking ownership waits a whole
// fence period (fence.go) before it touches the standby, and the loser's writer
// must be gone by then.
type overlapWatch struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	err     error
	samples int
	overlap int // samples with a partition listed on both members
}

func watchOverlap(sb *switchboard, ms []*Mirror, topic string) *overlapWatch {
	w := &overlapWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			// The ownership cannot change during the sample.
			sb.mu.Lock()
			owner := sb.owner
			sts := make([]map[int32]PartitionStatus, len(ms))
			for i, m := range ms {
				sts[i] = make(map[int32]PartitionStatus)
				for _, st := range m.Status() {
					if st.Topic == topic {
						sts[i][st.Partition] = st
					}
				}
			}
			sb.mu.Unlock()
			w.mu.Lock()
			w.samples++
			for p, st0 := range sts[0] {
				st1, both := sts[1][p]
				if !both {
					continue
				}
				w.overlap++
				st := []PartitionStatus{st0, st1}[owner(topic, p)]
				if st.State != StateStarting && w.err == nil {
					w.err = fmt.Errorf("partition %d: writers on both members, and the owner's is %v already (%+v, %+v)", p, st.State, st0, st1)
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *overlapWatch) finish(t *testing.T) {
	t.Helper()
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("%d samples, %d with a partition on both members (its handover)", w.samples, w.overlap)
	if w.err != nil {
		t.Error(w.err)
	}
}

// mirroringAll waits until every partition of topic has a writer that got
// past its start (mirroring or caught up) on the member that owns it.
func mirroringAll(t *testing.T, sb *switchboard, ms []*Mirror, topic string, partitions int32) {
	t.Helper()
	testwait.Eventually(t, time.Minute, "every partition mirroring on its owner", func() error {
		sb.mu.Lock()
		owner := sb.owner
		sb.mu.Unlock()
		for p := range partitions {
			m := ms[owner(topic, p)]
			var st *PartitionStatus
			for _, s := range m.Status() {
				if s.Topic == topic && s.Partition == p {
					st = &s
				}
			}
			if st == nil || (st.State != StateMirroring && st.State != StateCaughtUp) || st.Mirrored <= 0 {
				return fmt.Errorf("partition %d: %+v", p, st)
			}
		}
		return nil
	})
}

// noMemberHalted fails the test if a member has a halted writer or ever
// counted a halt.
func noMemberHalted(t *testing.T, ms []*Mirror, regs []*prometheus.Registry) {
	t.Helper()
	for i, m := range ms {
		noHalts(t, m)
		if n := metricValue(t, regs[i], "ferry_mirror_halts_total"); n != 0 {
			t.Errorf("member %d: ferry_mirror_halts_total %v", i, n)
		}
	}
}

// ownershipMirror runs member id of sb over topic.
func ownershipMirror(t *testing.T, topic string, sb *switchboard, id int, reg prometheus.Registerer) *Mirror {
	return startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false), WithOwnership(sb.member(id)), Registerer(reg),
		Logger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named(fmt.Sprintf("member%d", id))))
}

// TestMirrorOwnershipHandover: two members share the partitions of a
// 4-partition topic by parity while idempotent, plain and transactional
// producers write to it; the parity (and the syncing member) is flipped
// four times. Each flip moves every writer, at once on both members, and
// at no sample does a partition's writer run on both beyond its handover.
// Afterwards Drain and WaitCaughtUp, on one member, judge all partitions
// (half of them written by the other), the standby holds the source's
// batches at the same offsets, and nothing halted.
func TestMirrorOwnershipHandover(t *testing.T) {
	a, _ := clusters(t)
	const topic, parts = "own-flip", 4
	createTopic(t, a, topic, parts, nil)
	sb := newSwitchboard(byParity(0), 0)
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	ms := []*Mirror{ownershipMirror(t, topic, sb, 0, regs[0]), ownershipMirror(t, topic, sb, 1, regs[1])}
	stop := make(chan struct{})
	wg := pacedProducer(t, topic, parts, stop, 5*time.Millisecond)
	twg := pacedTxnProducer(t, topic, stop, 50*time.Millisecond) // partition 0
	watch := watchOverlap(sb, ms, topic)

	mirroringAll(t, sb, ms, topic, parts)
	for flip := 1; flip <= 4; flip++ {
		sb.set(byParity(flip), flip%2)
		even, odd := []int32{0, 2}, []int32{1, 3}
		want := [][]int32{even, odd}
		if flip%2 == 1 {
			want = [][]int32{odd, even}
		}
		n := float64(2 * flip)
		wantOwned(t, 30*time.Second, topic, ms, regs, want, [][2]float64{{n, n}, {n, n}})
		mirroringAll(t, sb, ms, topic, parts)
	}
	close(stop)
	wg.Wait()
	twg.Wait()
	watch.finish(t)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	if err := ms[1].Drain(ctx); err != nil {
		t.Fatalf("Drain on member 1: %v", err)
	}
	t.Logf("drain %v", time.Since(t0))
	if err := ms[0].WaitCaughtUp(ctx, topic); err != nil {
		t.Fatalf("WaitCaughtUp on member 0: %v", err)
	}
	t.Logf("caught up %v", time.Since(t0))
	defer func() { t.Logf("compared %v", time.Since(t0)) }()
	// Byte-equal batches at the same offsets, markers of the same type
	// there, on every partition; read through consumers (both isolation
	// levels, values and offsets) on the transactional partition and one
	// other, which is what takes the time.
	for p := range int32(parts) {
		sameBatches(t, topic, p)
	}
	sameRecords(t, topic, 0)
	sameRecords(t, topic, 1)
	noMemberHalted(t, ms, regs)
}

// TestMirrorOwnershipDeadMember: the member writing partitions 0 and 2
// (partition 0 with source transactions) is closed mid-stream, as a member
// that dies, and its partitions are given to the other: they resume there
// at the standby's end, and the standby ends with the source's batches at
// the same offsets.
func TestMirrorOwnershipDeadMember(t *testing.T) {
	a, _ := clusters(t)
	const topic, parts = "own-dead", 4
	createTopic(t, a, topic, parts, nil)
	sb := newSwitchboard(byParity(0), 1)
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	ms := []*Mirror{ownershipMirror(t, topic, sb, 0, regs[0]), ownershipMirror(t, topic, sb, 1, regs[1])}
	stop := make(chan struct{})
	wg := pacedProducer(t, topic, parts, stop, 5*time.Millisecond)
	twg := pacedTxnProducer(t, topic, stop, 50*time.Millisecond)
	mirroringAll(t, sb, ms, topic, parts)
	time.Sleep(time.Second) // more records, and transactions, in flight

	ms[0].Close()
	sb.set(allTo(1), 1)
	testwait.Eventually(t, 30*time.Second, "member 1 writing every partition", func() error {
		if got := localPartitions(ms[1], topic); !slices.Equal(got, []int32{0, 1, 2, 3}) {
			return fmt.Errorf("member 1 writes %v", got)
		}
		return nil
	})
	mirroringAll(t, sb, ms, topic, parts)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	twg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ms[1].WaitCaughtUp(ctx, topic); err != nil {
		t.Fatalf("WaitCaughtUp: %v", err)
	}
	for p := range int32(parts) {
		sameBatches(t, topic, p)
		sameRecords(t, topic, p)
	}
	noMemberHalted(t, ms[1:], regs[1:])
	if g := metricValue(t, regs[1], "ferry_mirror_handovers_total", "direction", "gained"); g != 2 {
		t.Errorf("member 1 counted %v partitions gained, want 2", g)
	}
}

// newMirror returns a Mirror that is not Run: the test drives its sync
// rounds (syncOnce).
func newMirror(t *testing.T, opts ...Option) *Mirror {
	t.Helper()
	a, s := clusters(t)
	m, err := New(append([]Option{Source(a.Bootstrap()), Target(s.Bootstrap()), FetchMaxWait(100 * time.Millisecond),
		Logger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestMirrorOwnershipSyncSplit: a member that does not sync writes nothing
// on the standby but through its writers — no topic, config, group offset
// or ACL — and starts its writers once the syncing member has created the
// topic. The syncing member, which owns no partition, copies group offsets
// clamped to the standby's end, and its WaitCaughtUp sees the other's
// writers catch up.
func TestMirrorOwnershipSyncSplit(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic, group, principal = "own-sync", "os-g", "User:own-sync"
	createTopic(t, a, topic, 2, map[string]*string{"retention.ms": kadm.StringPtr("123456789")})
	cl := newClient(t, a, manualPartitioner())
	for p := range int32(2) {
		produceN(t, cl, topic, p, 20, 5, "sync")
	}
	srcAdm := kadm.NewClient(cl)
	var o kadm.Offsets
	o.AddOffset(topic, 0, 15, -1)
	o.AddOffset(topic, 1, 1000, -1) // beyond the end: clamped to 20
	if resp, err := srcAdm.CommitOffsets(ctx, group, o); err != nil || resp.Error() != nil {
		t.Fatalf("commit on the source: %v %v", err, resp.Error())
	}
	acl := kadm.NewACLs().Allow(principal).AllowHosts().Topics(topic).Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral)
	if res, err := srcAdm.CreateACLs(ctx, acl); err != nil || res[0].Err != nil {
		t.Fatalf("creating ACL: %v %+v", err, res)
	}
	dstAdm := kadm.NewClient(newClient(t, s))
	standbyHas := func() (topicOK bool, offsets kadm.OffsetResponses, acls int) {
		td, err := listTopics(ctx, newClient(t, s))
		if err != nil {
			t.Fatal(err)
		}
		_, topicOK = td[topic]
		// The standby's group coordinator may not be up yet: no group
		// was used there before.
		for {
			offsets, err = dstAdm.FetchOffsets(ctx, group)
			if !errors.Is(err, kerr.CoordinatorNotAvailable) && !errors.Is(err, kerr.CoordinatorLoadInProgress) {
				break
			}
			if err := sleep(ctx, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		res, err := dstAdm.DescribeACLs(ctx, kadm.NewACLs().Allow(principal).AllowHosts().Topics(topic).Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternLiteral))
		if err == nil && len(res) > 0 && res[0].Err == nil {
			acls = len(res[0].Described)
		}
		return
	}

	sb := newSwitchboard(allTo(1), 0)
	opts := []Option{Topics([]string{topic}, nil), Groups([]string{"os-.*"}, nil)}
	writer := newMirror(t, append(opts, WithOwnership(sb.member(1)))...)
	syncer := newMirror(t, append(opts, WithOwnership(sb.member(0)))...)

	writer.syncOnce(ctx)
	if ok, offs, acls := standbyHas(); ok || len(offs) > 0 || acls > 0 {
		t.Fatalf("after a round of the member that does not sync, the standby has: topic %v, group offsets %v, ACLs %d", ok, offs, acls)
	}
	if st := writer.Status(); len(st) != 0 {
		t.Fatalf("writers before the standby topic exists: %+v", st)
	}

	syncer.syncOnce(ctx)
	if ok, _, acls := standbyHas(); !ok || acls == 0 {
		t.Fatalf("after a round of the syncing member: topic %v, ACLs %d", ok, acls)
	}
	if got := topicConfig(ctx, s, t, topic, "retention.ms"); got != "123456789" {
		t.Fatalf("standby retention.ms %q", got)
	}
	if st := syncer.Status(); len(st) != 0 {
		t.Fatalf("the syncing member owns nothing, yet writes %+v", st)
	}

	writer.syncOnce(ctx)
	if got := localPartitions(writer, topic); !slices.Equal(got, []int32{0, 1}) {
		t.Fatalf("the member that owns both partitions writes %v", got)
	}
	if err := syncer.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatalf("WaitCaughtUp on the member with no writer: %v", err)
	}
	if err := syncer.SyncGroups(ctx); err != nil {
		t.Fatalf("SyncGroups: %v", err)
	}
	_, offs, _ := standbyHas()
	p0, _ := offs.Lookup(topic, 0)
	p1, _ := offs.Lookup(topic, 1)
	if p0.At != 15 || p1.At != 20 {
		t.Fatalf("group offsets on the standby %d and %d, want 15 and 20 (clamped to the standby's end)", p0.At, p1.At)
	}

	// Config changes are carried by the syncing member only.
	if _, err := srcAdm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: kadm.StringPtr("987654321")}}, topic); err != nil {
		t.Fatal(err)
	}
	writer.syncOnce(ctx)
	if got := topicConfig(ctx, s, t, topic, "retention.ms"); got != "123456789" {
		t.Fatalf("the member that does not sync changed retention.ms to %q", got)
	}
	testwait.Eventually(t, 30*time.Second, "the syncing member carrying the config change", func() error {
		syncer.syncOnce(ctx)
		if got := topicConfig(ctx, s, t, topic, "retention.ms"); got != "987654321" {
			return fmt.Errorf("standby retention.ms %q", got)
		}
		return nil
	})
	if err := writer.localHalt(func(topicPartition) bool { return true }); err != nil {
		t.Fatal(err)
	}
	sameRecords(t, topic, 0)
	sameRecords(t, topic, 1)
}

// TestMirrorOwnershipViewsDisagree: member 1 learns that it owns the
// partition before member 0 learns that it lost it, as members whose
// views of the ownership meet at different times. Member 1's writer fences
// member 0's, which is not halted (it is starting again, with ErrFenced)
// and stops once member 0 learns; the standby equals the source.
func TestMirrorOwnershipViewsDisagree(t *testing.T) {
	a, _ := clusters(t)
	const topic = "own-views"
	createTopic(t, a, topic, 1, nil)
	views := []*switchboard{newSwitchboard(allTo(0), 0), newSwitchboard(allTo(0), 0)}
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	ms := []*Mirror{ownershipMirror(t, topic, views[0], 0, regs[0]), ownershipMirror(t, topic, views[1], 1, regs[1])}
	stop := make(chan struct{})
	wg := backgroundProducer(t, topic, 1, stop)
	mirroringAll(t, views[0], ms, topic, 1)

	views[1].set(allTo(1), 1)
	testwait.Eventually(t, 30*time.Second, "member 0's writer fenced, not halted", func() error {
		st := ms[0].Status()
		if len(st) != 1 {
			return fmt.Errorf("member 0: %+v", st)
		}
		if st[0].State == StateHalted {
			t.Fatalf("member 0's writer halted: %v", st[0].Err)
		}
		if !errors.Is(st[0].Err, ErrFenced) || st[0].State != StateStarting {
			return fmt.Errorf("member 0: %v %v", st[0].State, st[0].Err)
		}
		return nil
	})
	views[0].set(allTo(1), 1)
	mirroringAll(t, views[1], ms, topic, 1)
	if st := ms[0].Status(); len(st) != 0 {
		t.Fatalf("member 0 still writes %+v", st)
	}
	close(stop)
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ms[1].WaitCaughtUp(ctx, topic); err != nil {
		t.Fatalf("WaitCaughtUp: %v", err)
	}
	sameBatches(t, topic, 0)
	sameRecords(t, topic, 0)
	noMemberHalted(t, ms, regs)
}
