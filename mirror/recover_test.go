package mirror

import (
	"context"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// waitCrash waits for a child that kills itself (FERRY_MIRROR_CRASH).
func waitCrash(t *testing.T, child *exec.Cmd) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("mirror child ended with %v, want SIGKILL", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("mirror child did not reach its crash point")
	}
}

// openWriterTxns returns the partition's writer transactional IDs that
// have a transaction open on the standby.
func openWriterTxns(t *testing.T, topic string, partition int32) []string {
	t.Helper()
	_, s := clusters(t)
	adm := kadm.NewClient(newClient(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for i := range 4 {
		ids = append(ids, fmt.Sprintf("ferry-mirror.%s.%d.%d", topic, partition, i))
	}
	ds, err := adm.DescribeTransactions(ctx, ids...)
	if err != nil {
		t.Fatal(err)
	}
	var open []string
	for _, id := range ids {
		if d := ds[id]; d.Err == nil && d.State == "Ongoing" {
			open = append(open, id)
		}
	}
	return open
}

// TestMirrorKillInTxn: the mirror is killed -9 inside its own
// transactions — after the last batch of a committed source transaction and
// before its COMMIT, inside an aborted one, inside a filler transaction —
// and restarted: the restarted writer resumes each open transaction and
// ends it at the source marker's offset, so every marker on the standby has
// the source's type at the source's offset and both isolation levels read
// the same records.
func TestMirrorKillInTxn(t *testing.T) {
	a, _ := clusters(t)
	const topic, gapTopic = "crash-txn", "crash-gap"
	createTopic(t, a, topic, 1, nil)
	createTopic(t, a, gapTopic, 1, nil)
	ta, tb := txnClient(t, "crash-ta"), txnClient(t, "crash-tb")
	plain := newClient(t, a, manualPartitioner())
	round := func(tag string) {
		begin(t, ta)
		produceN(t, ta, topic, 0, 3, 1, tag+"-c")
		end(t, ta, true)
		begin(t, ta)
		produceN(t, ta, topic, 0, 3, 1, tag+"-a")
		end(t, ta, false)
		begin(t, ta)
		begin(t, tb)
		produceN(t, ta, topic, 0, 1, 1, tag+"-ta")
		produceN(t, tb, topic, 0, 2, 1, tag+"-tb")
		produceN(t, plain, topic, 0, 2, 1, tag+"-plain")
		produceN(t, ta, topic, 0, 1, 1, tag+"-ta")
		end(t, tb, false)
		end(t, ta, true)
	}
	for i := range 3 {
		round(fmt.Sprint("r", i))
	}
	// Killed before its 2nd COMMIT, then before its 2nd ABORT (of a source
	// transaction), then resumed to the end.
	for _, crash := range []string{"commit:2", "abort:2"} {
		waitCrash(t, startChild(t, topic, "FERRY_MIRROR_CRASH="+crash))
		if open := openWriterTxns(t, topic, 0); len(open) == 0 {
			t.Fatalf("after the crash at %s no writer transaction is open", crash)
		}
	}
	round("live")
	child := startChild(t, topic)
	waitEqualEnds(t, topic, 1)
	sameBatches(t, topic, 0)
	unc, com := sameRecords(t, topic, 0)
	if len(unc) != 4*12 || len(com) != 4*7 {
		t.Fatalf("%d read_uncommitted, %d read_committed records; want 48 and 28", len(unc), len(com))
	}
	_ = child.Process.Signal(syscall.SIGTERM)

	// A raised source log start: the writer fills below it in a filler
	// transaction; killed before that transaction's ABORT.
	produceN(t, plain, gapTopic, 0, 100, 10, "gap")
	adm := kadm.NewClient(plain)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var o kadm.Offsets
	o.AddOffset(gapTopic, 0, 63, -1)
	if _, err := adm.DeleteRecords(ctx, o); err != nil {
		t.Fatal(err)
	}
	waitCrash(t, startChild(t, gapTopic, "FERRY_MIRROR_CRASH=abort:1"))
	if open := openWriterTxns(t, gapTopic, 0); len(open) != 1 {
		t.Fatalf("after the crash in the filler transaction, open writer transactions: %v", open)
	}
	startChild(t, gapTopic)
	waitEqualEnds(t, gapTopic, 1)
	eventually2(t, 30*time.Second, "standby log start raised", func() error {
		if start, _ := offsetsOf(t, standby, gapTopic, 0); start != 63 {
			return fmt.Errorf("standby log start %d", start)
		}
		return nil
	})
	sameBatches(t, gapTopic, 0)
	sameRecords(t, gapTopic, 0)
}
