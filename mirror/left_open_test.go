package mirror

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A writer stopped while copying a source transaction leaves its own open
// on the standby, to resume it; when a forced switch makes the standby the
// active cluster that transaction never ends before the broker's timeout
// (15 minutes), and read_committed readers of the partition stop at its
// first offset — the chaos run's forced replay: the mirror of the other
// direction never caught up, stuck at 0 of 7,015. AbortLeftOpen aborts it:
// the partition's last stable offset reaches its end.
func TestAbortLeftOpen(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic = "left-open"
	createTopic(t, a, topic, 1, nil)
	tx := txnClient(t, "left-open-tx")
	begin(t, tx)
	produceN(t, tx, topic, 0, 3, 1, "txn") // open on the source: 0..2
	m := startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false))
	adm := kadm.NewClient(newClient(t, s))
	ends := func() (end, stable int64) {
		e, err1 := adm.ListEndOffsets(ctx, topic)
		c, err2 := adm.ListCommittedOffsets(ctx, topic)
		if err1 != nil || err2 != nil || e.Error() != nil || c.Error() != nil {
			return -1, -1
		}
		eo, _ := e.Lookup(topic, 0)
		co, _ := c.Lookup(topic, 0)
		return eo.Offset, co.Offset
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if end, _ := ends(); end == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby never held the open transaction's 3 records")
		}
	}
	m.Close()
	if end, stable := ends(); end != 3 || stable != 0 {
		t.Fatalf("after the writer stopped: end %d, last stable %d; want 3 and 0 (its transaction open)", end, stable)
	}

	aborted, err := AbortLeftOpen(ctx, newClient(t, s, kgo.ClientID("abort")), DefaultTransactionalIDPrefix)
	if err != nil || len(aborted) == 0 {
		t.Fatalf("AbortLeftOpen: %v, %v", aborted, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		end, stable := ends()
		if end == 4 && stable == 4 {
			break // the ABORT marker at 3
		}
		if time.Now().After(deadline) {
			t.Fatalf("after AbortLeftOpen %v: end %d, last stable %d; want 4 and 4", aborted, end, stable)
		}
	}
	// Nothing else is touched: the source's transaction is still open
	// there, and ends as its producer says.
	if err := tx.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
}
