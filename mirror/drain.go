package mirror

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// LagError is a Drain that ended with partitions still behind.
type LagError struct {
	// Partitions are "topic[partition]: standby N of M".
	Partitions []string
}

func (e *LagError) Error() string { return fmt.Sprintf("mirror: still lagging: %v", e.Partitions) }

// openTxnGrace is how long Drain lets transactions that are open on the
// source end by themselves before it aborts them: long enough for one whose
// records were all acknowledged to send its EndTxn (which the hold lets
// through), short against the switch's own budget. One whose next produce
// is held cannot end, and is aborted.
const openTxnGrace = time.Second

// Drain returns once the standby holds every offset the source holds, for
// every mirrored partition: the standby's end equals the source's high
// watermark, no transaction is open on a mirrored partition (its last
// stable offset is its high watermark: the writers copy only decided data,
// and a marker the coordinator writes after EndTxn has landed; and no
// coordinator lists one open or ending that writes to a mirrored topic,
// which a transaction with nothing written yet is only there), and two
// reads in a row agree. A transaction only on topics not mirrored is none
// of the switch's business. The switchover calls it with client writes held (EndTxn aside),
// so the source stops moving.
//
// Transactions still open after openTxnGrace (or half of ctx's time, when
// that is shorter) that Ferry carries (WithTxnCarrier) are aborted on the
// source by fencing their transactional IDs: their producers are gone or
// held, and a half transaction must not be left for read_committed readers
// on either side. One Ferry does not carry is a writer beside it, not
// held: Drain waits for it to end, and names it if it does not.
// On ctx's end Drain returns a *LagError naming what still lags; a
// partition halted in this member fails it at once.
//
// Both ends are read from the clusters, so Drain judges every mirrored
// partition, whichever member's writer mirrors it (WithOwnership): the
// switchover calls it on one member. A partition halted on another member
// is not seen here; it lags, and ends Drain with a *LagError naming it.
func (m *Mirror) Drain(ctx context.Context) error {
	grace := openTxnGrace
	if dl, ok := ctx.Deadline(); ok {
		grace = min(grace, time.Until(dl)/2)
	}
	abortAt := time.Now().Add(grace)
	aborted := false
	var prev map[topicPartition]sourceEnd
	var prevDst kadm.ListedOffsets // the standby's ends read last round, if then no partition lagged
	prevOpen := false              // last round's ends had a transaction open
	var lag, stillOpen []string
	type listedTxns struct {
		txns []OpenTxn
		err  error
	}
	for {
		// A round that follows one with nothing lagging or open most
		// likely ends the drain: the open transactions it then lists
		// are listed at once with the ends (a round trip to a source a
		// region away).
		var txnsAhead chan listedTxns
		if prevDst != nil && !prevOpen {
			txnsAhead = make(chan listedTxns, 1)
			mirrored := mirroredTopics(prev)
			go func() {
				txns, err := m.openTxns(ctx, mirrored, "Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
				txnsAhead <- listedTxns{txns, err}
			}()
		}
		ends, err := m.sourceEnds(ctx, prev)
		if err != nil {
			err = fmt.Errorf("source end offsets: %w", err)
		}
		var dst kadm.ListedOffsets
		switch {
		case err == nil && prevDst != nil && sameEnds(prev, ends):
			// The standby held these ends last round, and an end
			// never goes back: not read again (a round trip to a
			// standby a region away, twice a drain).
			dst = prevDst
		case err == nil:
			if dst, err = m.standbyEnds(ctx, ends); err != nil {
				err = fmt.Errorf("standby end offsets: %w", err)
			}
		}
		prevDst = nil
		var ahead *listedTxns
		if txnsAhead != nil {
			a := <-txnsAhead
			ahead = &a
		}
		if err == nil {
			var open bool
			lag, open, err = m.lagging(ends, dst)
			if err != nil {
				return err
			}
			if len(lag) == 0 {
				prevDst = dst
			}
			prevOpen = open
			if len(lag) == 0 && !open && sameEnds(prev, ends) {
				// A transaction can be open with nothing written yet (its
				// partitions added, its produce held): the coordinator
				// would abort it at its timeout, writing markers on the
				// old cluster after the switch, at offsets the new one
				// fills with other records. It is open too. (Listed
				// after the last round's ends, as the ends of this one:
				// the same topics.)
				var txns []OpenTxn
				var err error
				if ahead != nil {
					txns, err = ahead.txns, ahead.err
				} else {
					txns, err = m.openTxns(ctx, mirroredTopics(ends), "Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
				}
				if err != nil {
					m.log.Warn("listing the transactions open on the source", zap.Error(err))
				}
				if err == nil && len(txns) == 0 {
					return nil
				}
				open = err == nil
				stillOpen = txnIDs(txns)
			}
			if open && !aborted && time.Now().After(abortAt) {
				aborted = true
				if err := m.abortOpen(ctx, mirroredTopics(ends)); err != nil {
					m.log.Warn("aborting open transactions on the source", zap.Error(err))
				}
			}
			prev = ends
		}
		if sleep(ctx, 25*time.Millisecond) != nil {
			if len(lag) == 0 && err != nil {
				lag = []string{err.Error()}
			}
			if prev != nil {
				// Named: one Ferry does not carry (a writer beside it
				// on a mirrored topic) is waited for, never fenced.
				lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				stillOpen = nil
				if txns, err := m.openTxns(lctx, mirroredTopics(prev), "Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"); err == nil && len(txns) > 0 {
					stillOpen = txnIDs(txns)
				}
				cancel()
			}
			if len(stillOpen) > 0 {
				lag = append(lag, fmt.Sprintf("transactions still open on the source: %v", stillOpen))
			}
			if len(lag) == 0 {
				lag = []string{"transactions still open on the source"}
			}
			return &LagError{Partitions: lag}
		}
	}
}

type sourceEnd struct{ hwm, lso int64 }

// sourceEnds reads the high watermark and last stable offset of every
// partition of every mirrored topic on the source. With known, the last
// round's, those partitions are listed at once with the topics (two
// round trips become one), and listed again only if the topics name
// others.
func (m *Mirror) sourceEnds(ctx context.Context, known map[topicPartition]sourceEnd) (map[topicPartition]sourceEnd, error) {
	var td map[string]topicMeta
	var guess map[topicPartition]sourceEnd
	var err, guessErr error
	if len(known) > 0 {
		var wg sync.WaitGroup
		wg.Go(func() { guess, guessErr = m.listSourceEnds(ctx, partitionsOf(known)) })
		td, err = listTopics(ctx, m.src)
		wg.Wait()
	} else {
		td, err = listTopics(ctx, m.src)
	}
	if err != nil {
		return nil, err
	}
	parts := map[string][]int32{}
	n := 0
	for name, t := range td {
		if m.cfg.mirrorTopic(name, t.internal) {
			for p := range t.partitions {
				parts[name] = append(parts[name], p)
			}
			n += int(t.partitions)
		}
	}
	if guess != nil && guessErr == nil && samePartitions(parts, n, known) {
		return guess, nil
	}
	return m.listSourceEnds(ctx, parts)
}

// listSourceEnds lists the high watermark and last stable offset of each
// partition in parts on the source, both at once.
func (m *Mirror) listSourceEnds(ctx context.Context, parts map[string][]int32) (map[topicPartition]sourceEnd, error) {
	out := make(map[topicPartition]sourceEnd)
	if len(parts) == 0 {
		return out, nil
	}
	var hwms, lsos kadm.ListedOffsets
	var hwmErr, lsoErr error
	var wg sync.WaitGroup
	wg.Go(func() { lsos, lsoErr = ListEnds(ctx, m.src, parts, true) })
	hwms, hwmErr = ListEnds(ctx, m.src, parts, false)
	wg.Wait()
	if err := cmp.Or(hwmErr, lsoErr, ListedError(hwms), ListedError(lsos)); err != nil {
		return nil, err
	}
	for t, ps := range parts {
		for _, p := range ps {
			h, ok1 := hwms.Lookup(t, p)
			l, ok2 := lsos.Lookup(t, p)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("no end offset for %s[%d] yet", t, p)
			}
			out[topicPartition{t, p}] = sourceEnd{hwm: h.Offset, lso: l.Offset}
		}
	}
	return out, nil
}

// partitionsOf is the partitions of ends, by topic.
func partitionsOf(ends map[topicPartition]sourceEnd) map[string][]int32 {
	out := map[string][]int32{}
	for tp := range ends {
		out[tp.topic] = append(out[tp.topic], tp.partition)
	}
	return out
}

// samePartitions reports whether parts, n partitions in all, are known's.
func samePartitions(parts map[string][]int32, n int, known map[topicPartition]sourceEnd) bool {
	if n != len(known) {
		return false
	}
	for t, ps := range parts {
		for _, p := range ps {
			if _, ok := known[topicPartition{t, p}]; !ok {
				return false
			}
		}
	}
	return true
}

// ListedError names the partitions of a listing that failed, sorted, with
// the first one's error: "t[0], t[1]: LEADER_NOT_AVAILABLE…"; nil when none
// did.
func ListedError(lo kadm.ListedOffsets) error {
	failed := map[topicPartition]error{}
	lo.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			failed[topicPartition{o.Topic, o.Partition}] = o.Err
		}
	})
	if len(failed) == 0 {
		return nil
	}
	tps := slices.SortedFunc(maps.Keys(failed), func(a, b topicPartition) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	names := make([]string, len(tps))
	for i, tp := range tps {
		names[i] = fmt.Sprintf("%s[%d]", tp.topic, tp.partition)
	}
	return fmt.Errorf("%s: %w", strings.Join(names, ", "), failed[tps[0]])
}

// standbyEnds reads the standby's end offsets of the partitions in ends.
// A partition missing from the answer is not on the standby (yet); one
// whose broker could not be asked (no leader: its replicas' brokers are
// down) is in the answer with that error.
func (m *Mirror) standbyEnds(ctx context.Context, ends map[topicPartition]sourceEnd) (kadm.ListedOffsets, error) {
	if len(ends) == 0 {
		return nil, nil
	}
	return ListEnds(ctx, m.dst, partitionsOf(ends), false)
}

// lagging names the partitions whose standby (dst, read from the cluster:
// every partition, whichever member writes it) is behind the source's end,
// and says whether any has an open transaction. A partition halted in this
// member is an error.
func (m *Mirror) lagging(ends map[topicPartition]sourceEnd, dst kadm.ListedOffsets) (lag []string, open bool, err error) {
	if err := m.localHalt(func(tp topicPartition) bool { _, ok := ends[tp]; return ok }); err != nil {
		return nil, false, err
	}
	for tp, e := range ends {
		d, ok := dst.Lookup(tp.topic, tp.partition)
		switch {
		case !ok:
			lag = append(lag, fmt.Sprintf("%s[%d]: not on the standby yet (source end %d)", tp.topic, tp.partition, e.hwm))
		case d.Err != nil:
			// A partition with no leader on the standby (its replicas'
			// brokers down) cannot show its end, so cannot be judged.
			lag = append(lag, fmt.Sprintf("%s[%d]: the standby does not give its end: %v (source end %d)", tp.topic, tp.partition, d.Err, e.hwm))
		case d.Offset < e.hwm:
			lag = append(lag, fmt.Sprintf("%s[%d]: standby %d of %d", tp.topic, tp.partition, d.Offset, e.hwm))
		}
		if e.lso < e.hwm {
			open = true
		}
	}
	sort.Strings(lag)
	return lag, open, nil
}

func sameEnds(a, b map[topicPartition]sourceEnd) bool {
	if a == nil || len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// mirroredTopics is the set of topics in ends.
func mirroredTopics(ends map[topicPartition]sourceEnd) map[string]bool {
	out := make(map[string]bool)
	for tp := range ends {
		out[tp.topic] = true
	}
	return out
}

// abortOpen aborts the transactions open on the source that write to a
// mirrored topic and that Ferry carries (the carrier), by fencing their
// transactional IDs: InitProducerId for the ID bumps its epoch, and the
// coordinator aborts what the previous epoch left open. A transaction
// Ferry does not carry belongs to a writer beside it: it is not held, so
// it ends by itself, and fencing it would kill a producer that is none of
// Ferry's business.
func (m *Mirror) abortOpen(ctx context.Context, mirrored map[string]bool) error {
	open, err := m.openTxns(ctx, mirrored, "Ongoing")
	errs := []error{err}
	carried, err := m.carried(ctx, open)
	errs = append(errs, err)
	fenced := make(map[string]bool, len(carried))
	for _, t := range carried {
		fenced[t.ID] = true
		m.log.Warn("aborting a transaction still open on the source for the switch", zap.String("transactional_id", t.ID))
		if err := m.fence(ctx, t.ID); err != nil {
			errs = append(errs, fmt.Errorf("transactional ID %q: %w", t.ID, err))
		}
	}
	for _, t := range open {
		if !fenced[t.ID] {
			m.log.Warn("a transaction not written through Ferry is open on a mirrored topic; the switch waits for it to end, and does not fence it",
				zap.String("transactional_id", t.ID))
		}
	}
	return errors.Join(errs...)
}

// fence bumps a transactional ID's producer epoch on the source, which
// aborts its open transaction. The coordinator answers
// CONCURRENT_TRANSACTIONS while it completes the abort; that is retried.
func (m *Mirror) fence(ctx context.Context, id string) error {
	for {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = &id
		req.TransactionTimeoutMillis = 60000
		req.ProducerID = -1
		req.ProducerEpoch = -1
		resp, err := req.RequestWith(ctx, m.src)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err == nil {
			return nil
		}
		if !kerr.IsRetriable(err) && !errors.Is(err, kerr.ConcurrentTransactions) {
			return err
		}
		if serr := sleep(ctx, 50*time.Millisecond); serr != nil {
			return err
		}
	}
}

// SyncGroups copies every mirrored group's committed offsets to the
// standby now, as the sync loop does every interval; the switchover calls
// it with offset commits held. Groups with members on the standby have
// them removed first (see syncGroups). It runs on any member, whether or
// not it syncs (Ownership.Syncs): offsets are clamped to the standby's end
// offsets, read from the cluster.
func (m *Mirror) SyncGroups(ctx context.Context) error {
	if !m.cfg.syncGroups {
		return nil
	}
	return m.syncGroups(ctx, true)
}
