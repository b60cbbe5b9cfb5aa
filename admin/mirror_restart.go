package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/mirror"
)

// MirrorRestartFunc restarts halted mirror partitions: this member's, or in
// a fleet every member's (cmd/ferry forwards the request to every live
// member, each restarting the writers it runs, and merges the answers with
// MergeRestart).
type MirrorRestartFunc func(ctx context.Context, req MirrorRestartRequest) (MirrorRestartResult, error)

// WithMirrorRestart enables POST /mirror/restart, which runs f. Without it
// the endpoint does not exist (404). It needs the token, as POST
// /switchover does.
func WithMirrorRestart(f MirrorRestartFunc) Option { return func(c *config) { c.restartFn = f } }

// ErrMirrorNotRunning is what a MirrorRestartFunc returns when no mirror
// runs (it is stopped for a switchover, or has not started): 409
// mirror_not_running.
var ErrMirrorNotRunning = errors.New("the mirror is not running")

// ReasonMirrorNotRunning is the refusal of POST /mirror/restart while no
// mirror runs.
const ReasonMirrorNotRunning = "mirror_not_running"

// maxRestartBody bounds a restart request's body.
const maxRestartBody = 1 << 20

// MirrorRestartRequest is the body of POST /mirror/restart: exactly one of
// Partitions (those partitions), Topic (every halted partition of the
// topic) or Halted (every halted partition).
type MirrorRestartRequest struct {
	Partitions []TopicPartition `json:"partitions,omitempty"`
	Topic      string           `json:"topic,omitempty"`
	Halted     bool             `json:"halted,omitempty"`
}

// TopicPartition names one partition.
type TopicPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

// MirrorRestartResult answers POST /mirror/restart: the partitions whose
// halted writer was replaced by a new one, and those refused. A restarted
// partition runs the writer's start-up checks again: if the cause of its
// halt is still there it halts again, with the same reason (see /status).
type MirrorRestartResult struct {
	Restarted []RestartedPartition `json:"restarted"`
	Refused   []RefusedPartition   `json:"refused"`
}

// RestartedPartition is a partition whose writer was restarted.
type RestartedPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Member is the node ID of the member whose writer was restarted.
	Member int32 `json:"member"`
	// HaltReason and Error are the halt the old writer was in.
	HaltReason string `json:"halt_reason"`
	Error      string `json:"error,omitempty"`
}

// RefusedPartition is a partition named in the request that was not
// restarted, and why.
type RefusedPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Member is the node ID of the member that answered; for not_halted,
	// the member whose writer runs it.
	Member int32 `json:"member"`
	// Reason is not_halted, not_owned (another member writes it; in a
	// fleet's merged answer: no member that answered writes it),
	// unknown (not a mirrored partition) or mirror_not_running.
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// State is the partition's state, for not_halted.
	State string `json:"state,omitempty"`
}

// Reasons a partition is refused by POST /mirror/restart.
const (
	RestartNotHalted  = "not_halted"
	RestartNotOwned   = "not_owned"
	RestartUnknown    = "unknown"
	RestartNotRunning = ReasonMirrorNotRunning
)

// ParseMirrorRestart reads a restart body strictly: JSON, one object, no
// unknown fields, exactly one selection.
func ParseMirrorRestart(r io.Reader) (MirrorRestartRequest, error) {
	var req MirrorRestartRequest
	const want = `want {"partitions": [{"topic": "t", "partition": 0}]}, {"topic": "t"} or {"halted": true}`
	if err := decodeStrict(r, &req, "restart", want); err != nil {
		return req, err
	}
	return req, checkSelection(want, req.Partitions, req.Topic, req.Halted)
}

// decodeStrict reads exactly one JSON value into v, refusing unknown
// fields; what names the request and want shows its shape in errors.
func decodeStrict(r io.Reader, v any, what, want string) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.Is(err, io.EOF):
			return fmt.Errorf("the body is empty; %s", want)
		case errors.As(err, &mbe):
			return fmt.Errorf("the body is larger than %d bytes", mbe.Limit)
		}
		return fmt.Errorf("the body is not a %s request (%v); %s", what, err, want)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("the body holds more than one JSON value")
	}
	return nil
}

// checkSelection requires exactly one of partitions, topic and all, and
// well-formed partitions.
func checkSelection(want string, partitions []TopicPartition, topic string, all bool) error {
	n := 0
	if len(partitions) > 0 {
		n++
	}
	if topic != "" {
		n++
	}
	if all {
		n++
	}
	if n != 1 {
		return fmt.Errorf("name exactly one selection; %s", want)
	}
	for _, p := range partitions {
		if p.Topic == "" || p.Partition < 0 {
			return fmt.Errorf("partition %+v: a topic and a partition of 0 or more are needed", p)
		}
	}
	return nil
}

// HandleMirrorRestart runs POST /mirror/restart: 200 with what was
// restarted and what refused, 400 for a body that is not a request, 409
// when no mirror runs.
func (s *Server) HandleMirrorRestart(w http.ResponseWriter, r *http.Request) {
	serveMirrorAction(s, w, r, "restart", ParseMirrorRestart, s.cfg.restartFn, func(res MirrorRestartResult) []zap.Field {
		return []zap.Field{zap.Int("restarted", len(res.Restarted)), zap.Int("refused", len(res.Refused))}
	})
}

// serveMirrorAction runs a request on mirror partitions (restart, halt):
// the body parsed strictly (400 if it is not a request), fn run on it for
// at most 30 s and not cancelled by the client going away, as a
// switchover; 200 with its answer, 409 when no mirror runs.
func serveMirrorAction[Req, Res any](s *Server, w http.ResponseWriter, r *http.Request, what string,
	parse func(io.Reader) (Req, error), fn func(context.Context, Req) (Res, error), counts func(Res) []zap.Field) {
	req, err := parse(http.MaxBytesReader(w, r.Body, maxRestartBody))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, ErrorBody{Error: "bad_request", Message: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	log := s.cfg.log.With(zap.Any("request", req), zap.String("remote", r.RemoteAddr))
	res, err := fn(ctx, req)
	if errors.Is(err, ErrMirrorNotRunning) {
		writeJSON(w, http.StatusConflict, ErrorBody{Error: ReasonMirrorNotRunning, Message: err.Error()})
		return
	}
	if err != nil {
		log.Warn("mirror "+what+" failed", zap.Error(err))
		writeJSON(w, http.StatusInternalServerError, ErrorBody{Error: ReasonInternal, Message: err.Error()})
		return
	}
	log.Info("mirror "+what+" done", counts(res)...)
	writeJSON(w, http.StatusOK, res)
}

// RestartLocal runs req against one member's mirror: statuses are its
// writers' (mirror.Mirror.Status), restart its mirror.Mirror.Restart, node
// its node ID. Halted and Topic select among its own halted writers;
// Partitions are each restarted or refused.
func RestartLocal(req MirrorRestartRequest, node int32, statuses []mirror.PartitionStatus,
	restart func(topic string, partition int32) (mirror.PartitionStatus, error)) MirrorRestartResult {
	var names []TopicPartition
	if len(req.Partitions) > 0 {
		names = req.Partitions
	} else {
		for _, st := range statuses {
			if st.State == mirror.StateHalted && (req.Halted || st.Topic == req.Topic) {
				names = append(names, TopicPartition{st.Topic, st.Partition})
			}
		}
	}
	res := MirrorRestartResult{Restarted: []RestartedPartition{}, Refused: []RefusedPartition{}}
	for _, tp := range names {
		was, err := restart(tp.Topic, tp.Partition)
		if err == nil {
			rp := RestartedPartition{Topic: tp.Topic, Partition: tp.Partition, Member: node, HaltReason: mirror.HaltReason(was.Err)}
			if was.Err != nil {
				rp.Error = was.Err.Error()
			}
			res.Restarted = append(res.Restarted, rp)
			continue
		}
		res.Refused = append(res.Refused, refusal(tp, node, was, err))
	}
	return res
}

// refusal is the refusal of tp by member node for err, the partition's
// status was.
func refusal(tp TopicPartition, node int32, was mirror.PartitionStatus, err error) RefusedPartition {
	ref := RefusedPartition{Topic: tp.Topic, Partition: tp.Partition, Member: node, Message: err.Error()}
	switch {
	case errors.Is(err, mirror.ErrNotHalted):
		ref.Reason, ref.State = RestartNotHalted, stateName(was.State)
		ref.Message = fmt.Sprintf("%s[%d] is %s, not halted", tp.Topic, tp.Partition, stateName(was.State))
	case errors.Is(err, mirror.ErrNotOwned):
		ref.Reason = RestartNotOwned
		ref.Message = fmt.Sprintf("%s[%d] is written by another member", tp.Topic, tp.Partition)
	case errors.Is(err, mirror.ErrNotRunning), errors.Is(err, mirror.ErrClosed):
		ref.Reason = RestartNotRunning
	default:
		ref.Reason = RestartUnknown
		ref.Message = fmt.Sprintf("%s[%d] is not a mirrored partition", tp.Topic, tp.Partition)
	}
	return ref
}

// restartRank orders a partition's answers from several members: the
// member that restarted it, else the one whose writer runs it, else one
// whose mirror is stopped, else one that does not write it.
var restartRank = map[string]int{RestartNotHalted: 1, RestartNotRunning: 2, RestartNotOwned: 3, RestartUnknown: 4}

// MergeRestart joins the answers of every member to one request into the
// fleet's: every partition restarted anywhere, and for each partition named
// and restarted nowhere the most telling refusal (see restartRank).
// Sorted by topic and partition.
func MergeRestart(answers ...MirrorRestartResult) MirrorRestartResult {
	var restarted [][]RestartedPartition
	var refused [][]RefusedPartition
	for _, a := range answers {
		restarted, refused = append(restarted, a.Restarted), append(refused, a.Refused)
	}
	out, done := mergeDone(restarted, func(r RestartedPartition) TopicPartition { return TopicPartition{r.Topic, r.Partition} })
	return MirrorRestartResult{Restarted: out, Refused: mergeRefused(done, len(answers), refused...)}
}

// mergeDone joins the partitions the members acted on (restarted, halted:
// each member acts on the partitions it writes), sorted by topic and
// partition, and returns which they are, for mergeRefused.
func mergeDone[P any](lists [][]P, partition func(P) TopicPartition) ([]P, map[TopicPartition]bool) {
	out := []P{}
	done := map[TopicPartition]bool{}
	for _, l := range lists {
		for _, p := range l {
			out = append(out, p)
			done[partition(p)] = true
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := partition(out[i]), partition(out[j])
		return lessTP(a.Topic, a.Partition, b.Topic, b.Partition)
	})
	return out, done
}

// mergeRefused is, for each partition refused by some member and done by
// none (done), the most telling refusal (restartRank); answers is how
// many members answered. Sorted by topic and partition.
func mergeRefused(done map[TopicPartition]bool, answers int, lists ...[]RefusedPartition) []RefusedPartition {
	refused := map[TopicPartition]RefusedPartition{}
	for _, l := range lists {
		for _, r := range l {
			k := TopicPartition{r.Topic, r.Partition}
			if have, ok := refused[k]; !ok || restartRank[r.Reason] < restartRank[have.Reason] {
				refused[k] = r
			}
		}
	}
	out := []RefusedPartition{}
	for k, r := range refused {
		if done[k] {
			continue
		}
		if r.Reason == RestartNotOwned && answers > 1 {
			r.Message = fmt.Sprintf("%s[%d]: no member that answered writes it (is its owner down?)", r.Topic, r.Partition)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		return lessTP(out[i].Topic, out[i].Partition, out[j].Topic, out[j].Partition)
	})
	return out
}

func lessTP(t1 string, p1 int32, t2 string, p2 int32) bool {
	if t1 != t2 {
		return t1 < t2
	}
	return p1 < p2
}
