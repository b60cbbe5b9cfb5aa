package mirror

// Brokers older than Kafka 3.0 lack APIs of KIP-664 that the mirror uses:
// ListTransactions (the drain's view of transactions open on the source)
// and DescribeTransactions (each writer's fence check on the target,
// fence.go); brokers before 3.7 serve Produce up to v9, below the
// writers' produceVersion. What a cluster offers is read once from its
// ApiVersions answer, so that a missing API is a stated limit rather than
// a request failing at every try.

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// apiSupport is what one cluster's ApiVersions answer offers, read on
// first use.
type apiSupport struct {
	mu   sync.Mutex
	keys map[int16]int16 // max version by key; nil until read
}

// has reports whether the cluster cl reaches offers key. An error (the
// cluster not answering) leaves it unknown, to be read at the next call.
func (a *apiSupport) has(ctx context.Context, cl *kgo.Client, key int16) (bool, error) {
	_, ok, err := a.maxVersion(ctx, cl, key)
	return ok, err
}

// maxVersion is the highest version of key the cluster offers, and whether
// it offers key at all.
func (a *apiSupport) maxVersion(ctx context.Context, cl *kgo.Client, key int16) (int16, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keys == nil {
		resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			return 0, false, err
		}
		a.keys = make(map[int16]int16, len(resp.ApiKeys))
		for _, k := range resp.ApiKeys {
			a.keys[k.ApiKey] = k.MaxVersion
		}
	}
	v, ok := a.keys[key]
	return v, ok, nil
}

// lacks reports whether the cluster is known not to offer key; unknown
// (it did not answer) is not lacking, and the request is tried.
func (a *apiSupport) lacks(ctx context.Context, cl *kgo.Client, key int16) bool {
	ok, err := a.has(ctx, cl, key)
	return err == nil && !ok
}
