package mirror

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestMirrorGroupActiveOnStandby: the group offset sync leaves alone a
// group that has members on the standby (they own its offsets there), and
// keeps copying the offsets of a group that has none.
func TestMirrorGroupActiveOnStandby(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic = "grp-active"
	createTopic(t, a, topic, 1, nil)
	cl := newClient(t, a, manualPartitioner())
	produceN(t, cl, topic, 0, 10, 5, "grp")
	m := startMirror(t, Topics([]string{topic}, nil), Groups([]string{"ga-.*"}, nil), SyncACLs(false))
	waitCaughtUp(t, m, topic)

	// A member of ga-active on the standby, committing offset 3 itself.
	member := newClient(t, s, kgo.ConsumerGroup("ga-active"), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	testwait.Eventually(t, 30*time.Second, "member consuming on the standby", func() error {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		if fs := member.PollFetches(pctx); fs.NumRecords() == 0 {
			return errors.New("no records yet")
		}
		return nil
	})
	mine := map[string]map[int32]kgo.EpochOffset{topic: {0: {Epoch: -1, Offset: 3}}}
	var commitErr error
	member.CommitOffsetsSync(ctx, mine, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, r *kmsg.OffsetCommitResponse, err error) {
		commitErr = err
		for _, rt := range r.Topics {
			for _, rp := range rt.Partitions {
				if rp.ErrorCode != 0 && commitErr == nil {
					commitErr = fmt.Errorf("commit error code %d", rp.ErrorCode)
				}
			}
		}
	})
	if commitErr != nil {
		t.Fatalf("member commit on the standby: %v", commitErr)
	}

	// The source commits other offsets for both groups.
	srcAdm := kadm.NewClient(cl)
	for g, at := range map[string]int64{"ga-active": 8, "ga-idle": 6} {
		var o kadm.Offsets
		o.AddOffset(topic, 0, at, -1)
		if resp, err := srcAdm.CommitOffsets(ctx, g, o); err != nil || resp.Error() != nil {
			t.Fatalf("commit %s on the source: %v %v", g, err, resp.Error())
		}
	}
	// A sync round, run here so that its end is seen (rounds also run in
	// the background): it copies ga-idle's offsets and leaves ga-active
	// alone. Copying to ga-active would fail the round (the standby
	// refuses a commit from outside a group with members) or move its
	// offset.
	if err := m.syncGroups(ctx, false); err != nil {
		t.Fatalf("group sync round: %v", err)
	}
	dstAdm := kadm.NewClient(newClient(t, s))
	for g, want := range map[string]int64{"ga-idle": 6, "ga-active": 3} {
		got, err := dstAdm.FetchOffsets(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		if o, _ := got.Lookup(topic, 0); o.At != want {
			t.Fatalf("%s's offset on the standby is %d after a sync round, want %d (ga-idle: the source's; ga-active: its member's)", g, o.At, want)
		}
	}
	dg, err := dstAdm.DescribeGroups(ctx, "ga-active")
	if err != nil {
		t.Fatal(err)
	}
	if g := dg["ga-active"]; len(g.Members) == 0 {
		t.Fatalf("ga-active has no member on the standby (state %s): the test did not test an active group", g.State)
	}
}

// TestEvictByHeartbeat: the shared eviction loop counts the members it
// removed, takes a member the group no longer knows as gone and a group
// the standby does not know as empty, and stops at the first failure,
// naming its member.
func TestEvictByHeartbeat(t *testing.T) {
	type group struct {
		code    int16
		members []string
	}
	var sent []string
	members := func(g group) (int16, []string) { return g.code, g.members }
	leave := func(codes map[string]int16) func(string) (string, int16, error) {
		return func(id string) (string, int16, error) {
			sent = append(sent, id)
			if id == "down" {
				return id, 0, errors.New("connection refused")
			}
			return id, codes[id], nil
		}
	}
	codes := map[string]int16{"gone": kerr.UnknownMemberID.Code, "fenced": kerr.FencedMemberEpoch.Code}

	n, err := evictByHeartbeat([]group{{members: []string{"a", "gone", "b"}}}, members, leave(codes))
	if n != 3 || err != nil || !slices.Equal(sent, []string{"a", "gone", "b"}) {
		t.Errorf("evicting a, gone, b: %d, %v, sent %v", n, err, sent)
	}
	sent = nil
	if n, err := evictByHeartbeat([]group{{code: kerr.GroupIDNotFound.Code}}, members, leave(codes)); n != 0 || err != nil || sent != nil {
		t.Errorf("a group the standby does not know: %d, %v, sent %v", n, err, sent)
	}
	if n, err := evictByHeartbeat([]group{{code: kerr.CoordinatorNotAvailable.Code}}, members, leave(codes)); n != 0 || !errors.Is(err, kerr.CoordinatorNotAvailable) {
		t.Errorf("a group's describe failing: %d, %v", n, err)
	}
	n, err = evictByHeartbeat([]group{{members: []string{"a", "fenced", "b"}}}, members, leave(codes))
	if n != 1 || !errors.Is(err, kerr.FencedMemberEpoch) || !strings.Contains(err.Error(), "member fenced") || !slices.Equal(sent, []string{"a", "fenced"}) {
		t.Errorf("a heartbeat answered with an error: %d, %v, sent %v", n, err, sent)
	}
	sent = nil
	if n, err := evictByHeartbeat([]group{{members: []string{"a", "down", "b"}}}, members, leave(codes)); n != 1 || err == nil || !slices.Equal(sent, []string{"a", "down"}) {
		t.Errorf("a heartbeat failing: %d, %v, sent %v", n, err, sent)
	}
}

// TestMirrorSyncGroupsEvictsConsumerMembers: the switch's group sync
// (SyncGroups) copies a group's offsets over members left on the standby
// from before an earlier switch, here a KIP-848 consumer group's member
// (the standby refuses the copy while the group has one, and LeaveGroup
// does not remove it).
func TestMirrorSyncGroupsEvictsConsumerMembers(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic, group = "grp-848", "ge-848"
	createTopic(t, a, topic, 1, nil)
	cl := newClient(t, a, manualPartitioner())
	produceN(t, cl, topic, 0, 10, 5, "grp")
	m := startMirror(t, Topics([]string{topic}, nil), Groups([]string{"ge-.*"}, nil), SyncACLs(false))
	waitCaughtUp(t, m, topic)

	member := newClient(t, s, kgo.ConsumerGroup(group), kgo.ServerSideBalancer(), kgo.Balancers(kgo.RangeBalancer()), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	testwait.Eventually(t, 30*time.Second, "KIP-848 member consuming on the standby", func() error {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		if fs := member.PollFetches(pctx); fs.NumRecords() == 0 {
			return errors.New("no records yet")
		}
		return nil
	})
	if err := member.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("member commit on the standby: %v", err)
	}
	dstAdm := kadm.NewClient(newClient(t, s))
	if dg, err := dstAdm.DescribeConsumerGroups(ctx, group); err != nil || len(dg[group].Members) == 0 {
		t.Fatalf("%s has no KIP-848 member on the standby (%v, %+v): the test would not test one", group, err, dg)
	}

	var o kadm.Offsets
	o.AddOffset(topic, 0, 7, -1)
	if resp, err := kadm.NewClient(cl).CommitOffsets(ctx, group, o); err != nil || resp.Error() != nil {
		t.Fatalf("commit on the source: %v %v", err, resp.Error())
	}
	if err := m.SyncGroups(ctx); err != nil {
		t.Fatalf("SyncGroups: %v", err)
	}
	got, err := dstAdm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := got.Lookup(topic, 0); o.At != 7 {
		t.Fatalf("%s on the standby is at %d, want the source's 7", group, o.At)
	}
}

// TestMirrorSyncGateShutCopiesNoOffsets: while the sync gate is shut (the
// mirror's target may be the active cluster: a switch flipped, or this
// member was paused or restarted through one), the periodic group sync
// writes nothing on the standby; a group rejoining there, empty for a
// moment, would otherwise take the old cluster's offsets over the commits
// its members made since (the 30-minute chaos run: a classic group read
// from 3 and 9 offsets below commits answered success). The switch's own
// copy (SyncGroups) is not gated.
func TestMirrorSyncGateShutCopiesNoOffsets(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic, group = "grp-gated", "gg-gated"
	createTopic(t, a, topic, 1, nil)
	cl := newClient(t, a, manualPartitioner())
	produceN(t, cl, topic, 0, 10, 5, "grp")
	var open atomic.Bool
	open.Store(true)
	m := startMirror(t, Topics([]string{topic}, nil), Groups([]string{"gg-.*"}, nil), SyncACLs(false), WithSyncGate(open.Load))
	waitCaughtUp(t, m, topic)

	// What the group committed on the standby, now the active cluster.
	dstAdm := kadm.NewClient(newClient(t, s))
	commit := func(adm *kadm.Client, at int64) {
		t.Helper()
		var o kadm.Offsets
		o.AddOffset(topic, 0, at, -1)
		if resp, err := adm.CommitOffsets(ctx, group, o); err != nil || resp.Error() != nil {
			t.Fatalf("commit %d: %v %v", at, err, resp.Error())
		}
	}
	at := func() int64 {
		t.Helper()
		got, err := dstAdm.FetchOffsets(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := got.Lookup(topic, 0)
		return o.At
	}
	open.Store(false)
	commit(dstAdm, 9)
	commit(kadm.NewClient(cl), 4) // the old cluster's, older
	m.syncOnce(ctx)
	if err := m.syncGroups(ctx, false); err != nil {
		t.Fatalf("group sync round: %v", err)
	}
	if got := at(); got != 9 {
		t.Fatalf("the standby's offset is %d after sync rounds with the gate shut, want the 9 committed there", got)
	}
	// The switch's copy goes through; so do the rounds once it opens.
	if err := m.SyncGroups(ctx); err != nil {
		t.Fatal(err)
	}
	if got := at(); got != 4 {
		t.Fatalf("the standby's offset is %d after the switch's copy, want the source's 4", got)
	}
	commit(kadm.NewClient(cl), 7)
	open.Store(true)
	if err := m.syncGroups(ctx, false); err != nil {
		t.Fatalf("group sync round: %v", err)
	}
	if got := at(); got != 7 {
		t.Fatalf("the standby's offset is %d after a round with the gate open, want the source's 7", got)
	}
}

// TestMirrorSyncGroupsManyInFewRequests: the switch's group copy reads
// every group's offsets in one OffsetFetch per coordinator on each side and
// the standby's end offsets in one ListOffsets per broker, whatever the
// number of groups (a request per group made a switch with a thousand
// groups hold writes for seconds); it commits each group that differs
// once, clamped to the standby's end, and none that is already equal.
func TestMirrorSyncGroupsManyInFewRequests(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const groups, parts, records = 120, 4, 10
	topics := []string{"grp-many-a", "grp-many-b"}
	cl := newClient(t, a, manualPartitioner())
	for _, topic := range topics {
		createTopic(t, a, topic, parts, nil)
		for p := int32(0); p < parts; p++ {
			produceN(t, cl, topic, p, records, 5, "many")
		}
	}
	var src, dst requestCounts
	m := startMirror(t, Topics([]string{"grp-many-.*"}, nil), Groups([]string{"gm-.*"}, nil), SyncACLs(false),
		SyncInterval(time.Hour), // the first round only: the copy below is SyncGroups's
		func(c *config) { c.srcHooks, c.dstHooks = append(c.srcHooks, &src), append(c.dstHooks, &dst) })
	waitCaughtUp(t, m, topics...)

	srcAdm := kadm.NewClient(cl)
	want := map[string]map[string]map[int32]int64{}
	for i := range groups {
		g := fmt.Sprintf("gm-%03d", i)
		var o kadm.Offsets
		want[g] = map[string]map[int32]int64{}
		for ti, topic := range topics {
			want[g][topic] = map[int32]int64{}
			for p := int32(0); p < parts; p++ {
				at := int64((i + ti + int(p)) % (records + 3)) // some past the end: clamped to it
				o.AddOffset(topic, p, at, -1)
				want[g][topic][p] = min(at, records)
			}
		}
		if resp, err := srcAdm.CommitOffsets(ctx, g, o); err != nil || resp.Error() != nil {
			t.Fatalf("commit %s on the source: %v %v", g, err, resp.Error())
		}
	}

	// The standby's group coordinator up (its offsets topic created), so
	// that the counts below are the copy's and not a fresh cluster's
	// retries.
	dstAdm := kadm.NewClient(newClient(t, s))
	testwait.Eventually(t, 30*time.Second, "the standby's group coordinator", func() error {
		_, err := dstAdm.FetchOffsets(ctx, "warm-up")
		return err
	})

	src.reset()
	dst.reset()
	if err := m.SyncGroups(ctx); err != nil {
		t.Fatalf("SyncGroups: %v", err)
	}
	// The source's ListOffsets are not counted: the mirror lists its
	// ends every second besides.
	srcFetches, dstFetches := src.get(kmsg.OffsetFetch), dst.get(kmsg.OffsetFetch)
	lists, commits := dst.get(kmsg.ListOffsets), dst.get(kmsg.OffsetCommit)
	t.Logf("%d groups copied with %d+%d OffsetFetch (source+standby), %d ListOffsets and %d OffsetCommit requests (source %v, standby %v)",
		groups, srcFetches, dstFetches, lists, commits, src.all(), dst.all())
	// One-broker clusters: one coordinator, one leader. A retry (the
	// standby's offsets topic still being created) is allowed once.
	if srcFetches > 2 || dstFetches > 2 || lists > 2 {
		t.Errorf("%d+%d OffsetFetch and %d ListOffsets requests for %d groups on one-broker clusters: want at most 2 each (not a request per group or topic)",
			srcFetches, dstFetches, lists, groups)
	}
	if commits < groups {
		t.Errorf("%d OffsetCommit requests, want one per group: %d", commits, groups)
	}
	got := dstAdm.FetchManyOffsets(ctx, slices.Sorted(maps.Keys(want))...)
	for g, topics := range want {
		r := got[g]
		if r.Err != nil {
			t.Fatalf("%s on the standby: %v", g, r.Err)
		}
		for topic, ps := range topics {
			for p, at := range ps {
				if o, ok := r.Fetched.Lookup(topic, p); !ok || o.At != at {
					t.Errorf("%s %s[%d] on the standby is at %d (found %v), want %d", g, topic, p, o.At, ok, at)
				}
			}
		}
	}

	dst.reset()
	if err := m.SyncGroups(ctx); err != nil {
		t.Fatalf("second SyncGroups: %v", err)
	}
	if n := dst.get(kmsg.OffsetCommit); n != 0 {
		t.Errorf("a second SyncGroups with nothing changed sent %d OffsetCommit requests, want none", n)
	}
}

// requestCounts counts the requests a client writes, by key (a kgo hook).
type requestCounts struct {
	mu sync.Mutex
	n  map[int16]int
}

func (c *requestCounts) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[int16]int{}
	}
	c.n[key]++
}

func (c *requestCounts) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = nil
}

func (c *requestCounts) all() map[int16]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

func (c *requestCounts) get(key kmsg.Key) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[int16(key)]
}

// TestMirrorPeriodicGroupSyncReadsOnlyWhatMoved: the periodic group sync
// reads the standby's offsets and ends only for groups whose source offsets
// moved since it last found them in sync; a round with nothing moved sends
// the standby no request at all. An offset changed on the standby behind
// the mirror's back is put right at the next full round, within
// groupFullSyncRounds rounds.
func TestMirrorPeriodicGroupSyncReadsOnlyWhatMoved(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic, groups = "grp-periodic", 20
	cl := newClient(t, a, manualPartitioner())
	createTopic(t, a, topic, 2, nil)
	for p := int32(0); p < 2; p++ {
		produceN(t, cl, topic, p, 10, 5, "periodic")
	}
	var dst requestCounts
	m := startMirror(t, Topics([]string{topic}, nil), Groups([]string{"gp-.*"}, nil), SyncACLs(false),
		SyncInterval(time.Hour), // the first round only: the rounds below are the test's
		func(c *config) { c.dstHooks = append(c.dstHooks, &dst) })
	waitCaughtUp(t, m, topic)
	srcAdm := kadm.NewClient(cl)
	dstAdm := kadm.NewClient(newClient(t, s))
	commit := func(adm *kadm.Client, g string, at int64) {
		t.Helper()
		var o kadm.Offsets
		o.AddOffset(topic, 0, at, -1)
		o.AddOffset(topic, 1, at, -1)
		if resp, err := adm.CommitOffsets(ctx, g, o); err != nil || resp.Error() != nil {
			t.Fatalf("commit %s: %v %v", g, err, resp.Error())
		}
	}
	standbyAt := func(g string) int64 {
		t.Helper()
		r, err := dstAdm.FetchOffsets(ctx, g)
		if err != nil {
			t.Fatalf("%s on the standby: %v", g, err)
		}
		o, _ := r.Lookup(topic, 1)
		return o.At
	}
	for i := range groups {
		commit(srcAdm, fmt.Sprintf("gp-%02d", i), int64(i%10))
	}
	round := func() {
		t.Helper()
		if err := m.syncGroups(ctx, false); err != nil {
			t.Fatalf("periodic group sync: %v", err)
		}
	}
	m.inSync.mu.Lock()
	m.inSync.round = 1 // the next round is not a full one
	m.inSync.mu.Unlock()
	round() // copies every group: none was found in sync yet
	if got := standbyAt("gp-07"); got != 7 {
		t.Fatalf("gp-07 at %d on the standby after a round, want 7", got)
	}

	dst.reset()
	round()
	if n := dst.all(); len(n) != 0 {
		t.Errorf("a periodic round with no group's offsets moved sent the standby %v (requests by key), want none", n)
	}

	commit(srcAdm, "gp-03", 9)
	dst.reset()
	round()
	if got := standbyAt("gp-03"); got != 9 {
		t.Errorf("gp-03 at %d on the standby after its source offsets moved to 9, want 9", got)
	}
	if n := dst.get(kmsg.OffsetCommit); n != 1 {
		t.Errorf("%d OffsetCommit requests for one group moved, want 1", n)
	}

	// Behind the mirror's back.
	commit(dstAdm, "gp-05", 1)
	for i := 0; ; i++ {
		round()
		if got := standbyAt("gp-05"); got == 5 {
			t.Logf("gp-05 put right after %d rounds", i+1)
			break
		}
		if i >= groupFullSyncRounds {
			t.Fatalf("gp-05 changed on the standby not put right in %d periodic rounds", i+1)
		}
	}
}
