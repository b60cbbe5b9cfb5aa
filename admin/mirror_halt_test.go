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

func (f *fixture) postHalt(t *testing.T, body, token string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/mirror/halt", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	return rec
}

// halt stops a writer of m, as mirror.Mirror.Halt: one already halted
// keeps its halt.
func (m *fakeMember) halt(topic string, partition int32) (mirror.PartitionStatus, error) {
	for i, st := range m.sts {
		if st.Topic != topic || st.Partition != partition {
			continue
		}
		if st.State != mirror.StateHalted {
			m.sts[i].State = mirror.StateHalted
			m.sts[i].Err = &mirror.HaltError{Topic: topic, Partition: partition, Err: mirror.ErrHaltedOnRequest}
		}
		return st, nil
	}
	if _, known := m.owned[TopicPartition{topic, partition}]; known {
		return mirror.PartitionStatus{}, mirror.ErrNotOwned
	}
	return mirror.PartitionStatus{}, mirror.ErrUnknownPartition
}

func halted(r MirrorHaltResult) string {
	var b strings.Builder
	for _, p := range r.Halted {
		fmt.Fprintf(&b, "halted %s[%d]@%d(was %s%s) ", p.Topic, p.Partition, p.Member, p.Was, map[bool]string{true: ":" + p.HaltReason}[p.HaltReason != ""])
	}
	for _, p := range r.Refused {
		fmt.Fprintf(&b, "refused %s[%d]@%d(%s) ", p.Topic, p.Partition, p.Member, p.Reason)
	}
	return strings.TrimSpace(b.String())
}

// TestMirrorHaltEndpoint: POST /mirror/halt needs the token, parses its
// body strictly (a topic or partitions; "halted" is a restart's), halts
// every partition of a topic the member writes whatever its state, keeps
// the reason of one already halted, and refuses what it does not write.
func TestMirrorHaltEndpoint(t *testing.T) {
	member := &fakeMember{node: 4, sts: []mirror.PartitionStatus{halt("a", 0), {Topic: "a", Partition: 1, State: mirror.StateMirroring, Mirrored: 40},
		{Topic: "a", Partition: 2, State: mirror.StateCaughtUp}, {Topic: "b", Partition: 0, State: mirror.StateMirroring}},
		owned: map[TopicPartition]bool{{"a", 3}: false}}
	var got []MirrorHaltRequest
	running := true
	fn := func(_ context.Context, req MirrorHaltRequest) (MirrorHaltResult, error) {
		got = append(got, req)
		if !running {
			return MirrorHaltResult{}, ErrMirrorNotRunning
		}
		return HaltLocal(req, member.node, member.sts, member.halt), nil
	}
	f := newFixture(t, WithMirrorHalt(fn), WithToken(testToken))
	if rec := f.postHalt(t, `{"topic": "a"}`, ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d %s", rec.Code, rec.Body)
	}
	for _, body := range []string{``, `{}`, `{"halted": true}`, `{"topic": "a", "partitions": [{"topic": "a", "partition": 0}]}`,
		`{"partitions": [{"topic": "a", "partition": -1}]}`, `{"topic": "a"} {}`} {
		if rec := f.postHalt(t, body, testToken); rec.Code != http.StatusBadRequest || decodeError(t, rec).Error != "bad_request" {
			t.Fatalf("body %q: %d %s", body, rec.Code, rec.Body)
		}
	}
	if len(got) != 0 {
		t.Fatalf("refused requests reached the mirror: %v", got)
	}
	decode := func(rec *httptest.ResponseRecorder) MirrorHaltResult {
		t.Helper()
		var r MirrorHaltResult
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &r) != nil || r.Halted == nil || r.Refused == nil {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		return r
	}
	r := decode(f.postHalt(t, `{"topic": "a"}`, testToken))
	if s := halted(r); s != "halted a[0]@4(was halted:diverged) halted a[1]@4(was mirroring) halted a[2]@4(was caught_up)" {
		t.Fatalf("by topic: %s", s)
	}
	if r.Halted[1].MirroredOffset != 40 {
		t.Fatalf("the standby's end is not in the answer: %+v", r.Halted[1])
	}
	if st := member.sts[1]; st.State != mirror.StateHalted || mirror.HaltReason(st.Err) != "requested" {
		t.Fatalf("a[1] after the halt: %v %v", st.State, st.Err)
	}
	if s := halted(decode(f.postHalt(t, `{"partitions": [{"topic": "b", "partition": 0}, {"topic": "a", "partition": 3}, {"topic": "zz", "partition": 0}]}`, testToken))); s != "halted b[0]@4(was mirroring) refused a[3]@4(not_owned) refused zz[0]@4(unknown)" {
		t.Fatalf("by partition: %s", s)
	}
	running = false
	if rec := f.postHalt(t, `{"topic": "a"}`, testToken); rec.Code != http.StatusConflict || decodeError(t, rec).Error != ReasonMirrorNotRunning {
		t.Fatalf("mirror not running: %d %s", rec.Code, rec.Body)
	}
	if rec := newFixture(t).postHalt(t, `{"topic": "a"}`, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("without WithMirrorHalt: %d", rec.Code)
	}
}

// TestMergeHalt: each member answers for its own writers; the merged
// answer has every partition halted by the member writing it, and a
// partition nobody writes refused as not owned.
func TestMergeHalt(t *testing.T) {
	m1 := &fakeMember{node: 1, sts: []mirror.PartitionStatus{{Topic: "a", Partition: 0, State: mirror.StateMirroring}}, owned: map[TopicPartition]bool{{"a", 1}: false, {"a", 2}: false}}
	m2 := &fakeMember{node: 2, sts: []mirror.PartitionStatus{{Topic: "a", Partition: 1, State: mirror.StateCaughtUp}}, owned: map[TopicPartition]bool{{"a", 0}: false, {"a", 2}: false}}
	req := MirrorHaltRequest{Partitions: []TopicPartition{{"a", 0}, {"a", 1}, {"a", 2}}}
	got := MergeHalt(HaltLocal(req, 1, m1.sts, m1.halt), HaltLocal(req, 2, m2.sts, m2.halt))
	if s := halted(got); s != "halted a[0]@1(was mirroring) halted a[1]@2(was caught_up) refused a[2]@1(not_owned)" {
		t.Fatalf("merged: %s", s)
	}
	if !strings.Contains(got.Refused[0].Message, "no member that answered writes it") {
		t.Fatalf("the refusal does not say nobody writes it: %q", got.Refused[0].Message)
	}
}
