package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/mirror"
)

// What halting and restarting mirror partitions share: both select
// partitions of this member's mirror (admin.HaltLocal, admin.RestartLocal)
// and, in a fleet, run on every live member with the answers merged.

// localAction is admin.HaltLocal or admin.RestartLocal: req run against
// one member's writers (statuses) with act, the mirror's Halt or Restart.
type localAction[Req, Res any] func(req Req, node int32, statuses []mirror.PartitionStatus,
	act func(topic string, partition int32) (mirror.PartitionStatus, error)) Res

// runMirrorAction runs req against this member's running mirror with
// local and act (e.g. (*mirror.Mirror).Halt). node is this member's node
// ID. With no mirror running, explicitly named partitions are refused as
// mirror_not_running and a selection finds nothing.
func runMirrorAction[Req, Res any](r *mirrorRunner, req Req, node int32, local localAction[Req, Res],
	act func(m *mirror.Mirror, topic string, partition int32) (mirror.PartitionStatus, error)) Res {
	c := r.cur.Load()
	if c == nil {
		return local(req, node, nil, func(string, int32) (mirror.PartitionStatus, error) {
			return mirror.PartitionStatus{}, mirror.ErrNotRunning
		})
	}
	return local(req, node, c.m.Status(), func(topic string, partition int32) (mirror.PartitionStatus, error) {
		return act(c.m, topic, partition)
	})
}

// serveMirrorAction is an admin API request on mirror partitions: on its
// own the member runs it (runLocal, its runner's Halt or Restart); in a
// fleet it goes to every live member's handler of kind (this member's
// included), each running it on the writers it runs (a member runs only
// the writers of the partitions it owns), and the answers are merged, so
// that the operator may ask any member.
func serveMirrorAction[Req, Res any](ctx context.Context, n *node, req Req, kind string, merge func(...Res) Res,
	runLocal func(r *mirrorRunner, req Req, node int32) Res) (Res, error) {
	if n.fleet != nil {
		return callMerged(ctx, n.fleet, kind, req, merge)
	}
	if n.mirror.cur.Load() == nil {
		var none Res
		return none, admin.ErrMirrorNotRunning
	}
	return runLocal(n.mirror, req, n.cfg.NodeID), nil
}

// answerMirrorAction answers another member's call of a mirror action
// (what: "halt", "restart"), body its request, with runLocal; a member
// without a mirror answers none (nothing done, nothing refused).
func answerMirrorAction[Req, Res any](n *node, body []byte, what string, none Res, runLocal func(r *mirrorRunner, req Req, node int32) Res) ([]byte, error) {
	var req Req
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("decoding a mirror %s: %w", what, err)
	}
	res := none
	if n.mirror != nil {
		res = runLocal(n.mirror, req, n.cfg.NodeID)
	}
	return json.Marshal(res)
}
