package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strings"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/mirror"
)

// MirrorInfo is what a member knows of its mirror: whether it is enabled,
// which way it runs now, and every partition's status. cmd/ferry supplies
// it (WithMirror); admin turns it into the mirror section of /status.
type MirrorInfo struct {
	// Enabled is the configuration's mirror.enabled.
	Enabled bool
	// Running is true while a mirror runs (Source → Target). An enabled
	// mirror is not running before the clusters have been reached, or
	// while it is stopped for a switchover.
	Running        bool
	Source, Target string
	Partitions     []mirror.PartitionStatus
}

// WithMirror sets how /status learns the mirror's state. Without it, the
// mirror section says the mirror is disabled.
func WithMirror(f func() MirrorInfo) Option { return func(c *config) { c.mirror = f } }

// WithFailover sets how /status learns automatic failover's view and
// verdict (failover.Runner's Status). Without it /status has no failover
// section.
func WithFailover(f func() failover.Status) Option { return func(c *config) { c.failover = f } }

// WithFleetMirror sets how /status learns the mirror of the whole fleet
// (MergeMirror of every member's LocalMirror). Without it /status shows
// this member's own.
func WithFleetMirror(f func(ctx context.Context) MirrorStatus) Option {
	return func(c *config) { c.fleetMirror = f }
}

// MirrorStatus is the mirror section of /status, and /status/mirror.
type MirrorStatus struct {
	Enabled bool `json:"enabled"`
	Running bool `json:"running"`
	// Source and Target name the clusters mirrored from and to.
	Source     string            `json:"source,omitempty"`
	Target     string            `json:"target,omitempty"`
	Summary    MirrorSummary     `json:"summary"`
	Partitions []MirrorPartition `json:"partitions"`
}

// MirrorSummary counts the partitions by state and gives the worst lag.
type MirrorSummary struct {
	Partitions int `json:"partitions"`
	Starting   int `json:"starting"`
	Mirroring  int `json:"mirroring"`
	CaughtUp   int `json:"caught_up"`
	Halted     int `json:"halted"`
	// Stopped partitions belong to topics deleted on the source.
	Stopped int `json:"stopped"`
	// MaxLagRecords and MaxLagSeconds are the largest lag of any partition
	// that is not stopped.
	MaxLagRecords int64   `json:"max_lag_records"`
	MaxLagSeconds float64 `json:"max_lag_seconds"`
	// AllCaughtUp is true when the mirror runs and every partition that is
	// not stopped is caught up: the standby holds every offset the source
	// had at its last fetch.
	AllCaughtUp bool `json:"all_caught_up"`
}

// MirrorPartition is one mirrored partition.
type MirrorPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Owner is the node ID of the member whose writer copies it.
	Owner int32 `json:"owner"`
	// State is starting, mirroring, caught_up, halted or stopped.
	State string `json:"state"`
	// MirroredOffset is the standby's end offset as acknowledged by the
	// standby: every source offset below it is on the standby at the same
	// offset (-1 until the writer knows it).
	MirroredOffset int64 `json:"mirrored_offset"`
	// SourceEnd is the source's high watermark: the larger of the one
	// the writer's last fetch returned and the one the mirror lists every
	// second. SourceStable is the last stable offset at the writer's last
	// fetch. -1 until known.
	SourceEnd    int64 `json:"source_end"`
	SourceStable int64 `json:"source_stable"`
	// LagRecords is SourceEnd - MirroredOffset (offsets, transaction
	// markers included); LagSeconds is how long ago the partition was last
	// caught up (0 when it is).
	LagRecords int64   `json:"lag_records"`
	LagSeconds float64 `json:"lag_seconds"`
	// HaltReason is the class of the halt (the reason label of
	// ferry_mirror_halts_total) when State is halted.
	HaltReason string `json:"halt_reason,omitempty"`
	// Error is why the partition halted, or the transient error it is
	// retrying.
	Error string `json:"error,omitempty"`
}

// Mirror returns the mirror section of /status: the fleet's, when the
// member is in one (WithFleetMirror), else this member's own.
func (s *Server) Mirror(ctx context.Context) MirrorStatus {
	if s.cfg.fleetMirror != nil {
		return s.cfg.fleetMirror(ctx)
	}
	return s.LocalMirror()
}

// LocalMirror returns the partitions whose writer runs on this member,
// each with this member as its owner.
func (s *Server) LocalMirror() MirrorStatus {
	out := MirrorStatus{Partitions: []MirrorPartition{}}
	if s.cfg.mirror == nil {
		return out
	}
	info := s.cfg.mirror()
	out.Enabled, out.Running, out.Source, out.Target = info.Enabled, info.Running, info.Source, info.Target
	for _, p := range info.Partitions {
		mp := MirrorPartition{
			Topic:          p.Topic,
			Partition:      p.Partition,
			Owner:          s.cfg.node.ID,
			State:          stateName(p.State),
			MirroredOffset: p.Mirrored,
			SourceEnd:      p.SourceEnd,
			SourceStable:   p.SourceStable,
			LagRecords:     p.LagRecords,
			LagSeconds:     p.LagTime.Seconds(),
		}
		if p.Err != nil {
			mp.Error = p.Err.Error()
		}
		if p.State == mirror.StateHalted {
			mp.HaltReason = mirror.HaltReason(p.Err)
		}
		out.Partitions = append(out.Partitions, mp)
	}
	out.Summary = summarize(out.Running, out.Partitions)
	return out
}

// MergeMirror joins the members' own mirror sections (LocalMirror) into the
// fleet's: every partition, with the member that writes it, sorted by
// topic and partition. The fleet's mirror runs when any member's does.
func MergeMirror(members ...MirrorStatus) MirrorStatus {
	out := MirrorStatus{Partitions: []MirrorPartition{}}
	for _, m := range members {
		out.Enabled = out.Enabled || m.Enabled
		if m.Running && !out.Running {
			out.Running, out.Source, out.Target = true, m.Source, m.Target
		}
		out.Partitions = append(out.Partitions, m.Partitions...)
	}
	sort.Slice(out.Partitions, func(i, j int) bool {
		a, b := out.Partitions[i], out.Partitions[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Partition < b.Partition
	})
	out.Summary = summarize(out.Running, out.Partitions)
	return out
}

// summarize counts partitions by state and finds the worst lag.
func summarize(running bool, parts []MirrorPartition) MirrorSummary {
	var sum MirrorSummary
	for _, p := range parts {
		sum.Partitions++
		switch p.State {
		case stateName(mirror.StateStarting):
			sum.Starting++
		case stateName(mirror.StateMirroring):
			sum.Mirroring++
		case stateName(mirror.StateCaughtUp):
			sum.CaughtUp++
		case stateName(mirror.StateHalted):
			sum.Halted++
		case stateName(mirror.StateStopped):
			sum.Stopped++
		}
		if p.State != stateName(mirror.StateStopped) {
			sum.MaxLagRecords = max(sum.MaxLagRecords, p.LagRecords)
			sum.MaxLagSeconds = max(sum.MaxLagSeconds, p.LagSeconds)
		}
	}
	sum.AllCaughtUp = running && sum.CaughtUp == sum.Partitions-sum.Stopped
	return sum
}

// stateName is a partition state as /status spells it: "caught up" becomes
// "caught_up".
func stateName(s mirror.PartitionState) string { return strings.ReplaceAll(s.String(), " ", "_") }

// HandleMirror answers Mirror as indented JSON.
func (s *Server) HandleMirror(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s.Mirror(r.Context())); err != nil {
		s.cfg.log.Debug("writing /status/mirror", zap.Error(err))
	}
}
