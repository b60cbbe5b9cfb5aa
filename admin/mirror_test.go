package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/mirror"
)

// fakeMirror is the mirror as cmd/ferry reports it, set by the test.
type fakeMirror struct {
	mu   sync.Mutex
	info MirrorInfo
}

func (m *fakeMirror) get() MirrorInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.info
}

func (m *fakeMirror) set(info MirrorInfo) {
	m.mu.Lock()
	m.info = info
	m.mu.Unlock()
}

var haltErr = &mirror.HaltError{Topic: "orders", Partition: 2, Offset: 41, Detail: "standby assigned 40", Err: mirror.ErrOffsetMismatch}

func statuses() []mirror.PartitionStatus {
	return []mirror.PartitionStatus{
		{Topic: "orders", Partition: 0, State: mirror.StateCaughtUp, Mirrored: 100, SourceEnd: 100, SourceStable: 100},
		{Topic: "orders", Partition: 1, State: mirror.StateMirroring, Mirrored: 70, SourceEnd: 100, SourceStable: 90, LagRecords: 30, LagTime: 1500 * time.Millisecond,
			Err: fmt.Errorf("NOT_LEADER_OR_FOLLOWER")},
		{Topic: "orders", Partition: 2, State: mirror.StateHalted, Mirrored: 41, SourceEnd: 50, SourceStable: 50, LagRecords: 9, LagTime: 3 * time.Second, Err: haltErr},
		{Topic: "gone", Partition: 0, State: mirror.StateStopped, Mirrored: 5, SourceEnd: 900, LagRecords: 895, LagTime: time.Hour},
		{Topic: "new", Partition: 0, State: mirror.StateStarting, Mirrored: -1, SourceEnd: -1, SourceStable: -1},
	}
}

func TestMirrorStatus(t *testing.T) {
	fm := &fakeMirror{info: MirrorInfo{Enabled: true, Running: true, Source: "primary", Target: "standby", Partitions: statuses()}}
	f := newFixture(t, WithMirror(fm.get))
	f.started.Store(true)

	// The method.
	m := f.srv.Mirror(context.Background())
	want := MirrorSummary{Partitions: 5, Starting: 1, Mirroring: 1, CaughtUp: 1, Halted: 1, Stopped: 1,
		MaxLagRecords: 30, MaxLagSeconds: 3} // the stopped partition's lag does not count
	if !m.Enabled || !m.Running || m.Source != "primary" || m.Target != "standby" || m.Summary != want {
		t.Fatalf("mirror %+v\nsummary want %+v", m, want)
	}
	halted := m.Partitions[2]
	if halted.State != "halted" || halted.HaltReason != "offset_mismatch" || !strings.Contains(halted.Error, "orders[2] at offset 41: standby assigned 40") {
		t.Fatalf("halted partition %+v", halted)
	}
	if p := m.Partitions[1]; p.State != "mirroring" || p.LagRecords != 30 || p.LagSeconds != 1.5 || p.HaltReason != "" || p.Error != "NOT_LEADER_OR_FOLLOWER" {
		t.Fatalf("mirroring partition %+v", p)
	}

	// The handlers, decoded as a client would: /status/mirror alone and
	// the same section inside /status.
	type partition struct {
		Topic          string  `json:"topic"`
		Partition      int32   `json:"partition"`
		State          string  `json:"state"`
		MirroredOffset int64   `json:"mirrored_offset"`
		SourceEnd      int64   `json:"source_end"`
		LagRecords     int64   `json:"lag_records"`
		LagSeconds     float64 `json:"lag_seconds"`
		HaltReason     string  `json:"halt_reason"`
	}
	type section struct {
		Enabled bool   `json:"enabled"`
		Running bool   `json:"running"`
		Source  string `json:"source"`
		Target  string `json:"target"`
		Summary struct {
			Partitions    int     `json:"partitions"`
			CaughtUp      int     `json:"caught_up"`
			Halted        int     `json:"halted"`
			MaxLagRecords int64   `json:"max_lag_records"`
			MaxLagSeconds float64 `json:"max_lag_seconds"`
			AllCaughtUp   bool    `json:"all_caught_up"`
		} `json:"summary"`
		Partitions []partition `json:"partitions"`
	}
	check := func(what string, sec section) {
		t.Helper()
		if !sec.Enabled || !sec.Running || sec.Source != "primary" || sec.Target != "standby" ||
			sec.Summary.Partitions != 5 || sec.Summary.CaughtUp != 1 || sec.Summary.Halted != 1 ||
			sec.Summary.MaxLagRecords != 30 || sec.Summary.MaxLagSeconds != 3 || sec.Summary.AllCaughtUp {
			t.Fatalf("%s: %+v", what, sec)
		}
		wantParts := []partition{
			{"orders", 0, "caught_up", 100, 100, 0, 0, ""},
			{"orders", 1, "mirroring", 70, 100, 30, 1.5, ""},
			{"orders", 2, "halted", 41, 50, 9, 3, "offset_mismatch"},
			{"gone", 0, "stopped", 5, 900, 895, 3600, ""},
			{"new", 0, "starting", -1, -1, 0, 0, ""},
		}
		if fmt.Sprint(sec.Partitions) != fmt.Sprint(wantParts) {
			t.Fatalf("%s partitions\n%+v\nwant\n%+v", what, sec.Partitions, wantParts)
		}
	}
	code, body := f.get(t, "/status/mirror")
	var alone section
	if err := json.Unmarshal([]byte(body), &alone); code != 200 || err != nil {
		t.Fatalf("/status/mirror = %d %v: %s", code, err, body)
	}
	check("/status/mirror", alone)
	code, body = f.get(t, "/status")
	var full struct {
		Ready  bool    `json:"ready"`
		Mirror section `json:"mirror"`
	}
	if err := json.Unmarshal([]byte(body), &full); code != 200 || err != nil {
		t.Fatalf("/status = %d %v: %s", code, err, body)
	}
	check("/status", full.Mirror)

	// A halted partition is reported, and does not make the member
	// unready: /readyz is about serving clients.
	if !full.Ready {
		t.Fatalf("/status not ready with a halted mirror partition: %s", body)
	}
	if code, body := f.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz with a halted mirror partition = %d %q", code, body)
	}

	// Every partition caught up (the stopped one aside).
	parts := statuses()
	for i := range parts {
		if parts[i].State != mirror.StateStopped {
			parts[i].State, parts[i].LagRecords, parts[i].LagTime, parts[i].Err = mirror.StateCaughtUp, 0, 0, nil
		}
	}
	fm.set(MirrorInfo{Enabled: true, Running: true, Source: "primary", Target: "standby", Partitions: parts})
	if s := f.srv.Mirror(context.Background()).Summary; !s.AllCaughtUp || s.CaughtUp != 4 || s.MaxLagRecords != 0 || s.MaxLagSeconds != 0 {
		t.Fatalf("all caught up: %+v", s)
	}

	// Stopped for a switchover: not running, so not caught up.
	fm.set(MirrorInfo{Enabled: true})
	if m := f.srv.Mirror(context.Background()); m.Running || m.Summary.AllCaughtUp || m.Partitions == nil {
		t.Fatalf("stopped mirror: %+v", m)
	}
}

func TestMirrorStatusWithoutMirror(t *testing.T) {
	f := newFixture(t)
	code, body := f.get(t, "/status/mirror")
	if code != 200 || !strings.Contains(body, `"enabled": false`) || !strings.Contains(body, `"partitions": []`) {
		t.Fatalf("/status/mirror without a mirror = %d %s", code, body)
	}
	if st := f.srv.Status(context.Background()); st.Mirror.Enabled || st.Mirror.Running {
		t.Fatalf("status %+v", st.Mirror)
	}
}
