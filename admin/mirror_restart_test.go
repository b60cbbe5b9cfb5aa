package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferry-gw/ferry/mirror"
)

func (f *fixture) postRestart(t *testing.T, method, body, token string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, "/mirror/restart", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	return rec
}

// fakeMember is one member's mirror for RestartLocal: its writers, and a
// restart that replaces a halted one.
type fakeMember struct {
	node  int32
	sts   []mirror.PartitionStatus
	owned map[TopicPartition]bool // mirrored partitions another member writes are the others
}

func (m *fakeMember) restart(topic string, partition int32) (mirror.PartitionStatus, error) {
	for i, st := range m.sts {
		if st.Topic != topic || st.Partition != partition {
			continue
		}
		if st.State != mirror.StateHalted {
			return st, mirror.ErrNotHalted
		}
		m.sts[i].State = mirror.StateStarting
		return st, nil
	}
	if _, known := m.owned[TopicPartition{topic, partition}]; known {
		return mirror.PartitionStatus{}, mirror.ErrNotOwned
	}
	return mirror.PartitionStatus{}, mirror.ErrUnknownPartition
}

func (m *fakeMember) answer(req MirrorRestartRequest) MirrorRestartResult {
	return RestartLocal(req, m.node, m.sts, m.restart)
}

func halt(topic string, p int32) mirror.PartitionStatus {
	return mirror.PartitionStatus{Topic: topic, Partition: p, State: mirror.StateHalted,
		Err: &mirror.HaltError{Topic: topic, Partition: p, Offset: 5, Detail: "standby batch at 5 differs", Err: mirror.ErrDiverged}}
}

func results(r MirrorRestartResult) string {
	var b strings.Builder
	for _, p := range r.Restarted {
		fmt.Fprintf(&b, "restarted %s[%d]@%d(%s) ", p.Topic, p.Partition, p.Member, p.HaltReason)
	}
	for _, p := range r.Refused {
		fmt.Fprintf(&b, "refused %s[%d]@%d(%s%s) ", p.Topic, p.Partition, p.Member, p.Reason, map[bool]string{true: ":" + p.State}[p.State != ""])
	}
	return strings.TrimSpace(b.String())
}

// TestMirrorRestartEndpoint: POST /mirror/restart needs the token and POST,
// parses its body strictly, and answers what was restarted and refused.
func TestMirrorRestartEndpoint(t *testing.T) {
	member := &fakeMember{node: 7, sts: []mirror.PartitionStatus{halt("a", 0), {Topic: "a", Partition: 1, State: mirror.StateMirroring}, halt("b", 0)}}
	var got []MirrorRestartRequest
	running := true
	fn := func(_ context.Context, req MirrorRestartRequest) (MirrorRestartResult, error) {
		got = append(got, req)
		if !running {
			return MirrorRestartResult{}, ErrMirrorNotRunning
		}
		return member.answer(req), nil
	}
	f := newFixture(t, WithMirrorRestart(fn), WithToken(testToken))

	if rec := f.postRestart(t, http.MethodPost, `{"halted": true}`, ""); rec.Code != http.StatusUnauthorized || decodeError(t, rec).Error != ReasonUnauthorized {
		t.Fatalf("without the token: %d %s", rec.Code, rec.Body)
	}
	if rec := f.postRestart(t, http.MethodPost, `{"halted": true}`, "wrong"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("with a wrong token: %d %s", rec.Code, rec.Body)
	}
	if rec := f.postRestart(t, http.MethodGet, ``, testToken); rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != http.MethodPost {
		t.Fatalf("GET: %d %s", rec.Code, rec.Body)
	}
	for _, body := range []string{``, `{}`, `{"halted": false}`, `{"topic": "a", "halted": true}`, `{"partitions": [{"topic": "a", "partition": -1}]}`,
		`{"partitions": [{"partition": 0}]}`, `{"topic": "a", "partition": 0}`, `{"halted": true} {}`, `[1]`} {
		if rec := f.postRestart(t, http.MethodPost, body, testToken); rec.Code != http.StatusBadRequest || decodeError(t, rec).Error != "bad_request" {
			t.Fatalf("body %q: %d %s", body, rec.Code, rec.Body)
		}
	}
	if len(got) != 0 {
		t.Fatalf("refused requests reached the mirror: %v", got)
	}

	decode := func(rec *httptest.ResponseRecorder) MirrorRestartResult {
		t.Helper()
		var r MirrorRestartResult
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &r) != nil || r.Restarted == nil || r.Refused == nil {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		return r
	}
	r := decode(f.postRestart(t, http.MethodPost, `{"partitions": [{"topic": "a", "partition": 0}, {"topic": "a", "partition": 1}, {"topic": "zz", "partition": 3}]}`, testToken))
	if s := results(r); s != "restarted a[0]@7(diverged) refused a[1]@7(not_halted:mirroring) refused zz[3]@7(unknown)" {
		t.Fatalf("by partition: %s", s)
	}
	if r.Restarted[0].Error == "" || !strings.Contains(r.Restarted[0].Error, "differs") {
		t.Fatalf("the halt's error is not in the answer: %+v", r.Restarted[0])
	}
	if s := results(decode(f.postRestart(t, http.MethodPost, `{"topic": "b"}`, testToken))); s != "restarted b[0]@7(diverged)" {
		t.Fatalf("by topic: %s", s)
	}
	member.sts[0] = halt("a", 0)
	if s := results(decode(f.postRestart(t, http.MethodPost, `{"halted": true}`, testToken))); s != "restarted a[0]@7(diverged)" {
		t.Fatalf("every halted: %s", s)
	}
	if s := results(decode(f.postRestart(t, http.MethodPost, `{"halted": true}`, testToken))); s != "" {
		t.Fatalf("nothing halted any more: %s", s)
	}
	running = false
	if rec := f.postRestart(t, http.MethodPost, `{"halted": true}`, testToken); rec.Code != http.StatusConflict || decodeError(t, rec).Error != ReasonMirrorNotRunning {
		t.Fatalf("mirror not running: %d %s", rec.Code, rec.Body)
	}

	// Without WithMirrorRestart the endpoint does not exist.
	if rec := newFixture(t).postRestart(t, http.MethodPost, `{"halted": true}`, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("without WithMirrorRestart: %d", rec.Code)
	}
}

// TestMergeRestart: in a fleet every member answers for its own writers;
// the merged answer has each partition restarted by its owner, a running
// one refused as not halted by its owner, one nobody writes as not owned,
// and one nobody knows as unknown.
func TestMergeRestart(t *testing.T) {
	owned := map[TopicPartition]bool{{"a", 0}: true, {"a", 1}: true, {"a", 2}: true, {"a", 3}: true}
	m1 := &fakeMember{node: 1, sts: []mirror.PartitionStatus{halt("a", 0), {Topic: "a", Partition: 2, State: mirror.StateCaughtUp}}, owned: owned}
	m2 := &fakeMember{node: 2, sts: []mirror.PartitionStatus{halt("a", 1)}, owned: owned}
	req := MirrorRestartRequest{Partitions: []TopicPartition{{"a", 0}, {"a", 1}, {"a", 2}, {"a", 3}, {"x", 0}}}
	r := MergeRestart(m1.answer(req), m2.answer(req))
	want := "restarted a[0]@1(diverged) restarted a[1]@2(diverged) refused a[2]@1(not_halted:caught_up) refused a[3]@1(not_owned) refused x[0]@1(unknown)"
	if s := results(r); s != want {
		t.Fatalf("merged:\n got %s\nwant %s", s, want)
	}
	if !strings.Contains(r.Refused[1].Message, "no member that answered writes it") {
		t.Fatalf("not owned by anyone: %q", r.Refused[1].Message)
	}
	m1.sts[0], m2.sts[0] = halt("a", 0), halt("a", 1)
	if s := results(MergeRestart(m1.answer(MirrorRestartRequest{Halted: true}), m2.answer(MirrorRestartRequest{Halted: true}))); s != "restarted a[0]@1(diverged) restarted a[1]@2(diverged)" {
		t.Fatalf("every halted, merged: %s", s)
	}
}
