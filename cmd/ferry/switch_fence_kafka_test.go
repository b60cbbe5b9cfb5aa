package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

// committedValues reads topic's partition 0 on addrs read_committed, up to
// its end, and returns the values.
func committedValues(t *testing.T, ctx context.Context, addrs []string, topic string) []string {
	t.Helper()
	ends := settledEndOffsets(t, addrs, topic)
	var out []string
	for _, v := range readCommittedOn(t, ctx, addrs, topic, ends) {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// directTxn begins a transaction on a producer writing to the cluster at
// addrs directly, beside Ferry, and has one record of it acknowledged.
func directTxn(t *testing.T, ctx context.Context, addrs []string, id, topic, value string) *kgo.Client {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.TransactionalID(id), kgo.DefaultProduceTopic(topic))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatalf("%s: producing to %s directly: %v", id, topic, err)
	}
	return cl
}

// A switch never fences a producer that writes to the cluster beside Ferry.
// On a topic Ferry does not mirror, its transaction stays open across the
// switch and commits after it. On a mirrored topic (its writes belong on the
// active cluster, through Ferry: after the switch they would land where
// nothing mirrors them) the drain waits for its transaction to end rather
// than abort it: the switch rolls back naming it, and goes through once it
// has ended.
func TestSwitchLeavesDirectTransactionsAlone(t *testing.T) {
	primary, standby, yaml := primaryAndStandby(t, "ferry-bystander-test")
	yaml = strings.Replace(yaml, "mirror: {sync_interval: 1s}", "mirror: {sync_interval: 1s, topics: {include: ['mirrored']}}", 1)
	n, addr := startNode(t, yaml)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, "mirrored", 1)
	resp, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(primary.Addrs()...))).CreateTopic(ctx, 1, 1, nil, "beside")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}

	beside := directTxn(t, ctx, primary.Addrs(), "direct-beside", "beside", "beside-0")
	onMirrored := directTxn(t, ctx, primary.Addrs(), "direct-mirrored", "mirrored", "mirrored-0")

	_, err = n.switchover(ctx, routing.Request{To: "standby", Timeout: 4 * time.Second})
	var se *routing.Error
	if !errors.As(err, &se) || se.Reason != routing.ReasonDrainTimeout || !strings.Contains(fmt.Sprint(se.Partitions), "direct-mirrored") {
		t.Fatalf("switch with a direct writer's transaction open on a mirrored topic: %v; want a drain timeout naming it", err)
	}
	if strings.Contains(fmt.Sprint(se.Partitions), "direct-beside") {
		t.Fatalf("the drain waited for a transaction on a topic it does not mirror: %v", err)
	}
	if err := onMirrored.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("the direct writer on a mirrored topic, after the switch rolled back: %v", err)
	}

	st, err := n.switchover(ctx, routing.Request{To: "standby", Timeout: time.Minute})
	if err != nil || st.Generation != 1 || st.Active != "standby" {
		t.Fatalf("switch with only a transaction beside Ferry open: %+v, %v", st, err)
	}
	if err := beside.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("the transaction open beside Ferry across the switch: %v", err)
	}
	for i := 1; i <= 2; i++ {
		if err := beside.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := beside.ProduceSync(ctx, &kgo.Record{Value: fmt.Appendf(nil, "beside-%d", i)}).FirstErr(); err != nil {
			t.Fatalf("producing beside Ferry after the switch: %v", err)
		}
		if err := beside.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatalf("committing beside Ferry after the switch: %v", err)
		}
	}
	if got, want := committedValues(t, ctx, primary.Addrs(), "beside"), []string{"beside-0", "beside-1", "beside-2"}; !slices.Equal(got, want) {
		t.Fatalf("beside, read committed on the primary: %v, want %v", got, want)
	}
	// The direct writer's transaction on the mirrored topic, committed
	// before the switch, is on the new active cluster.
	if got, want := committedValues(t, ctx, standby.Addrs(), "mirrored"), []string{"mirrored-0"}; !slices.Equal(got, want) {
		t.Fatalf("mirrored, read committed on the standby: %v, want %v", got, want)
	}
}

// fencedThenRolledBack runs a member (a fleet of one) in front of a primary
// and a standby, a producer through it with a transaction open on topic,
// and a planned switch whose drain fences that transaction and which then
// rolls back; it returns once the produce held across the switch has been
// answered, with the producer.
func fencedThenRolledBack(t *testing.T, ctx context.Context, clusterID, txnID, topic string) (primary *kafkatest.Cluster, addr string, prod *kgo.Client) {
	t.Helper()
	primary, standby, yaml := primaryAndStandby(t, clusterID)
	// A fleet of one whose write lease outlasts the switch's timeout.
	yaml += fmt.Sprintf("node_id: 1\nfleet: {bind: '%s', write_lease: 1m}\n", freeAddr(t))
	n, addr := startNode(t, yaml)
	createTopicVia(t, ctx, addr, topic, 1)
	prod = newClient(t, kgo.SeedBrokers(addr), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic),
		kgo.RecordDeliveryTimeout(2*time.Minute))
	if err := prod.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("open-at-the-switch")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// Wait for the mirror to have copied the topic, so that the drain
	// sees it (and the transaction open on it) rather than an error.
	sadm := kadm.NewClient(newClient(t, kgo.SeedBrokers(standby.Addrs()...)))
	testwait.Until(t, time.Minute, "the mirror to create the topic on the standby", func() bool {
		ends, err := sadm.ListEndOffsets(ctx, topic)
		return err == nil && ends.Error() == nil
	})

	// The drain fences the transaction after its grace and catches up;
	// then the switch waits out the write lease, longer than its timeout,
	// and rolls back: the fence came before the point of no return.
	switched := make(chan error, 1)
	go func() {
		_, err := n.switchover(ctx, routing.Request{To: "standby", Timeout: 6 * time.Second})
		switched <- err
	}()
	testwait.Until(t, time.Minute, "the switch to hold writes", func() bool { return n.routes.Current().Phase != routing.PhaseServing })
	held := make(chan error, 1)
	prod.Produce(ctx, &kgo.Record{Value: []byte("held")}, func(_ *kgo.Record, err error) { held <- err })

	err := <-switched
	var se *routing.Error
	if !errors.As(err, &se) || se.Reason != routing.ReasonDrainTimeout || !strings.Contains(se.Msg, "write leases") {
		t.Fatalf("switch with a write lease longer than its timeout: %v; want it timed out waiting for the write leases", err)
	}
	if st := n.routes.Current(); st.Generation != 0 || st.Active != "primary" || st.Phase != routing.PhaseServing {
		t.Fatalf("state after the rollback: %+v", st)
	}
	err = <-held
	t.Logf("the produce held across the rolled-back switch: %v", err)
	if err == nil || !txnAbortable(err) {
		t.Fatalf("the produce held across the rolled-back switch: %v; want an error to abort after (the drain aborted its transaction)", err)
	}
	return primary, addr, prod
}

// A switch whose drain fenced a transactional producer writing through
// Ferry, and which then rolled back, leaves that producer able to go on:
// its held produce and its commit get errors it aborts after, and its next
// transactions commit on the old cluster.
func TestSwitchRolledBackAfterFencingKeepsProducer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const topic = "fenced"
	primary, _, prod := fencedThenRolledBack(t, ctx, "ferry-fence-rollback-test", "through-ferry", topic)
	if err := prod.EndTransaction(ctx, kgo.TryCommit); err == nil || !txnAbortable(err) {
		t.Fatalf("committing the transaction the drain aborted: %v; want an error to abort after", err)
	}
	if err := prod.AbortBufferedRecords(ctx); err != nil {
		t.Fatal(err)
	}
	if err := prod.EndTransaction(ctx, kgo.TryAbort); err != nil && !txnAbortable(err) {
		t.Fatalf("aborting: %v", err)
	}
	for i := range 3 {
		if err := prod.BeginTransaction(); err != nil {
			t.Fatalf("transaction %d after the rollback: %v", i, err)
		}
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: fmt.Appendf(nil, "after-%d", i)}).FirstErr(); err != nil {
			t.Fatalf("transaction %d after the rollback: produce: %v", i, err)
		}
		if err := prod.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatalf("transaction %d after the rollback: commit: %v", i, err)
		}
	}
	// The transaction open at the switch was aborted (fenced by the
	// drain); the three after it are committed on the old cluster.
	if got, want := committedValues(t, ctx, primary.Addrs(), topic), []string{"after-0", "after-1", "after-2"}; !slices.Equal(got, want) {
		t.Fatalf("read committed on the primary: %v, want %v", got, want)
	}
}

// What a rollback lets a fenced producer do is never given to a zombie: once
// another producer initialised the transactional ID, the fenced one's
// re-init with its old epoch is PRODUCER_FENCED, as the broker has it, and
// the new producer goes on.
func TestSwitchRolledBackAfterFencingZombieStaysFenced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const topic, txnID = "fenced-zombie", "through-ferry-zombie"
	primary, addr, zombie := fencedThenRolledBack(t, ctx, "ferry-fence-zombie-test", txnID, topic)
	// Another instance of the application takes the transactional ID.
	live := newClient(t, kgo.SeedBrokers(addr), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic))
	commit := func(cl *kgo.Client, v string) error {
		if err := cl.BeginTransaction(); err != nil {
			return err
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			return err
		}
		return cl.EndTransaction(ctx, kgo.TryCommit)
	}
	if err := commit(live, "live-0"); err != nil {
		t.Fatalf("the new instance's first transaction: %v", err)
	}
	// The fenced instance aborts what the held produce failed and tries
	// a new transaction: its re-init names its old epoch.
	_ = zombie.AbortBufferedRecords(ctx)
	if err := zombie.EndTransaction(ctx, kgo.TryAbort); err != nil && !txnAbortable(err) {
		t.Fatalf("aborting: %v", err)
	}
	err := commit(zombie, "zombie")
	t.Logf("the zombie's transaction: %v", err)
	if err == nil || txnAbortable(err) {
		t.Fatalf("the zombie's transaction after another instance took its transactional ID: %v; want it fenced", err)
	}
	if err := commit(live, "live-1"); err != nil {
		t.Fatalf("the new instance after the zombie tried: %v", err)
	}
	if got, want := committedValues(t, ctx, primary.Addrs(), topic), []string{"live-0", "live-1"}; !slices.Equal(got, want) {
		t.Fatalf("read committed on the primary: %v, want %v", got, want)
	}
}

// TestSessionOffsetsAcrossSwitchRealKafka: a consume-transform-produce loop
// (franz-go's GroupTransactSession, as Kafka Streams does it: records
// produced, then the input offsets added to the transaction, then the
// commit) has a transaction open when a planned switch begins; the drain
// aborts it. Its commit after the switch adds the offsets under the
// producer ID of the generation before: Ferry answers the add, and refuses
// the offsets as the group's (UNKNOWN_MEMBER_ID), which the session takes
// as abortable: End reports nothing committed and no error (Kafka Streams
// takes the same answer as a task migration, where UNKNOWN_PRODUCER_ID at
// the add or the commit ends its thread). The next transaction commits on
// the new cluster, and read_committed the output holds that one's records
// only.
func TestSessionOffsetsAcrossSwitchRealKafka(t *testing.T) {
	_, standby, yaml := primaryAndStandby(t, "ferry-session-offsets-test")
	n, addr := startNode(t, yaml)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, "in", 1)
	createTopicVia(t, ctx, addr, "out", 1)
	in := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("in"))
	produceNumbered(t, ctx, in, "in", 5)

	sess, err := kgo.NewGroupTransactSession(kgo.SeedBrokers(addr), kgo.TransactionalID("session-offsets"),
		kgo.ConsumerGroup("session-offsets"), kgo.ConsumeTopics("in"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.DefaultProduceTopic("out"))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	// One round: poll what there is, copy it to out in a transaction.
	copyRound := func(want int) []string {
		t.Helper()
		var got []string
		for len(got) < want {
			fs := sess.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("polled %d of %d records", len(got), want)
			}
			fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
		}
		if err := sess.Begin(); err != nil {
			t.Fatal(err)
		}
		for _, v := range got {
			if err := sess.ProduceSync(ctx, &kgo.Record{Value: []byte("copy-" + v)}).FirstErr(); err != nil {
				t.Fatalf("producing copy-%s: %v", v, err)
			}
		}
		return got
	}
	copyRound(5)
	if err := n.mirror.WaitCaughtUp(ctx, "in"); err != nil {
		t.Fatal(err)
	}
	// The transaction is open (its records acknowledged): the switch's
	// drain aborts it.
	if _, err := n.switchover(ctx, routing.Request{To: "standby"}); err != nil {
		t.Fatalf("planned switch: %v", err)
	}
	committed, err := sess.End(ctx, kgo.TryCommit)
	if err != nil || committed {
		t.Fatalf("End across the switch: committed %v, err %v; want nothing committed and no error (abortable)", committed, err)
	}
	// Again, on the new cluster: the input re-read from the group's
	// offsets, copied and committed.
	produceNumbered(t, ctx, in, "more", 2)
	again := copyRound(7)
	committed, err = sess.End(ctx, kgo.TryCommit)
	if err != nil || !committed {
		t.Fatalf("End after the switch: committed %v, err %v; want committed", committed, err)
	}
	slices.Sort(again)
	want := []string{"in-000", "in-001", "in-002", "in-003", "in-004", "more-000", "more-001"}
	if !slices.Equal(again, want) {
		t.Fatalf("re-read after the aborted transaction: %v, want %v", again, want)
	}
	var copies []string
	for _, v := range want {
		copies = append(copies, "copy-"+v)
	}
	if got := committedValues(t, ctx, standby.Addrs(), "out"); !slices.Equal(got, copies) {
		t.Fatalf("out on the standby, read_committed: %v; want %v once each", got, copies)
	}
}
