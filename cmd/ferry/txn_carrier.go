package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/ferry-gw/ferry/membership"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/proxy"
)

// txnCarrier is the drain's mirror.TxnCarrier: the transactional IDs among
// txns that this member's clients, or in a fleet any live member's, named
// lately. Every member asked also learns that the drain is about to fence
// them (proxy/switch_fence.go), whether or not it carries them: a
// producer's requests reach several members.
func (n *node) txnCarrier(ctx context.Context, txns []mirror.OpenTxn) ([]string, error) {
	fs := make([]proxy.SwitchFence, len(txns))
	for i, t := range txns {
		fs[i] = proxy.SwitchFence{TxnID: t.ID, ProducerID: t.ProducerID, Epoch: t.Epoch}
	}
	if n.fleet == nil {
		return n.proxy.SwitchFencing(fs), nil
	}
	body, err := json.Marshal(fs)
	if err != nil {
		return nil, err
	}
	// Every live member, this one included. One that does not answer
	// is not counted: a transaction only it carries is not fenced, the
	// drain waits for it, and the switch rolls back if it never ends.
	answers, failed, _ := n.fleet.callLive(ctx, proxy.SwitchFenceCallKind, body)
	seen := map[string]bool{}
	for id, b := range answers {
		var ids []string
		if err := json.Unmarshal(b, &ids); err != nil {
			return nil, fmt.Errorf("member %d's carried transactions: %w", id, err)
		}
		for _, x := range ids {
			seen[x] = true
		}
	}
	out := make([]string, 0, len(seen))
	for x := range seen {
		out = append(out, x)
	}
	sort.Strings(out)
	return out, membership.FirstErr(failed)
}
