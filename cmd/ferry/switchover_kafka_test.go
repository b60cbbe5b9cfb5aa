package main

// Planned switchovers on two real Apache Kafka clusters under continuous
// traffic (skipped under -short).

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// startNode runs a member in-process against the given configuration and
// returns it with the Kafka address clients use.
func startNode(t *testing.T, yaml string) (*node, string) {
	t.Helper()
	cfg, err := configFrom(yaml)
	if err != nil {
		t.Fatal(err)
	}
	n, err := newNode(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := n.start(ctx); err != nil {
		t.Fatal(err)
	}
	return n, n.ln.Addr().String()
}

// primaryAndStandby starts a primary and a standby (one broker each) and returns
// them with the configuration of a member in front of them, mirror on.
func primaryAndStandby(t *testing.T, clusterID string) (primary, standby *kafkatest.Cluster, yaml string) {
	t.Helper()
	if testing.Short() {
		t.Skip("real Kafka")
	}
	primary = kafkatest.Start(t, 1, kafkatest.WithName("primary"))
	standby = kafkatest.Start(t, 1, kafkatest.WithName("standby"))
	return primary, standby, fmt.Sprintf(`
cluster_id: %s
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - {name: primary, bootstrap: [%s]}
  - {name: standby, bootstrap: [%s]}
mirror: {sync_interval: 1s}
`, clusterID, primary.Bootstrap(), standby.Bootstrap())
}

// createTopicVia creates a topic through Ferry at addr.
func createTopicVia(t *testing.T, ctx context.Context, addr, topic string, partitions int32) {
	t.Helper()
	resp, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addr))).CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create %s through Ferry: %v", topic, err)
	}
}

// traffic is an idempotent producer and a group consumer running through
// Ferry: what was acknowledged where, and what was consumed.
type traffic struct {
	t     *testing.T
	topic string
	parts int32

	mu       sync.Mutex
	acked    map[int32]map[int64]string // partition → offset → value
	unplaced map[int32][]string         // acknowledged at offset -1, by partition
	nAcked   int
	failed   []error
	seen     map[int32]map[int64]string
	reread   []partOffset // in the order read
	nSeen    int
	stopped  chan struct{} // stops the consumer
	prodStop chan struct{}
	prodDone chan struct{}
	wg       sync.WaitGroup
}

func startTraffic(t *testing.T, addr, topic string, parts int32, group string) *traffic {
	tr := &traffic{t: t, topic: topic, parts: parts, stopped: make(chan struct{}), prodStop: make(chan struct{}), prodDone: make(chan struct{}),
		acked: map[int32]map[int64]string{}, unplaced: map[int32][]string{}, seen: map[int32]map[int64]string{}}
	prod := newClient(t, kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(2*time.Millisecond),
		kgo.RecordDeliveryTimeout(2*time.Minute))
	cons := newClient(t, kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	tr.wg.Add(1)
	go func() {
		defer close(tr.prodDone)
		seq := map[int32]int{}
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-tr.prodStop:
				prod.Flush(context.Background())
				return
			case <-tick.C:
			}
			p := int32(i) % parts
			seq[p]++
			v := fmt.Sprintf("p%d-%06d", p, seq[p])
			prod.Produce(context.Background(), &kgo.Record{Partition: p, Value: []byte(v)}, func(r *kgo.Record, err error) {
				tr.mu.Lock()
				defer tr.mu.Unlock()
				if err != nil {
					tr.failed = append(tr.failed, fmt.Errorf("%s: %w", v, err))
					return
				}
				tr.nAcked++
				if r.Offset < 0 {
					// DUPLICATE_SEQUENCE_NUMBER: written before (a
					// batch whose answer was lost in a switch), where
					// is not said; the client reports success at -1.
					tr.unplaced[r.Partition] = append(tr.unplaced[r.Partition], v)
					return
				}
				if tr.acked[r.Partition] == nil {
					tr.acked[r.Partition] = map[int64]string{}
				}
				tr.acked[r.Partition][r.Offset] = v
			})
		}
	}()
	go func() {
		defer tr.wg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { <-tr.stopped; cancel() }()
		for ctx.Err() == nil {
			fs := cons.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				tr.mu.Lock()
				defer tr.mu.Unlock()
				if tr.seen[r.Partition] == nil {
					tr.seen[r.Partition] = map[int64]string{}
				}
				if _, ok := tr.seen[r.Partition][r.Offset]; ok {
					tr.reread = append(tr.reread, partOffset{r.Partition, r.Offset})
				} else {
					tr.nSeen++
				}
				tr.seen[r.Partition][r.Offset] = string(r.Value)
			})
			if err := cons.CommitUncommittedOffsets(ctx); err != nil && ctx.Err() == nil {
				t.Logf("commit: %v (retried with the next poll)", err)
			}
		}
	}()
	t.Cleanup(tr.stop)
	return tr
}

func (tr *traffic) stop() {
	tr.stopProducing()
	select {
	case <-tr.stopped:
	default:
		close(tr.stopped)
	}
	tr.wg.Wait()
}

func (tr *traffic) stopProducing() {
	select {
	case <-tr.prodStop:
	default:
		close(tr.prodStop)
	}
	<-tr.prodDone
}

// waitConsumed waits until the consumer has seen every acknowledged record
// (at its offset: a count could be made up by records written twice).
func (tr *traffic) waitConsumed(timeout time.Duration) {
	tr.t.Helper()
	testwait.Eventually(tr.t, timeout, "the consumer seeing every acknowledged record", func() error {
		if missing := tr.unseen(); missing != "" {
			a, s := tr.counts()
			return fmt.Errorf("the consumer saw %d records, %d acknowledged; not %s", s, a, missing)
		}
		return nil
	})
}

// unseen names an acknowledged record the consumer has not seen, or is "".
func (tr *traffic) unseen() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for p, offs := range tr.acked {
		for o := range offs {
			if _, ok := tr.seen[p][o]; !ok {
				return fmt.Sprintf("%d/%d", p, o)
			}
		}
	}
	for p, vs := range tr.unplaced {
		seen := valuesOf(tr.seen[p])
		for _, v := range vs {
			if !seen[v] {
				return fmt.Sprintf("%d/? (%s, acknowledged at -1)", p, v)
			}
		}
	}
	return ""
}

// valuesOf is the set of values of offs.
func valuesOf(offs map[int64]string) map[string]bool {
	out := make(map[string]bool, len(offs))
	for _, v := range offs {
		out[v] = true
	}
	return out
}

func (tr *traffic) counts() (acked, seen int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.nAcked, tr.nSeen
}

// waitAcked waits until n records more than now are acknowledged and the
// consumer has seen as many as were acknowledged then.
func (tr *traffic) waitMore(n int, timeout time.Duration) {
	tr.t.Helper()
	a0, _ := tr.counts()
	testwait.Eventually(tr.t, timeout, fmt.Sprintf("%d records acknowledged and %d consumed", a0+n, a0+n/2), func() error {
		if a, s := tr.counts(); a < a0+n || s < a0+n/2 {
			tr.mu.Lock()
			failed := tr.failed
			tr.mu.Unlock()
			return fmt.Errorf("%d acknowledged, %d consumed; failed produces: %v", a, s, failed)
		}
		return nil
	})
}

// partOffset is where a record is.
type partOffset struct {
	partition int32
	offset    int64
}

// rereads is how many records were read more than once so far.
func (tr *traffic) rereads() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.reread)
}

// rereadBelow returns the records re-read after the first since of them
// whose offsets lie below min[partition].
func (tr *traffic) rereadBelow(since int, min map[int32]int64) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var bad []string
	for _, r := range tr.reread[since:] {
		if r.offset < min[r.partition] {
			bad = append(bad, fmt.Sprintf("%d/%d", r.partition, r.offset))
		}
	}
	return bad
}

// committed returns a group's committed offsets read directly on a cluster.
func committed(t *testing.T, addrs []string, group, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addrs...))).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("committed offsets of %s on %v: %v", group, addrs, err)
	}
	out := map[int32]int64{}
	for p, o := range offs[topic] {
		out[p] = o.At
	}
	return out
}

// TestPlannedSwitchoverAndBackRealKafka: an idempotent producer and a
// consumer group run through Ferry while it switches from primary to
// standby and back (planned both times). Nothing the producer sent fails;
// every acknowledged record is, once, at its acknowledged offset on the
// cluster that is active at the end; the consumer sees every record and
// re-reads only what it had consumed but not committed when a switch
// began; the routing state moves to generation 1 then 2.
//
// Meanwhile a franz-go transactional producer (KIP-890: transaction.version
// 2) commits transactions through Ferry, aborting every 4th on purpose, and
// a read_committed consumer reads them through Ferry. The producer gets no
// error before the first switch and at most one abortable error per switch
// (it aborts and carries on), and commits again after each switch; every
// record of a committed transaction is, once, at its acknowledged offset on
// both clusters read read_committed directly, and nothing of an aborted one;
// the consumer through Ferry reads exactly the committed records, each once.
// What a failure of each means: checkErrors, checkRecords, checkConsumed.
func TestPlannedSwitchoverAndBackRealKafka(t *testing.T) {
	primary, standby, yaml := primaryAndStandby(t, "ferry-switch-test")
	n, addr := startNode(t, yaml)
	const topic, parts, group = "switched", 3, "switch-group"
	const txnTopic, txnParts, txnsPerWindow = "switched-txn", 3, 20
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if tv := finalized(t, ctx, addr)["transaction.version"]; tv != 2 {
		t.Fatalf("Ferry finalizes transaction.version %d; the transactional producer is to run KIP-890 part 2 (2)", tv)
	}
	createTopicVia(t, ctx, addr, topic, parts)
	createTopicVia(t, ctx, addr, txnTopic, txnParts)
	tr := startTraffic(t, addr, topic, parts, group)
	txn := startTxnTraffic(t, addr, txnTopic, txnParts, "switch-txn")
	begin := time.Now()
	tr.waitMore(500, time.Minute)
	txn.waitCommitted(begin, txnsPerWindow, time.Minute)

	switchTo := func(to string, gen uint32, left []string) {
		t.Helper()
		since := tr.rereads()
		txn.window.Store(int32(gen))
		start := time.Now()
		st, err := n.switchover(ctx, routing.Request{To: to, Timeout: time.Minute})
		if err != nil {
			t.Fatalf("switch to %s: %v", to, err)
		}
		answered := time.Now()
		t.Logf("switched to %s in %v (%s; steps %v)", to, answered.Sub(start), st.Last.Duration, st.Last.Steps)
		if st.Generation != gen || st.Active != to || st.Phase != routing.PhaseServing || st.Last == nil || st.Last.Outcome != "switched" {
			t.Fatalf("state after the switch to %s: %+v", to, st)
		}
		// Commits were held from the start of the switch: what the
		// cluster left holds is what the group had committed then.
		atSwitch := committed(t, left, group, topic)
		tr.waitMore(500, time.Minute)
		if bad := tr.rereadBelow(since, atSwitch); len(bad) > 0 {
			t.Fatalf("re-read records below the offsets committed at the switch to %s (%v): %v", to, atSwitch, bad)
		}
		txn.waitCommitted(answered, txnsPerWindow, time.Minute)
		t.Logf("after the switch to %s, the first transaction begun after the answer committed %v after it", to, txn.firstCommitAfter(answered))
	}
	switchTo("standby", 1, primary.Addrs())
	switchTo("primary", 2, standby.Addrs())
	tr.stopProducing()
	txn.stopProducing()
	tr.waitConsumed(time.Minute)
	tr.stop()

	total := tr.verifyOn(ctx, primary.Addrs())
	t.Logf("%d records acknowledged and consumed across two switches; %d re-read", total, tr.rereads())

	// The transactions, on the primary (active) and, once the mirror has
	// copied the last markers, on the standby, read_committed directly;
	// then as the consumer through Ferry read them.
	t.Logf("transactions: %s", txn.report())
	txn.checkErrors()
	ends := settledEndOffsets(t, primary.Addrs(), txnTopic)
	if err := n.mirror.WaitCaughtUp(ctx, txnTopic); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, "the standby to hold the primary's end offsets of "+txnTopic, func() error {
		if got := endOffsets(t, standby.Addrs(), txnTopic); fmt.Sprint(got) != fmt.Sprint(ends) {
			return fmt.Errorf("standby %v, primary %v", got, ends)
		}
		return nil
	})
	onPrimary := txn.checkRecords("primary", readCommittedOn(t, ctx, primary.Addrs(), txnTopic, ends))
	txn.checkRecords("standby", readCommittedOn(t, ctx, standby.Addrs(), txnTopic, ends))
	txn.waitConsumed(time.Minute)
	txn.stop()
	txn.checkConsumed()
	if !t.Failed() {
		t.Logf("%d committed transactional records on both clusters and read through Ferry", onPrimary)
	}
}

// TestForcedFailoverRealKafka: the mirror is held back by a transaction left
// open on the primary, the primary dies, and Ferry is switched forced to the
// standby. The answer names the range the primary acknowledged and the
// standby never received; a consumer that had read into that range is
// brought back to the standby's end by KIP-320 epoch validation (not reset
// to the start), and reads the records produced after the switch at the
// offsets they were acknowledged at.
func TestForcedFailoverRealKafka(t *testing.T) {
	primary, standby, yaml := primaryAndStandby(t, "ferry-forced-test")
	n, addr := startNode(t, yaml)
	const topic = "forced"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, topic, 1)
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	produce := func(prefix string, count int) []int64 { return produceNumbered(t, ctx, prod, prefix, count) }
	produce("before", 100)
	if err := n.mirror.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatal(err)
	}
	// A transaction left open stops the mirror at its first offset (it
	// copies decided data only); what follows is acknowledged by the
	// primary and never reaches the standby.
	leaveTxnOpen(t, ctx, addr, topic, "forced-open")
	unmirrored := produce("unmirrored", 20)
	end := unmirrored[len(unmirrored)-1] + 1
	// Caught up, as far as the mirror can go with a transaction open.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err := n.mirror.WaitCaughtUp(wctx, topic)
	wcancel()
	if err != nil {
		t.Fatalf("WaitCaughtUp with a transaction open on the source: %v", err)
	}

	// A consumer through Ferry reads everything, the unmirrored range too.
	var mu sync.Mutex
	var got []*kgo.Record
	cons := newClient(t, kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	consumeUntil := func(pred func(*kgo.Record) bool, what string) {
		t.Helper()
		for {
			fs := cons.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("consumer: %s never came", what)
			}
			done := false
			fs.EachRecord(func(r *kgo.Record) {
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
				done = done || pred(r)
			})
			if done {
				return
			}
		}
	}
	consumeUntil(func(r *kgo.Record) bool { return r.Offset == end-1 }, fmt.Sprintf("offset %d", end-1))
	waitMirrorHeldAt(t, n, 100, end)

	if err := primary.Kill(primary.NodeIDs()[0]); err != nil {
		t.Fatal(err)
	}
	st, err := n.switchover(ctx, routing.Request{To: "standby", Mode: routing.Forced})
	if err != nil {
		t.Fatalf("forced switch: %v", err)
	}
	want := []routing.LostRange{{Topic: topic, Partition: 0, From: 100, To: end}}
	if st.Generation != 1 || st.Active != "standby" || st.Last == nil || fmt.Sprint(st.Last.Lost) != fmt.Sprint(want) {
		t.Fatalf("after the forced switch: %+v, last %+v; want generation 1 on standby with lost %v", st, st.Last, want)
	}
	if e, ok := st.FenceEnd(0, topic, 0); !ok || e != 100 {
		t.Fatalf("generation 0's recorded end: %d, %v; want 100", e, ok)
	}

	after := produce("after", 10)
	if after[0] != 100 {
		t.Fatalf("first record after the switch acknowledged at %d, want 100 (the standby's end)", after[0])
	}
	mu.Lock()
	seen := len(got)
	mu.Unlock()
	consumeUntil(func(r *kgo.Record) bool { return string(r.Value) == "after-009" }, "the last record produced after the switch")
	mu.Lock()
	defer mu.Unlock()
	next := got[seen:]
	if len(next) != len(after) {
		var offs []string
		for _, r := range next {
			offs = append(offs, fmt.Sprintf("%d:%s", r.Offset, r.Value))
		}
		t.Fatalf("after the switch the consumer read %v; want exactly the %d records produced after it", offs, len(after))
	}
	for i, r := range next {
		if r.Offset != after[i] || string(r.Value) != fmt.Sprintf("after-%03d", i) {
			t.Fatalf("record %d after the switch: %d:%s, want %d:after-%03d", i, r.Offset, r.Value, after[i], i)
		}
	}

	// Ferry restarted with the primary still dead: it reads generation 1
	// from the standby and serves there, although the configuration
	// says primary.
	n.Close()
	n, addr = startNode(t, yaml)
	if st := n.routes.Current(); st.Generation != 1 || st.Active != "standby" {
		t.Fatalf("after a restart: %s; want generation 1 on standby", st)
	}
	// It advertises the feature levels saved with the switch, both
	// clusters reached then (the primary's levels are unknown now), so
	// clients keep the transaction protocol they had.
	if sb, via := finalized(t, ctx, standby.Bootstrap()), finalized(t, ctx, addr); sb["transaction.version"] == 0 || via["transaction.version"] != sb["transaction.version"] {
		t.Fatalf("after a restart without the primary Ferry finalizes %v, the standby %v; want transaction.version as the standby's", via, sb)
	}
	prod = newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	if offs := produce("restarted", 1); offs[0] != after[len(after)-1]+1 {
		t.Fatalf("produce after the restart: offset %d, want %d", offs[0], after[len(after)-1]+1)
	}

	// The primary comes back holding the lost range: the mirror, now
	// standby → primary, halts that partition rather than write over it,
	// and a failback is refused naming it with both ends.
	if err := primary.Restart(primary.NodeIDs()[0]); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 2*time.Minute, "the reverse mirror to halt the diverged partition", func() error {
		for _, st := range n.mirror.Info().Partitions {
			if st.Topic == topic && st.State == mirror.StateHalted {
				return nil
			}
		}
		return fmt.Errorf("mirror partitions %+v", n.mirror.Info().Partitions)
	})
	_, err = n.switchover(ctx, routing.Request{To: "primary"})
	var se *routing.Error
	if !errors.As(err, &se) || se.Reason != routing.ReasonHalted || len(se.Partitions) != 1 ||
		!strings.HasPrefix(se.Partitions[0], topic+"[0]: ") || !strings.Contains(se.Partitions[0], fmt.Sprintf("ends at %d", after[len(after)-1]+2)) {
		t.Fatalf("failback after the forced switch: %v; want it refused naming %s[0] and the standby's end %d", err, topic, after[len(after)-1]+2)
	}
	t.Logf("failback refused: %v", err)
}

// produceNumbered produces count records, prefix-000 on, through prod one
// at a time, and returns their offsets.
func produceNumbered(t *testing.T, ctx context.Context, prod *kgo.Client, prefix string, count int) []int64 {
	t.Helper()
	var offs []int64
	for i := range count {
		r, err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(fmt.Sprintf("%s-%03d", prefix, i))}).First()
		if err != nil {
			t.Fatalf("produce %s %d: %v", prefix, i, err)
		}
		offs = append(offs, r.Offset)
	}
	return offs
}

// leaveTxnOpen begins a transaction of txnID through addr and produces one
// record to topic in it, never ended: the mirror, which copies decided
// data only, stops at its first offset.
func leaveTxnOpen(t *testing.T, ctx context.Context, addr, topic, txnID string) {
	t.Helper()
	txn := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.TransactionalID(txnID))
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// waitMirrorHeldAt waits for n's mirror to have copied mirrored records of
// every partition (held back there by a transaction left open) and to see
// the source's end at end.
func waitMirrorHeldAt(t *testing.T, n *node, mirrored, end int64) {
	t.Helper()
	testwait.Eventually(t, time.Minute, "the mirror to see the primary's end", func() error {
		for _, st := range n.mirror.Info().Partitions {
			if st.SourceEnd != end || st.Mirrored != mirrored {
				return fmt.Errorf("mirror at %d, source end %d; want %d, %d", st.Mirrored, st.SourceEnd, mirrored, end)
			}
		}
		return nil
	})
}

// TestSwitchRolledBackWhenTheMirrorCannotDrain: with the standby down the
// mirror cannot drain; the planned switch is rolled back after its timeout
// with the lagging partitions named, the writes it held go to the primary,
// and the producer never sees an error. With the standby back, the same
// switch succeeds.
func TestSwitchRolledBackWhenTheMirrorCannotDrain(t *testing.T) {
	_, standby, yaml := primaryAndStandby(t, "ferry-rollback-test")
	n, addr := startNode(t, yaml)
	const topic, parts, group = "rollback", 2, "rollback-group"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, topic, parts)
	tr := startTraffic(t, addr, topic, parts, group)
	tr.waitMore(300, time.Minute)

	sb := standby.NodeIDs()[0]
	if err := standby.Stop(sb); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := n.switchover(ctx, routing.Request{To: "standby", Timeout: 3 * time.Second})
	var se *routing.Error
	if !errors.As(err, &se) || se.Reason != routing.ReasonDrainTimeout || len(se.Partitions) == 0 {
		t.Fatalf("switch with the standby down: %v; want a drain timeout naming the lagging partitions", err)
	}
	t.Logf("rolled back after %v: %v", time.Since(start), err)
	st := n.routes.Current()
	if st.Generation != 0 || st.Active != "primary" || st.Phase != routing.PhaseServing || st.Last == nil || !strings.HasPrefix(st.Last.Outcome, "rolled back") {
		t.Fatalf("state after the rollback: %+v, last %+v", st, st.Last)
	}
	tr.waitMore(300, time.Minute) // the held writes went on to the primary

	if err := standby.Restart(sb); err != nil {
		t.Fatal(err)
	}
	st, err = n.switchover(ctx, routing.Request{To: "standby", Timeout: 2 * time.Minute})
	if err != nil || st.Generation != 1 || st.Active != "standby" {
		t.Fatalf("switch with the standby back: %+v, %v", st, err)
	}
	tr.waitMore(300, time.Minute)
	tr.stopProducing()
	tr.waitConsumed(time.Minute)
	tr.stop()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.failed) > 0 {
		t.Fatalf("%d produces failed, e.g. %v", len(tr.failed), tr.failed[0])
	}
	ends := endOffsets(t, standby.Addrs(), topic)
	for p := int32(0); p < parts; p++ {
		if n := len(tr.acked[p]) + len(tr.unplaced[p]); int64(n) != ends[p] {
			t.Fatalf("partition %d: %d acknowledged, standby's end %d", p, n, ends[p])
		}
	}
}

// verifyOn asserts, reading the cluster at addrs directly, that no produce
// failed and that the cluster holds every acknowledged record at its
// acknowledged offset (one acknowledged at -1, at some offset), once, in
// order, and nothing else, and that the consumer saw each; it returns how many were acknowledged.
func (tr *traffic) verifyOn(ctx context.Context, addrs []string) int {
	tr.t.Helper()
	total, dups := tr.verify(ctx, addrs, false)
	if len(dups) > 0 {
		tr.t.Fatalf("records not acknowledged at their offset: %v", dups)
	}
	return total
}

// verify is verifyOn; with dupsAllowed, the cluster may also hold second
// copies of acknowledged records (a write whose answer the client never got,
// sent again), which it returns: anything else fails.
func (tr *traffic) verify(ctx context.Context, addrs []string, dupsAllowed bool) (total int, dups []string) {
	tr.t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.failed) > 0 {
		tr.t.Fatalf("%d produces failed, e.g. %v", len(tr.failed), tr.failed[0])
	}
	for p := int32(0); p < tr.parts; p++ {
		total += len(tr.acked[p]) + len(tr.unplaced[p])
	}
	ends := endOffsets(tr.t, addrs, tr.topic)
	onCluster := map[int32]map[int64]string{}
	cl := newClient(tr.t, kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(tr.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for read := int64(0); read < sumEnds(ends); {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			tr.t.Fatalf("read %d of %d", read, sumEnds(ends))
		}
		fs.EachRecord(func(r *kgo.Record) {
			if onCluster[r.Partition] == nil {
				onCluster[r.Partition] = map[int64]string{}
			}
			onCluster[r.Partition][r.Offset] = string(r.Value)
			read++
		})
	}
	for p := int32(0); p < tr.parts; p++ {
		ackedValues := valuesOf(tr.acked[p])
		// Acknowledged at -1: each once at some offset, in order.
		unplaced := map[string]bool{}
		for _, v := range tr.unplaced[p] {
			ackedValues[v], unplaced[v] = true, true
		}
		for o, v := range tr.acked[p] {
			if got, ok := onCluster[p][o]; !ok || got != v {
				tr.t.Fatalf("partition %d offset %d: %q acknowledged there, the cluster holds %q", p, o, v, got)
			}
		}
		last := 0
		for o := int64(0); o < ends[p]; o++ {
			v, ok := onCluster[p][o]
			if !ok {
				tr.t.Fatalf("partition %d: no record at offset %d", p, o)
			}
			if a, acked := tr.acked[p][o]; (!acked || a != v) && !unplaced[v] {
				dups = append(dups, fmt.Sprintf("%d/%d=%s", p, o, v))
				if !dupsAllowed || !ackedValues[v] {
					tr.t.Fatalf("partition %d offset %d: %q on the cluster, not acknowledged there nor anywhere (acknowledged there: %q)", p, o, v, a)
				}
				continue
			}
			delete(unplaced, v)
			seq, _ := strconv.Atoi(v[len(v)-6:])
			if seq <= last {
				tr.t.Fatalf("partition %d offset %d: %q after sequence %d: order broken", p, o, v, last)
			}
			last = seq
			if s := tr.seen[p][o]; s != v {
				tr.t.Fatalf("partition %d offset %d: consumer saw %q, want %q", p, o, s, v)
			}
		}
		for v := range unplaced {
			tr.t.Fatalf("partition %d: %q, acknowledged (at -1), is not on the cluster", p, v)
		}
	}
	return total, dups
}

func sumEnds(ends map[int32]int64) int64 {
	var n int64
	for _, e := range ends {
		n += e
	}
	return n
}

// apiVersions is the ApiVersions answer from bootstrap.
func apiVersions(t *testing.T, ctx context.Context, bootstrap string) *kmsg.ApiVersionsResponse {
	t.Helper()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, newClient(t, kgo.SeedBrokers(bootstrap)))
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("ApiVersions from %s: %v", bootstrap, err)
	}
	return resp
}

// finalized is the feature levels an ApiVersions answer from bootstrap
// finalizes.
func finalized(t *testing.T, ctx context.Context, bootstrap string) map[string]int16 {
	t.Helper()
	resp := apiVersions(t, ctx, bootstrap)
	out := map[string]int16{}
	for _, f := range resp.FinalizedFeatures {
		out[f.Name] = f.MaxVersionLevel
	}
	return out
}

// TestForcedSwitchOldClusterHung: the primary's broker is frozen (SIGSTOP,
// as a hung host or a network partition leaves it: connections open,
// nothing answered) and Ferry is switched forced to the standby. The
// switch answers within its own bounds — the source's end offsets listed
// for 3 s, the save's 30 s, the install — and the first produce after it
// is acknowledged on the standby. Before, the write that tells the frozen
// cluster of the new generation waited in kgo's BeginTransaction, which
// takes no context, and then in the client's Close: 53 s in the chaos
// run, this test's 40 s passed, writes refused all along. (Then about
// 23 s: 3 s listing, 10 s reading the frozen cluster's state before the
// save, 10 s trying to write it there; the write is no longer waited for
// once the read failed, it goes on in the background. Killed outright,
// the primary refuses connections and the switch takes a few seconds.)
func TestForcedSwitchOldClusterHung(t *testing.T) {
	primary, _, yaml := primaryAndStandby(t, "ferry-forced-hung")
	n, addr := startNode(t, yaml)
	const topic = "forced-hung"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, topic, 1)
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	produceNumbered(t, ctx, prod, "before", 20)
	if err := n.mirror.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatal(err)
	}

	pid := primary.Pid(primary.NodeIDs()[0])
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	type answer struct {
		st  routing.State
		err error
	}
	done := make(chan answer, 1)
	start := time.Now()
	go func() {
		st, err := n.switchover(ctx, routing.Request{To: "standby", Mode: routing.Forced})
		done <- answer{st, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-time.After(time.Minute):
		buf := make([]byte, 1<<22)
		t.Fatalf("the forced switch had not answered after a minute; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
	took := time.Since(start)
	if a.err != nil || a.st.Active != "standby" {
		t.Fatalf("forced switch: %+v, %v", a.st, a.err)
	}
	if took > 40*time.Second {
		t.Fatalf("the forced switch answered after %v, past its bounds (3 s listing, 30 s save, the install)", took)
	}
	after := produceNumbered(t, ctx, prod, "after", 1)
	if after[0] != 20 {
		t.Fatalf("the first record after the switch acknowledged at %d, want 20 (the standby's end: the 20 records mirrored before)", after[0])
	}
	t.Logf("forced switch with the primary frozen answered in %v; the first produce after it acknowledged at offset %d, %v after the call",
		took.Round(time.Millisecond), after[0], time.Since(start).Round(time.Millisecond))
}
