package mirror

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
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
	testwait.Eventually(t, 30*time.Second, "standby log start raised", func() error {
		if start, _ := offsetsOf(t, standby, gapTopic, 0); start != 63 {
			return fmt.Errorf("standby log start %d", start)
		}
		return nil
	})
	sameBatches(t, gapTopic, 0)
	sameRecords(t, gapTopic, 0)
}

// crashReframedEnv makes a mirror child (runChild) SIGKILL itself inside
// the writer transaction that carries a transactional source batch with
// holes inside it whose first record the cleaner removed (so the writer
// transaction's first batch, a run, does not start at the source batch's
// base offset): "run", right after the standby acknowledged a run that is
// neither the first nor the last of the batch; "filler", just before the
// ABORT of a filler transaction in the holes between two runs (two writer
// transactions open, the later one starting with a filler).
const crashReframedEnv = "FERRY_MIRROR_CRASH_REFRAMED"

func init() {
	mode := os.Getenv(crashReframedEnv)
	if mode == "" || os.Getenv(childEnv) == "" {
		return
	}
	crash := func(why string) {
		fmt.Fprintln(os.Stderr, "test: crashing", why)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	var betweenRuns atomic.Bool
	testHookRunWritten = func(_ string, b protocol.Batch, i, n int, txn bool) error {
		inside := txn && i < n-1 && !b.HasRecordAt(b.BaseOffset())
		if mode == "run" && inside && i >= 1 {
			crash(fmt.Sprintf("after run %d of %d of the source batch %d..%d", i+1, n, b.BaseOffset(), b.NextOffset()-1))
		}
		betweenRuns.Store(inside)
		return nil
	}
	testHookEndTxn = func(commit bool) {
		if mode == "filler" && !commit && betweenRuns.Load() {
			crash("before the ABORT of a filler transaction between runs")
		}
	}
}

// TestMirrorKillInReframedTxn: a compacted topic of committed source
// transactions, one batch each, that the real log cleaner left with holes
// inside (uncompressed, and zstd). The writer copies such a batch as runs
// inside a writer transaction, with fillers in the holes. The mirror is
// killed -9 after a run that is not the first of its batch, restarted and
// killed again before the ABORT of a filler transaction between two runs,
// then restarted in this process: the open writer transactions, whose first
// batches are a run not at its source batch's base offset and a filler
// inside the batch, are resumed from the right run, nothing halts, every
// source record is on the standby at its offset for both isolation levels,
// and every source marker is on the standby at its offset with its type.
func TestMirrorKillInReframedTxn(t *testing.T) {
	topics := []compactedTopic{
		{"compacted-txn", kgo.NoCompression(), protocol.CompressionNone, true},
		{"compacted-txn-zstd", kgo.ZstdCompression(), protocol.CompressionZstd, true},
	}
	produceCompacted(t, topics, 3)
	a, _ := clusters(t)
	var names []string
	for _, tp := range topics {
		names = append(names, tp.name)
		headless := 0
		for _, b := range rawBatches(t, a, tp.name, 0) {
			if b.IsTransactional() && !b.IsControl() && !b.HasConsecutiveOffsets() && !b.HasRecordAt(b.BaseOffset()) {
				headless++
			}
		}
		if headless < 2 {
			t.Fatalf("%s: %d transactional batches with holes inside lost their first record, want 2", tp.name, headless)
		}
		for _, mode := range []string{"run", "filler"} {
			waitCrash(t, startChild(t, tp.name, crashReframedEnv+"="+mode))
			if open := openWriterTxns(t, tp.name, 0); len(open) == 0 {
				t.Fatalf("%s: after the crash (%s) no writer transaction is open", tp.name, mode)
			}
		}
		if open := openWriterTxns(t, tp.name, 0); len(open) != 2 {
			t.Fatalf("%s: open writer transactions after the crash in a filler transaction: %v, want the source batch's and the filler's", tp.name, open)
		}
	}

	m := startMirror(t, Topics(names, nil))
	waitCaughtUp(t, m, names...)
	noHalts(t, m)
	if n := testutil.ToFloat64(m.metrics.resumedTxns); n < float64(2*len(topics)) {
		t.Fatalf("%v writer transactions resumed, want at least %d", n, 2*len(topics))
	}
	for _, tp := range topics {
		if open := openWriterTxns(t, tp.name, 0); len(open) != 0 {
			t.Fatalf("%s: writer transactions still open: %v", tp.name, open)
		}
		sourceRecordsOnStandby(t, tp.name)
		if n := sameMarkers(t, tp.name); n == 0 {
			t.Fatalf("%s: no source COMMIT marker compared", tp.name)
		}
	}
}

// sameMarkers fails unless every transaction marker the source holds is on
// the standby at its offset with its type, and returns how many COMMITs
// there were.
func sameMarkers(t *testing.T, topic string) int {
	t.Helper()
	a, s := clusters(t)
	dst := make(map[int64]protocol.Batch)
	for _, b := range rawBatches(t, s, topic, 0) {
		if b.IsControl() {
			dst[b.BaseOffset()] = b
		}
	}
	commits := 0
	for _, b := range rawBatches(t, a, topic, 0) {
		if !b.IsControl() {
			continue
		}
		d := dst[b.BaseOffset()]
		if d == nil {
			t.Fatalf("%s: source marker at %d, standby has none there", topic, b.BaseOffset())
		}
		st, _ := protocol.ControlType(b)
		dt, _ := protocol.ControlType(d)
		if st != dt {
			t.Fatalf("%s: source marker at %d is type %d, standby's %d", topic, b.BaseOffset(), st, dt)
		}
		if st == protocol.ControlCommit {
			commits++
		}
	}
	return commits
}
