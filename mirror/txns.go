package mirror

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// OpenTxn is a transaction open on the source that writes to a mirrored
// partition, as its coordinator describes it.
type OpenTxn struct {
	ID         string `json:"id"`
	ProducerID int64  `json:"producer_id"` // physical, on the source
	Epoch      int16  `json:"epoch"`
	State      string `json:"state"`
}

// TxnCarrier names, among txns, the transactional IDs whose clients write
// through Ferry (its members saw them): only those may be fenced by Drain.
// It is told before any is fenced, so that a member can answer the fenced
// producer's next requests (after a rollback) with an error it recovers
// from, rather than the broker's PRODUCER_FENCED.
type TxnCarrier func(ctx context.Context, txns []OpenTxn) ([]string, error)

// WithTxnCarrier restricts Drain's fencing to the transactions carrier
// names. Without it every transaction open on a mirrored partition is
// taken for one Ferry carries (a mirror run without a proxy in front).
func WithTxnCarrier(carrier TxnCarrier) Option { return func(c *config) { c.carrier = carrier } }

// openTxns lists the transactions in one of states on the source that
// write to a partition of a topic in mirrored: a transaction only on
// topics not mirrored (a writer beside Ferry) neither holds the drain up
// nor is fenced. The error says which brokers did not answer.
//
// A source without ListTransactions (Kafka before 3.0) lists none: the
// drain then judges open transactions by each partition's last stable
// offset alone (logged once).
func (m *Mirror) openTxns(ctx context.Context, mirrored map[string]bool, states ...string) ([]OpenTxn, error) {
	if m.srcAPIs.lacks(ctx, m.src, int16(kmsg.ListTransactions)) {
		m.noTxnListing.Do(func() {
			m.log.Warn("the source cluster offers no ListTransactions (KIP-664, Kafka 3.0 and later): a switch's drain sees a transaction open on the source only by a partition's last stable offset (one with partitions added and nothing written yet goes unseen, and the coordinator may abort it on the old cluster after the switch), and cannot fence transactions left open")
		})
		return nil, nil
	}
	req := kmsg.NewPtrListTransactionsRequest()
	req.StateFilters = states
	shards := m.src.RequestSharded(ctx, req)
	var ids []string
	var errs []error
	for _, sh := range shards {
		if sh.Err != nil {
			errs = append(errs, sh.Err)
			continue
		}
		resp := sh.Resp.(*kmsg.ListTransactionsResponse)
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, t := range resp.TransactionStates {
			ids = append(ids, t.TransactionalID)
		}
	}
	if len(ids) == 0 {
		return nil, errors.Join(errs...)
	}
	described, err := m.srcAdm.DescribeTransactions(ctx, ids...)
	if err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	var out []OpenTxn
	for _, d := range described.Sorted() {
		if d.Err != nil {
			errs = append(errs, fmt.Errorf("describing transactional ID %q: %w", d.TxnID, d.Err))
			continue
		}
		if !writesTo(d.Topics, mirrored) {
			continue
		}
		out = append(out, OpenTxn{ID: d.TxnID, ProducerID: d.ProducerID, Epoch: d.ProducerEpoch, State: d.State})
	}
	return out, errors.Join(errs...)
}

func writesTo(topics map[string]map[int32]struct{}, mirrored map[string]bool) bool {
	for t := range topics {
		if mirrored[t] {
			return true
		}
	}
	return false
}

// carried is the part of txns that Ferry carries (all without a carrier).
func (m *Mirror) carried(ctx context.Context, txns []OpenTxn) ([]OpenTxn, error) {
	if m.cfg.carrier == nil || len(txns) == 0 {
		return txns, nil
	}
	ids, err := m.cfg.carrier(ctx, txns)
	keep := make(map[string]bool, len(ids))
	for _, id := range ids {
		keep[id] = true
	}
	var out []OpenTxn
	for _, t := range txns {
		if keep[t.ID] {
			out = append(out, t)
		}
	}
	return out, err
}

func txnIDs(txns []OpenTxn) []string {
	ids := make([]string, len(txns))
	for i, t := range txns {
		ids[i] = t.ID
	}
	sort.Strings(ids)
	return ids
}
