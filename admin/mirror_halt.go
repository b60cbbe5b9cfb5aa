package admin

import (
	"context"
	"io"
	"net/http"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/mirror"
)

// MirrorHaltFunc halts mirror partitions: this member's writers, or in a
// fleet every member's (cmd/ferry forwards the request to every live
// member and merges the answers with MergeHalt).
type MirrorHaltFunc func(ctx context.Context, req MirrorHaltRequest) (MirrorHaltResult, error)

// WithMirrorHalt enables POST /mirror/halt, which runs f. Without it the
// endpoint does not exist (404). It needs the token.
func WithMirrorHalt(f MirrorHaltFunc) Option { return func(c *config) { c.haltFn = f } }

// MirrorHaltRequest is the body of POST /mirror/halt: exactly one of
// Partitions (those partitions) or Topic (every partition of the topic).
// An operator halts what still mirrors of a topic before deleting it on
// the standby to copy it again (docs/RUNBOOK.md, 5.4).
type MirrorHaltRequest struct {
	Partitions []TopicPartition `json:"partitions,omitempty"`
	Topic      string           `json:"topic,omitempty"`
}

// MirrorHaltResult answers POST /mirror/halt: the partitions halted (or
// halted already), and those refused (not_owned, unknown,
// mirror_not_running, as for a restart). A halted partition's writer
// appends nothing more; POST /mirror/restart gives it a new one.
type MirrorHaltResult struct {
	Halted  []HaltedPartition  `json:"halted"`
	Refused []RefusedPartition `json:"refused"`
}

// HaltedPartition is a partition whose writer is halted.
type HaltedPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Member is the node ID of the member whose writer it is.
	Member int32 `json:"member"`
	// Was is the state the writer was in (halted: it already was, and
	// keeps its reason, HaltReason).
	Was        string `json:"was"`
	HaltReason string `json:"halt_reason,omitempty"`
	// MirroredOffset is the standby's end as the writer last knew it.
	MirroredOffset int64 `json:"mirrored_offset"`
}

// ParseMirrorHalt reads a halt body strictly: JSON, one object, no unknown
// fields, exactly one selection.
func ParseMirrorHalt(r io.Reader) (MirrorHaltRequest, error) {
	var req MirrorHaltRequest
	const want = `want {"partitions": [{"topic": "t", "partition": 0}]} or {"topic": "t"}`
	if err := decodeStrict(r, &req, "halt", want); err != nil {
		return req, err
	}
	return req, checkSelection(want, req.Partitions, req.Topic, false)
}

// HandleMirrorHalt runs POST /mirror/halt: 200 with what was halted and
// what refused, 400 for a body that is not a request, 409 when no mirror
// runs.
func (s *Server) HandleMirrorHalt(w http.ResponseWriter, r *http.Request) {
	serveMirrorAction(s, w, r, "halt", ParseMirrorHalt, s.cfg.haltFn, func(res MirrorHaltResult) []zap.Field {
		return []zap.Field{zap.Int("halted", len(res.Halted)), zap.Int("refused", len(res.Refused))}
	})
}

// HaltLocal runs req against one member's mirror: statuses are its
// writers' (mirror.Mirror.Status), halt its mirror.Mirror.Halt, node its
// node ID. Topic selects among its own writers; Partitions are each halted
// or refused.
func HaltLocal(req MirrorHaltRequest, node int32, statuses []mirror.PartitionStatus,
	halt func(topic string, partition int32) (mirror.PartitionStatus, error)) MirrorHaltResult {
	names := req.Partitions
	if len(names) == 0 {
		for _, st := range statuses {
			if st.Topic == req.Topic && st.State != mirror.StateStopped {
				names = append(names, TopicPartition{st.Topic, st.Partition})
			}
		}
	}
	res := MirrorHaltResult{Halted: []HaltedPartition{}, Refused: []RefusedPartition{}}
	for _, tp := range names {
		was, err := halt(tp.Topic, tp.Partition)
		if err != nil {
			res.Refused = append(res.Refused, refusal(tp, node, was, err))
			continue
		}
		hp := HaltedPartition{Topic: tp.Topic, Partition: tp.Partition, Member: node, Was: stateName(was.State), MirroredOffset: was.Mirrored}
		if was.State == mirror.StateHalted {
			hp.HaltReason = mirror.HaltReason(was.Err)
		}
		res.Halted = append(res.Halted, hp)
	}
	return res
}

// MergeHalt joins the answers of every member to one request into the
// fleet's, as MergeRestart does.
func MergeHalt(answers ...MirrorHaltResult) MirrorHaltResult {
	var halted [][]HaltedPartition
	var refused [][]RefusedPartition
	for _, a := range answers {
		halted, refused = append(halted, a.Halted), append(refused, a.Refused)
	}
	out, done := mergeDone(halted, func(h HaltedPartition) TopicPartition { return TopicPartition{h.Topic, h.Partition} })
	return MirrorHaltResult{Halted: out, Refused: mergeRefused(done, len(answers), refused...)}
}
