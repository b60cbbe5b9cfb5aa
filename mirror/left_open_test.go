package mirror

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// A writer stopped inside a transaction (here killed -9 just before its
// EndTxn, with the source transaction's last batch on the standby) leaves
// its own transaction open there, to resume it. When a forced switch makes
// the standby the active cluster nothing resumes it: it stays open until
// the broker's timeout (15 minutes), and read_committed readers of the
// partition stop at its first offset — the chaos run's forced replay: the
// mirror of the other direction stuck at 0 of 7,015. AbortLeftOpen aborts
// it: the partition's last stable offset reaches its end.
func TestAbortLeftOpen(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const topic = "left-open"
	createTopic(t, a, topic, 1, nil)
	tx := txnClient(t, "left-open-tx")
	begin(t, tx)
	produceN(t, tx, topic, 0, 3, 1, "txn")
	end(t, tx, true) // the source: data at 0..2, COMMIT at 3
	waitCrash(t, startChild(t, topic, "FERRY_MIRROR_CRASH=commit:1"))

	adm := kadm.NewClient(newClient(t, s))
	ends := func() (end, stable int64) {
		e, err1 := adm.ListEndOffsets(ctx, topic)
		c, err2 := adm.ListCommittedOffsets(ctx, topic)
		if err1 != nil || err2 != nil || e.Error() != nil || c.Error() != nil {
			t.Logf("listing the standby's offsets: %v, %v, %v, %v", err1, err2, e.Error(), c.Error())
			return -1, -1
		}
		eo, _ := e.Lookup(topic, 0)
		co, _ := c.Lookup(topic, 0)
		return eo.Offset, co.Offset
	}
	end, stable := ends()
	if end < 1 || stable >= end {
		t.Fatalf("after the writer was killed inside its transaction: end %d, last stable %d; want a transaction open below the end", end, stable)
	}

	aborted, err := AbortLeftOpen(ctx, newClient(t, s, kgo.ClientID("abort")), DefaultTransactionalIDPrefix)
	if err != nil || len(aborted) == 0 {
		t.Fatalf("AbortLeftOpen: %v, %v", aborted, err)
	}
	// The ABORT marker at the old end.
	testwait.Eventually(t, 30*time.Second, fmt.Sprintf("after AbortLeftOpen %v: end and last stable %d", aborted, end+1), func() error {
		if e, st := ends(); e != end+1 || st != e {
			return fmt.Errorf("end %d, last stable %d", e, st)
		}
		return nil
	})
}
