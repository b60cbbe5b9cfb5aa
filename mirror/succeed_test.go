package mirror

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestFenceWait: a writer waits out the whole fence period unless it
// directly succeeds a session of this process (the owner epoch one above
// its predecessor's, same producer ID); then only until a fence period
// after the predecessor's last append.
func TestFenceWait(t *testing.T) {
	const period = 2 * time.Second
	now := time.Now()
	owner := producer{id: 7, epoch: 5}
	pred := func(id int64, epoch int16, lastSent time.Time) *predecessor {
		return &predecessor{plain: producer{id: id, epoch: epoch}, lastSent: lastSent}
	}
	for _, c := range []struct {
		name  string
		pred  *predecessor
		owner producer
		want  time.Duration
	}{
		{"no predecessor", nil, owner, period},
		{"first owner ever (epoch 0)", nil, producer{id: 7}, 0},
		{"predecessor sent nothing", pred(7, 4, time.Time{}), owner, 0},
		{"predecessor sent 0.5 s ago", pred(7, 4, now.Add(-500*time.Millisecond)), owner, 1500 * time.Millisecond},
		{"predecessor sent long ago", pred(7, 4, now.Add(-time.Hour)), owner, 0},
		{"another owner in between (epoch +2)", pred(7, 3, time.Time{}), owner, period},
		{"another producer ID", pred(8, 4, time.Time{}), owner, period},
		{"epoch exhausted", pred(7, 32767, time.Time{}), producer{id: 7, epoch: -32768}, period},
	} {
		if got := fenceWait(c.pred, c.owner, period, now); got != c.want {
			t.Errorf("%s: wait %v, want %v", c.name, got, c.want)
		}
	}
}

// TestSettledBy: a writer reads the standby's end once only when it
// directly succeeds a session of this process that left nothing on its way
// to the standby; an append not yet acknowledged, a marker not yet seen or
// another owner in between make it wait for the end to stop moving.
func TestSettledBy(t *testing.T) {
	owner := producer{id: 7, epoch: 5}
	pred := func(id int64, epoch int16, quiet bool) *predecessor {
		return &predecessor{plain: producer{id: id, epoch: epoch}, quiet: quiet}
	}
	for _, c := range []struct {
		name string
		pred *predecessor
		want bool
	}{
		{"no predecessor", nil, false},
		{"quiet predecessor", pred(7, 4, true), true},
		{"predecessor with an append or a marker outstanding", pred(7, 4, false), false},
		{"another owner in between (epoch +2)", pred(7, 3, true), false},
		{"another producer ID", pred(8, 4, true), false},
	} {
		if got := c.pred.settledBy(owner); got != c.want {
			t.Errorf("%s: settled %v, want %v", c.name, got, c.want)
		}
	}
	// What a session leaves says whether it was quiet.
	for _, c := range []struct {
		name          string
		next, acked   int64
		marking, want bool
	}{
		{"everything acknowledged", 10, 10, false, true},
		{"an append in flight", 12, 10, false, false},
		{"a marker asked for, not yet seen", 10, 10, true, false},
	} {
		w := &writer{owned: true, plain: owner, next: c.next, acked: c.acked, marking: c.marking}
		if got := w.predecessor().quiet; got != c.want {
			t.Errorf("%s: quiet %v, want %v", c.name, got, c.want)
		}
	}
}

// TestWriterStartsWithFewInitProducerIDs, on real Kafka: a writer
// initialises its ownership and the slots whose transactional IDs the
// coordinator knows, and leaves the others until a transaction needs one; a
// restarted writer whose predecessor in this process appended nothing
// copies at once, with one InitProducerId (its ownership), keeping the slots
// its predecessor left unused. Transactions through a slot initialised late
// and through a kept one land committed at their source offsets. When
// another writer took the partition in between, the next one waits out the
// whole fence period again.
func TestWriterStartsWithFewInitProducerIDs(t *testing.T) {
	a, s := clusters(t)
	topic := fmt.Sprintf("succeed-%d", time.Now().UnixNano()) // its writers' IDs new: the first start waits no fence period
	createTopic(t, a, topic, 2, nil)
	plain := newClient(t, a, manualPartitioner())
	produceN(t, plain, topic, 0, 3, 1, "p0")
	standby := newClient(t, s)
	// Partition 1's slot IDs are known to the standby's coordinator (as
	// after an earlier writer): its writer initialises them at its start.
	for i := range 4 {
		initTxnID(t, standby, fmt.Sprintf("%s.%s.%d.%d", DefaultTransactionalIDPrefix, topic, 1, i))
	}
	var dst requestCounts
	// A fence period longer than any wait below: a writer that waited
	// one out would not be seen copying.
	m := startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false),
		func(c *config) {
			c.fencePeriod = 3 * time.Minute
			c.dstHooks = append(c.dstHooks, &dst)
		})
	waitCaughtUp(t, m, topic)
	if n := dst.get(kmsg.InitProducerID); n != 6 {
		t.Fatalf("two writers started with %d InitProducerId, want 6 (one ownership each, partition 1's four known slots)", n)
	}

	// A committed source transaction of two records on partition p,
	// mirrored: both isolation levels read want records on both clusters.
	ta := txnClient(t, "src-"+topic)
	committed := func(p int32, want int) {
		t.Helper()
		begin(t, ta)
		produceN(t, ta, topic, p, 2, 1, fmt.Sprintf("t%d", p))
		end(t, ta, true)
		waitCaughtUp(t, m, topic)
		if unc, com := sameRecords(t, topic, p); len(unc) != want || len(com) != want {
			t.Fatalf("partition %d: %d read_uncommitted, %d read_committed records on both; want %d and %d", p, len(unc), len(com), want, want)
		}
	}

	// Partition 0's transaction initialises one of its slots first.
	dst.reset()
	committed(0, 5)
	if n := dst.get(kmsg.InitProducerID); n != 1 {
		t.Fatalf("partition 0's first transaction sent %d InitProducerId, want 1 (its slot, initialised when needed)", n)
	}

	// Partition 1 never had a record: its writer sent nothing.
	if _, err := m.Halt(topic, 1); err != nil {
		t.Fatal(err)
	}
	dst.reset()
	if _, err := m.Restart(topic, 1); err != nil {
		t.Fatal(err)
	}
	produceN(t, plain, topic, 1, 2, 1, "p1")
	testwait.Eventually(t, time.Minute, "partition 1 copied by its restarted writer", func() error {
		if _, e := offsetsOf(t, s, topic, 1); e != 2 {
			return fmt.Errorf("standby end %d, want 2", e)
		}
		return nil
	})
	if n := dst.get(kmsg.InitProducerID); n != 1 {
		t.Fatalf("the restarted writer sent %d InitProducerId, want 1 (its ownership; the slots its predecessor left unused kept)", n)
	}

	// A source transaction, mirrored through a kept slot.
	committed(1, 4)
	if n := dst.get(kmsg.InitProducerID); n != 1 {
		t.Fatalf("%d InitProducerId after the transaction, want still 1", n)
	}

	// Another writer takes the partition while it is halted.
	if _, err := m.Halt(topic, 1); err != nil {
		t.Fatal(err)
	}
	initTxnID(t, standby, fmt.Sprintf("%s.%s.%d.w", DefaultTransactionalIDPrefix, topic, 1))
	dst.reset()
	if _, err := m.Restart(topic, 1); err != nil {
		t.Fatal(err)
	}
	produceN(t, plain, topic, 1, 1, 1, "p1-after")
	// Waiting out three minutes, it neither copies nor touches its
	// slots; a writer that skipped the wait would have within seconds.
	time.Sleep(5 * time.Second)
	if _, e := offsetsOf(t, s, topic, 1); e != 5 {
		t.Fatalf("standby end %d 5 s after the restart, want 5 (nothing copied before the fence period ends)", e)
	}
	if n := dst.get(kmsg.InitProducerID); n != 1 {
		t.Fatalf("%d InitProducerId 5 s after the restart, want 1 (its ownership only, the slots after the fence period)", n)
	}
	if st := statusOf(t, m, topic, 1); st.State != StateStarting {
		t.Fatalf("partition 1 %v 5 s after the restart, want starting", st.State)
	}
}

// initTxnID sends InitProducerId for transactional ID id through cl, as
// another producer (or writer) taking it would.
func initTxnID(t *testing.T, cl *kgo.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionalID = &id
	req.TransactionTimeoutMillis = 60000
	req.ProducerID, req.ProducerEpoch = -1, -1
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("InitProducerId %s: %v", id, err)
	}
}
