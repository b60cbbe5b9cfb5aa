package main

// A franz-go transactional producer and a read_committed consumer running
// through Ferry across switchovers (TestPlannedSwitchoverAndBackRealKafka),
// and the checks of what they leave on both clusters.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
)

// txnRecords is how many records each transaction produces, round the
// partitions; every txnAbortEvery-th transaction is aborted on purpose.
const txnRecords, txnAbortEvery = 6, 4

// txnTraffic is a franz-go transactional producer, run as an application
// runs one, and a read_committed consumer (no group), both through Ferry.
// The producer begins a transaction, produces txnRecords records in two
// rounds (flushing after each) and commits; every txnAbortEvery-th
// transaction it aborts instead. On an error from a produce or from
// EndTransaction that franz-go documents as recoverable (txnAbortable) it
// aborts and begins a new transaction; on any other, or if the abort or the
// next BeginTransaction fails, it stops: fatal.
type txnTraffic struct {
	t      *testing.T
	topic  string
	parts  int32
	window atomic.Int32 // 0 before the first switch, w from the start of switch w on

	mu        sync.Mutex
	txns      []*txnRun // by transaction number
	fatal     error
	seen      map[partOffset]string // read through Ferry, by offset
	reread    []string              // offsets read through Ferry more than once
	fetchErrs []string

	prodStop, prodDone chan struct{}
	consStop, consDone chan struct{}
}

// txnRun is one transaction as the application saw it.
type txnRun struct {
	began     time.Time
	ended     time.Time
	window    int                   // the window when it ended
	committed bool                  // EndTransaction(TryCommit) returned nil
	errs      []error               // the errors it was aborted after
	acked     map[partOffset]string // its records, where their promises put them
}

// txnAbortable is whether franz-go documents err, from a transactional
// produce or EndTransaction, as one to abort after and carry on in a new
// transaction: retriable errors, OperationNotAttempted (a commit not tried
// since the producer ID had failed: "retry EndTransaction with TryAbort"),
// TransactionAbortable and UnknownProducerID (under KIP-890 part 2 the
// only broker codes BeginTransaction recovers from; InvalidProducerEpoch,
// the code of a fenced producer, is fatal there).
func txnAbortable(err error) bool {
	return kerr.IsRetriable(err) || errors.Is(err, kerr.OperationNotAttempted) ||
		errors.Is(err, kerr.TransactionAbortable) || errors.Is(err, kerr.UnknownProducerID)
}

func startTxnTraffic(t *testing.T, addr, topic string, parts int32, txnID string) *txnTraffic {
	tt := &txnTraffic{t: t, topic: topic, parts: parts, seen: map[partOffset]string{},
		prodStop: make(chan struct{}), prodDone: make(chan struct{}), consStop: make(chan struct{}), consDone: make(chan struct{})}
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(2*time.Minute))
	cons := newClient(t, kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	go tt.produce(prod)
	go tt.consume(cons)
	t.Cleanup(tt.stop)
	return tt
}

func (tt *txnTraffic) produce(cl *kgo.Client) {
	defer close(tt.prodDone)
	// Never canceled: a canceled EndTransaction leaves its outcome unknown.
	ctx := context.Background()
	for i := 0; ; i++ {
		select {
		case <-tt.prodStop:
			return
		default:
		}
		run := &txnRun{began: time.Now(), acked: map[partOffset]string{}}
		fatal := func(what string, err error) {
			tt.mu.Lock()
			defer tt.mu.Unlock()
			run.ended, run.window = time.Now(), int(tt.window.Load())
			tt.txns = append(tt.txns, run)
			tt.fatal = fmt.Errorf("transaction %d (window %d): %s: %w", i, run.window, what, err)
		}
		if err := cl.BeginTransaction(); err != nil {
			fatal("BeginTransaction", err)
			return
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var produceErr error
		for k := range txnRecords {
			v := fmt.Sprintf("t%06d-%d", i, k)
			wg.Add(1)
			cl.Produce(ctx, &kgo.Record{Partition: int32(k) % tt.parts, Value: []byte(v)}, func(r *kgo.Record, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if produceErr == nil {
						produceErr = fmt.Errorf("produce: %w", err)
					}
					return
				}
				run.acked[partOffset{r.Partition, r.Offset}] = v
			})
			if k == txnRecords/2-1 || k == txnRecords-1 {
				// In two rounds: a transaction has two batches on
				// each partition (the mirror copies the first as
				// plain data once it knows the transaction committed).
				if err := cl.Flush(ctx); err != nil {
					fatal("Flush", err)
					return
				}
			}
		}
		wg.Wait()
		err := produceErr
		if err == nil && i%txnAbortEvery != txnAbortEvery-1 {
			if err = cl.EndTransaction(ctx, kgo.TryCommit); err == nil {
				run.committed = true
			} else {
				err = fmt.Errorf("EndTransaction(TryCommit): %w", err)
			}
		}
		if !run.committed {
			if err != nil {
				run.errs = append(run.errs, err)
				if !txnAbortable(err) {
					fatal("not abortable", err)
					return
				}
			}
			if err := cl.AbortBufferedRecords(ctx); err != nil {
				fatal("AbortBufferedRecords", err)
				return
			}
			if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
				// Documented: an abortable abort is retried by the next
				// BeginTransaction, which recovers the producer ID or
				// fails.
				err = fmt.Errorf("EndTransaction(TryAbort): %w", err)
				run.errs = append(run.errs, err)
				if !txnAbortable(err) {
					fatal("not abortable", err)
					return
				}
			}
		}
		tt.mu.Lock()
		run.ended, run.window = time.Now(), int(tt.window.Load())
		tt.txns = append(tt.txns, run)
		tt.mu.Unlock()
	}
}

func (tt *txnTraffic) consume(cl *kgo.Client) {
	defer close(tt.consDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-tt.consStop; cancel() }()
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		tt.mu.Lock()
		fs.EachError(func(topic string, p int32, err error) {
			if ctx.Err() == nil {
				tt.fetchErrs = append(tt.fetchErrs, fmt.Sprintf("%s[%d]: %v", topic, p, err))
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			at := partOffset{r.Partition, r.Offset}
			if prev, ok := tt.seen[at]; ok {
				tt.reread = append(tt.reread, fmt.Sprintf("%d/%d=%s (%s before)", at.partition, at.offset, r.Value, prev))
				return
			}
			tt.seen[at] = string(r.Value)
		})
		tt.mu.Unlock()
	}
}

func (tt *txnTraffic) stopProducing() {
	select {
	case <-tt.prodStop:
	default:
		close(tt.prodStop)
	}
	<-tt.prodDone
}

func (tt *txnTraffic) stop() {
	tt.stopProducing()
	select {
	case <-tt.consStop:
	default:
		close(tt.consStop)
	}
	<-tt.consDone
}

// waitCommitted waits until n transactions begun after since have
// committed, failing at once if the producer stopped on a fatal error.
func (tt *txnTraffic) waitCommitted(since time.Time, n int, timeout time.Duration) {
	tt.t.Helper()
	testwait.Eventually(tt.t, timeout, fmt.Sprintf("%d transactions committed", n), func() error {
		tt.mu.Lock()
		fatal, got, aborted := tt.fatal, 0, 0
		for _, r := range tt.txns {
			if r.began.After(since) {
				if r.committed {
					got++
				} else {
					aborted++
				}
			}
		}
		tt.mu.Unlock()
		if fatal != nil {
			tt.t.Fatalf("transactional producer: %v", fatal)
		}
		if got < n {
			return fmt.Errorf("%d committed, %d aborted; %s", got, aborted, tt.report())
		}
		return nil
	})
}

// firstCommitAfter is how long after t the first transaction begun after it
// had committed, as the producer saw it; -1 if none has.
func (tt *txnTraffic) firstCommitAfter(t time.Time) time.Duration {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	for _, r := range tt.txns {
		if r.committed && r.began.After(t) {
			return r.ended.Sub(t)
		}
	}
	return -1
}

// report tells, per window, how many transactions committed, were
// aborted on purpose, and were aborted after an error (with the errors).
func (tt *txnTraffic) report() string {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	type counts struct {
		committed, aborted, failed int
		errs                       []string
	}
	ws := map[int]*counts{}
	for _, r := range tt.txns {
		c := ws[r.window]
		if c == nil {
			c = &counts{}
			ws[r.window] = c
		}
		switch {
		case r.committed:
			c.committed++
		case len(r.errs) > 0:
			c.failed++
			for _, err := range r.errs {
				c.errs = append(c.errs, shortErr(err))
			}
		default:
			c.aborted++
		}
	}
	var b strings.Builder
	for w := 0; w <= int(tt.window.Load()); w++ {
		c := ws[w]
		if c == nil {
			c = &counts{}
		}
		fmt.Fprintf(&b, "window %d: %d committed, %d aborted on purpose, %d aborted after %d errors %q; ", w, c.committed, c.aborted, c.failed, len(c.errs), c.errs)
	}
	fmt.Fprintf(&b, "read through Ferry: %d records, %d re-read, fetch errors %q", len(tt.seen), len(tt.reread), tt.fetchErrs[:min(5, len(tt.fetchErrs))])
	if tt.fatal != nil {
		fmt.Fprintf(&b, "; stopped on %v", tt.fatal)
	}
	return b.String()
}

// checkErrors: the producer never stopped on an error; it got no error
// before the first switch and at most one per switch (its records' produce
// errors count once). A fatal one would mean franz-go was told something it
// does not recover from (e.g. INVALID_PRODUCER_EPOCH under KIP-890); more
// than one per switch, that Ferry refused more than the first request
// carrying the old generation's producer ID (the abort that follows, or
// what the abort's new producer ID carries), or that a transaction ended
// without error before the switch failed after it.
func (tt *txnTraffic) checkErrors() {
	tt.t.Helper()
	tt.mu.Lock()
	fatal := tt.fatal
	errs := map[int][]string{}
	for _, r := range tt.txns {
		for _, err := range r.errs {
			errs[r.window] = append(errs[r.window], shortErr(err))
		}
	}
	tt.mu.Unlock()
	if fatal != nil {
		tt.t.Fatalf("transactional producer: %v", fatal)
	}
	for w := range int(tt.window.Load()) + 1 {
		if es := errs[w]; w == 0 && len(es) > 0 || len(es) > 1 {
			tt.t.Errorf("%d errors in window %d (0: before the first switch): %q; want none before the first switch and at most one per switch", len(es), w, es)
		}
	}
}

// shortErr is err with a Kafka error's description left out.
func shortErr(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return strings.Replace(err.Error(), ke.Error(), ke.Message, 1)
	}
	return err.Error()
}

// txnOf is the transaction number a value names (t<N>-<k>), or -1.
func txnOf(v string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(strings.SplitN(v, "-", 2)[0], "t"))
	if err != nil || !strings.HasPrefix(v, "t") {
		return -1
	}
	return n
}

// checkRecords compares records read by offset (on: read_committed, from a
// cluster directly or through Ferry) with what the producer was told: every
// record of a committed transaction is there at the offset its promise
// reported, and nothing else is: no record of an aborted transaction (Ferry
// or the mirror let an abort through as a commit, or the mirror copied
// records without their abort marker), no second copy of a committed one
// (a batch written twice, e.g. resent under a new producer ID after a
// switch), no record at another offset than acknowledged (offsets differ
// between the clusters), no filler (Ferry shows a client the mirror's). It
// returns how many committed records there are.
func (tt *txnTraffic) checkRecords(where string, on map[partOffset]string) int {
	tt.t.Helper()
	tt.mu.Lock()
	defer tt.mu.Unlock()
	want := 0
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 5 {
			tt.t.Errorf(where+": "+format, args...)
		}
	}
	for i, r := range tt.txns {
		if !r.committed {
			continue
		}
		if len(r.acked) != txnRecords {
			report("transaction %d committed with %d of its %d records acknowledged", i, len(r.acked), txnRecords)
		}
		for at, v := range r.acked {
			want++
			if got, ok := on[at]; !ok || got != v {
				report("%s of committed transaction %d acknowledged at %d/%d; a read_committed reader finds %q there", v, i, at.partition, at.offset, got)
			}
		}
	}
	ats := make([]partOffset, 0, len(on))
	for at := range on {
		ats = append(ats, at)
	}
	sort.Slice(ats, func(i, j int) bool {
		return ats[i].partition < ats[j].partition || ats[i].partition == ats[j].partition && ats[i].offset < ats[j].offset
	})
	for _, at := range ats {
		v := on[at]
		n := txnOf(v)
		switch {
		case n < 0 || n >= len(tt.txns):
			report("a read_committed reader finds %q at %d/%d, of no transaction the producer ended", v, at.partition, at.offset)
		case !tt.txns[n].committed:
			report("a read_committed reader finds %q at %d/%d, of aborted transaction %d (errors %v)", v, at.partition, at.offset, n, tt.txns[n].errs)
		case tt.txns[n].acked[at] != v:
			report("a read_committed reader finds %q at %d/%d; committed, acknowledged elsewhere", v, at.partition, at.offset)
		}
	}
	if bad > 5 {
		tt.t.Errorf("%s: %d discrepancies in all", where, bad)
	}
	return want
}

// waitConsumed waits until the consumer through Ferry has read every
// record of every committed transaction (by offset).
func (tt *txnTraffic) waitConsumed(timeout time.Duration) {
	tt.t.Helper()
	testwait.Eventually(tt.t, timeout, "the read_committed consumer through Ferry to read every committed record", func() error {
		tt.mu.Lock()
		defer tt.mu.Unlock()
		missing := 0
		var example string
		for i, r := range tt.txns {
			if !r.committed {
				continue
			}
			for at := range r.acked {
				if _, ok := tt.seen[at]; !ok {
					if missing++; missing == 1 {
						example = fmt.Sprintf("%d/%d of transaction %d", at.partition, at.offset, i)
					}
				}
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d committed records not read, e.g. %s", missing, example)
		}
		return nil
	})
}

// checkConsumed: the consumer through Ferry read exactly what was committed
// (checkRecords), each offset once: a consumer without a group keeps its
// position across a switch (Ferry answers its OffsetForLeaderEpoch from the
// end offsets recorded at the flip); a re-read would mean its position was
// reset.
func (tt *txnTraffic) checkConsumed() int {
	tt.t.Helper()
	tt.mu.Lock()
	seen := make(map[partOffset]string, len(tt.seen))
	for at, v := range tt.seen {
		seen[at] = v
	}
	reread := tt.reread
	tt.mu.Unlock()
	if len(reread) > 0 {
		tt.t.Errorf("through Ferry: %d offsets read twice, e.g. %v", len(reread), reread[:min(5, len(reread))])
	}
	return tt.checkRecords("through Ferry", seen)
}

// readCommittedOn reads topic directly from a cluster, read_committed, up to
// end offsets ends (taken once no transaction is open on it), and returns
// its records by offset, transaction markers and the mirror's fillers
// (which Ferry hides from its clients) left out.
func readCommittedOn(t *testing.T, ctx context.Context, addrs []string, topic string, ends map[int32]int64) map[partOffset]string {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	defer cl.Close()
	left := map[int32]int64{}
	for p, e := range ends {
		if e > 0 {
			left[p] = e
		}
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out := map[partOffset]string{}
	for len(left) > 0 {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			t.Fatalf("reading %s on %v read_committed: partitions short of their end offsets: %v", topic, addrs, left)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() && !bytes.Equal(r.Key, protocol.FillerKey) {
				out[partOffset{r.Partition, r.Offset}] = string(r.Value)
			}
			if e, ok := left[r.Partition]; ok && r.Offset+1 >= e {
				delete(left, r.Partition)
			}
		})
	}
	return out
}
