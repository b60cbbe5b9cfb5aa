package mirror

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultTransactionalIDPrefix is the prefix of the writers' transactional
// IDs on the target.
const DefaultTransactionalIDPrefix = "ferry-mirror"

// AbortLeftOpen aborts every transaction the writers (transactional IDs
// prefix.*) left open on target, a cluster they will not write to again
// in that direction: a forced switch made it the active cluster while
// writers were copying source transactions whose outcome the old cluster,
// gone, never told. A writer keeps such a transaction open across its own
// restarts to resume it, so nothing else ends it before the broker's
// timeout (txnTimeout, 15 minutes) — and until then every read_committed
// reader of the partition, the mirror of the other direction included,
// stops at its first offset. Each is aborted by initialising its
// transactional ID (which fences the writer too), as a writer's own start
// does (initProducer). It returns the IDs aborted.
func AbortLeftOpen(ctx context.Context, target *kgo.Client, prefix string) ([]string, error) {
	listed, err := kadm.NewClient(target).ListTransactions(ctx, nil, []string{"Ongoing", "PrepareAbort", "PrepareCommit"})
	if err != nil {
		return nil, fmt.Errorf("listing the transactions open on the new active cluster: %w", err)
	}
	var aborted []string
	var errs []error
	for _, t := range listed.Sorted() {
		if !strings.HasPrefix(t.TxnID, prefix+".") {
			continue
		}
		id := t.TxnID
		if _, err := initProducerOn(ctx, target, &id); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.TxnID, err))
			continue
		}
		aborted = append(aborted, t.TxnID) // sorted, as listed
	}
	return aborted, errors.Join(errs...)
}
