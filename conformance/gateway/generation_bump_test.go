package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
)

// TestGenerationBumpMidTraffic: the routing generation advances on the
// same active cluster while producers write, which is what a switch does
// to every producer ID clients hold. A franz-go idempotent producer writing
// throughout gets no error and every record it had acknowledged is in the
// log once, in the order produced per partition; a transactional producer
// gets only errors it recovers from by aborting, and its transactions
// commit again; a read_committed consumer sees every committed record and
// no aborted one.
func TestGenerationBumpMidTraffic(t *testing.T) {
	c := cluster(t)
	table := routing.NewTable(routing.State{Generation: 1, Active: "primary"})
	f := ferrytest.Start(t, c.Bootstrap(), proxy.WithRoutingTable(table))
	adm := kadm.NewClient(client(t, f.Addr))
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	const topic = "generation-bump"
	createTopic(t, adm, topic, 3, nil)

	var bumped atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup

	// The idempotent producer: records 0, 1, 2... as fast as they are
	// acknowledged, a few hundred in flight.
	idem := client(t, f.Addr, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(2*time.Millisecond), kgo.MaxBufferedRecords(500))
	var (
		mu          sync.Mutex
		acked       = map[string]*kgo.Record{}
		idemErrs    []error
		afterBump   atomic.Int64
		idemWritten int
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				idemWritten = i
				return
			default:
			}
			r := &kgo.Record{Key: []byte(fmt.Sprintf("i-%07d", i)), Value: []byte(fmt.Sprintf("idem-%d", i))}
			after := bumped.Load()
			idem.Produce(ctx, r, func(r *kgo.Record, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					idemErrs = append(idemErrs, fmt.Errorf("record %s: %w", r.Key, err))
					return
				}
				acked[string(r.Key)] = r
				if after {
					afterBump.Add(1)
				}
			})
		}
	}()

	// The transactional producer: transactions of 10 records; on any
	// error, abort and go on. Which errors it met, and the commits after
	// the bump, are checked below.
	txn := client(t, f.Addr, kgo.DefaultProduceTopic(topic), kgo.TransactionalID("generation-bump"))
	var (
		committed      = produced{}
		aborted        = map[string]bool{}
		txnErrs        []error
		commits        atomic.Int64
		commitsAfter   atomic.Int64
		txnEnded       atomic.Bool // the transactional producer's goroutine returned
		abortsFinished int
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer txnEnded.Store(true)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			after := bumped.Load()
			if err := txn.BeginTransaction(); err != nil {
				txnErrs = append(txnErrs, fmt.Errorf("begin: %w", err))
				return
			}
			var recs []*kgo.Record
			var failed error
			for i := 0; i < 10; i++ {
				r := &kgo.Record{Key: []byte(fmt.Sprintf("t-%05d-%02d", n, i)), Value: []byte("txn")}
				recs = append(recs, r)
				txn.Produce(ctx, r, func(_ *kgo.Record, err error) {
					if err != nil {
						mu.Lock()
						if failed == nil {
							failed = err
						}
						mu.Unlock()
					}
				})
			}
			if err := txn.Flush(ctx); err != nil {
				txnErrs = append(txnErrs, fmt.Errorf("flush: %w", err))
				return
			}
			end := kgo.TryCommit
			if failed != nil {
				txnErrs = append(txnErrs, fmt.Errorf("produce: %w", failed))
				end = kgo.TryAbort
			}
			err := txn.EndTransaction(ctx, end)
			if err != nil && end == kgo.TryCommit {
				txnErrs = append(txnErrs, fmt.Errorf("commit: %w", err))
				end = kgo.TryAbort
				err = txn.EndTransaction(ctx, kgo.TryAbort)
			}
			if err != nil {
				txnErrs = append(txnErrs, fmt.Errorf("abort, fatal: %w", err))
				return
			}
			for _, r := range recs {
				if end == kgo.TryCommit {
					committed[string(r.Key)] = r
				} else {
					aborted[string(r.Key)] = true
				}
			}
			if end == kgo.TryAbort {
				abortsFinished++
			} else {
				commits.Add(1)
				if after {
					commitsAfter.Add(1)
				}
			}
		}
	}()

	// Each wait below is bounded by what is left of the test's context.
	dl, _ := ctx.Deadline()
	// Before the bump, the transactional producer holds a producer ID and
	// has committed with it, so the bump finds it mid-transaction or
	// about to begin one with that ID.
	testwait.Until(t, time.Until(dl), "records before the bump", func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) > 2000 })
	testwait.Until(t, time.Until(dl), "a transaction committed before the bump", func() bool { return commits.Load() > 0 || txnEnded.Load() })
	if !table.Advance(routing.State{Generation: 2, Active: "primary"}) {
		t.Fatal("the table refused generation 2")
	}
	bumped.Store(true)
	testwait.Until(t, time.Until(dl), "records after the bump", func() bool { return afterBump.Load() > 2000 })
	// Transactions after the bump: the first may take a while (a
	// CONCURRENT_TRANSACTIONS answer to a KIP-890 produce makes franz-go
	// retry after its next metadata refresh, up to 5 s later).
	testwait.Until(t, time.Until(dl), "two transactions committed after the bump", func() bool { return commitsAfter.Load() >= 2 || txnEnded.Load() })
	close(stop)
	wg.Wait()
	if err := idem.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	if len(idemErrs) > 0 {
		t.Fatalf("the idempotent producer got %d errors, first %v", len(idemErrs), idemErrs[0])
	}
	if len(acked) != idemWritten {
		t.Fatalf("%d of %d idempotent records acknowledged", len(acked), idemWritten)
	}
	for _, err := range txnErrs {
		switch {
		case errors.Is(err, kerr.UnknownProducerID), errors.Is(err, kerr.TransactionAbortable), errors.Is(err, kerr.OperationNotAttempted):
		default:
			t.Fatalf("the transactional producer got %v, not an error it recovers from by aborting", err)
		}
	}
	if commitsAfter.Load() < 2 {
		t.Fatalf("%d transactions committed after the bump, want at least 2 (errors %v)", commitsAfter.Load(), txnErrs)
	}
	t.Logf("idempotent: %d records; transactional: %d committed (%d after the bump), %d aborted transactions, errors %v",
		len(acked), len(committed)/10, commitsAfter.Load(), abortsFinished, txnErrs)

	// Every acknowledged record once, in produced order per partition.
	cons := client(t, f.Addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	seen := map[string]bool{}
	last := map[int32]string{}
	for len(seen) < len(acked)+len(committed) {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records", len(seen), len(acked)+len(committed))
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			k := string(r.Key)
			if aborted[k] {
				t.Fatalf("read_committed consumer saw aborted record %s", k)
			}
			if seen[k] {
				t.Fatalf("record %s is in the log twice", k)
			}
			seen[k] = true
			if w := acked[k]; w != nil {
				if w.Partition != r.Partition || w.Offset != r.Offset {
					t.Fatalf("record %s at %d/%d, acknowledged at %d/%d", k, r.Partition, r.Offset, w.Partition, w.Offset)
				}
				if k <= last[r.Partition] {
					t.Fatalf("partition %d: record %s after %s", r.Partition, k, last[r.Partition])
				}
				last[r.Partition] = k
			} else if committed[k] == nil {
				t.Fatalf("record %s was never acknowledged (partition %d offset %d)", k, r.Partition, r.Offset)
			}
		})
	}
}
