package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/routing"
)

const testToken = "s3cret-token"

// fakeSwitch is a switch function that records its calls and answers what
// the test says.
type fakeSwitch struct {
	calls atomic.Int32
	mu    sync.Mutex
	req   routing.Request
	do    func(ctx context.Context, req routing.Request) (routing.State, error)
}

func (f *fakeSwitch) fn(ctx context.Context, req routing.Request) (routing.State, error) {
	f.calls.Add(1)
	f.mu.Lock()
	f.req = req
	f.mu.Unlock()
	return f.do(ctx, req)
}

// switchedTo installs the next generation on routes, the way a switcher
// does, and answers it.
func switchedTo(routes *routing.Table, mode routing.Mode) func(context.Context, routing.Request) (routing.State, error) {
	return func(_ context.Context, req routing.Request) (routing.State, error) {
		cur := routes.Current()
		start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
		next := routing.State{Generation: cur.Generation + 1, Active: req.To, Phase: routing.PhaseServing,
			Last:   &routing.Switch{Mode: mode, From: cur.Active, To: req.To, Started: start, Finished: start.Add(1500 * time.Millisecond), Duration: "1.5s", Outcome: "switched"},
			Fences: []routing.Fence{{Generation: cur.Generation, Ends: map[string][]int64{"orders": {10, 20}}}},
		}
		routes.Advance(next)
		return next, nil
	}
}

// post sends POST /switchover with body, and the token when not empty.
func (f *fixture) post(t *testing.T, body, token string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/switchover", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	return rec
}

func decodeError(t *testing.T, rec *httptest.ResponseRecorder) ErrorBody {
	t.Helper()
	var e ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("%d %q is not a JSON error: %v", rec.Code, rec.Body.String(), err)
	}
	return e
}

func TestSwitchoverSwitches(t *testing.T) {
	sw := &fakeSwitch{}
	f := newFixture(t, WithSwitch(sw.fn), WithToken(testToken))
	sw.do = switchedTo(f.routes, routing.Planned)

	rec := f.post(t, `{"to": "standby"}`, testToken)
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("POST /switchover = %d %s", rec.Code, rec.Body)
	}
	if sw.req.To != "standby" || sw.req.Mode != routing.Planned || sw.req.Timeout != routing.DefaultSwitchTimeout {
		t.Fatalf("the switch was asked %+v, want standby, planned, the default timeout", sw.req)
	}
	var got struct {
		Generation uint32 `json:"generation"`
		Active     string `json:"active"`
		Phase      string `json:"phase"`
		Last       struct {
			Mode, From, To, Duration, Outcome string
			Started, Finished                 time.Time
		} `json:"last_switch"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	l := got.Last
	if got.Generation != 1 || got.Active != "standby" || got.Phase != "serving" ||
		l.Mode != "planned" || l.From != "primary" || l.To != "standby" || l.Duration != "1.5s" || l.Outcome != "switched" || l.Started.IsZero() || l.Finished.IsZero() {
		t.Fatalf("answer %s", rec.Body)
	}
	if strings.Contains(rec.Body.String(), "fences") {
		t.Fatalf("the answer carries the fences: %s", rec.Body)
	}

	// Mode and timeout are passed on.
	f.post(t, `{"to": "primary", "mode": "forced", "timeout": "2m"}`, testToken)
	if sw.req.To != "primary" || sw.req.Mode != routing.Forced || sw.req.Timeout != 2*time.Minute {
		t.Fatalf("the switch was asked %+v, want primary, forced, 2m", sw.req)
	}
}

func TestSwitchoverRefusals(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{&routing.Error{Reason: routing.ReasonUnknownCluster, Msg: `cluster "nope" is not configured`}, 400},
		{&routing.Error{Reason: routing.ReasonBadRequest, Msg: "mode"}, 400},
		{&routing.Error{Reason: routing.ReasonAlreadyActive, Msg: "already"}, 409},
		{&routing.Error{Reason: routing.ReasonRunning, Msg: "running"}, 409},
		{&routing.Error{Reason: routing.ReasonHalted, Msg: "halted", Partitions: []string{"orders[0]: offset_mismatch", "orders[3]: fenced"}}, 409},
		{&routing.Error{Reason: routing.ReasonNoMirror, Msg: "no mirror"}, 409},
		{&routing.Error{Reason: routing.ReasonPrincipals, Msg: "1 mapped client principal(s) cannot authenticate", Principals: []string{"User:bob: SASL authentication failed"}}, 409},
		{&routing.Error{Reason: routing.ReasonDrainTimeout, Msg: "did not drain", Partitions: []string{"orders[1]: standby 5 of 9"}}, 504},
		{&routing.Error{Reason: routing.ReasonSaveFailed, Msg: "saving"}, 500},
		{errors.New("something else"), 500},
	} {
		sw := &fakeSwitch{do: func(context.Context, routing.Request) (routing.State, error) { return routing.State{}, tc.err }}
		f := newFixture(t, WithSwitch(sw.fn))
		rec := f.post(t, `{"to": "standby"}`, "")
		e := decodeError(t, rec)
		var re *routing.Error
		wantReason, wantMsg, wantParts, wantPrincipals := ReasonInternal, tc.err.Error(), []string(nil), []string(nil)
		if errors.As(tc.err, &re) {
			wantReason, wantMsg, wantParts, wantPrincipals = re.Reason, re.Msg, re.Partitions, re.Principals
		}
		if rec.Code != tc.code || e.Error != wantReason || e.Message != wantMsg || strings.Join(e.Partitions, ",") != strings.Join(wantParts, ",") ||
			strings.Join(e.Principals, ",") != strings.Join(wantPrincipals, ",") {
			t.Errorf("%v: %d %s, want %d %s", tc.err, rec.Code, rec.Body, tc.code, wantReason)
		}
		if f.routes.Current().Generation != 0 {
			t.Errorf("%v: the routing state changed", tc.err)
		}
	}
}

func TestSwitchoverToken(t *testing.T) {
	sw := &fakeSwitch{}
	f := newFixture(t, WithSwitch(sw.fn), WithToken(testToken))
	sw.do = switchedTo(f.routes, routing.Planned)
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "Bearer " + testToken + "x", "Basic " + testToken, testToken} {
		req := httptest.NewRequest(http.MethodPost, "/switchover", strings.NewReader(`{"to": "standby"}`))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		f.srv.Handler().ServeHTTP(rec, req)
		if rec.Code != 401 || !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") || decodeError(t, rec).Error != ReasonUnauthorized {
			t.Errorf("Authorization %q: %d %v %s, want 401 with WWW-Authenticate: Bearer", auth, rec.Code, rec.Header(), rec.Body)
		}
	}
	if n := sw.calls.Load(); n != 0 || f.routes.Current().Generation != 0 {
		t.Fatalf("the switch ran %d times without the token", n)
	}
	// The scheme is case-insensitive (RFC 7235); the token is not.
	req := httptest.NewRequest(http.MethodPost, "/switchover", strings.NewReader(`{"to": "standby"}`))
	req.Header.Set("Authorization", "bearer "+testToken)
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	if rec.Code != 200 || sw.calls.Load() != 1 {
		t.Fatalf("with the token: %d %s", rec.Code, rec.Body)
	}
	// Reading stays open.
	if code, _ := f.get(t, "/status"); code != 200 {
		t.Fatalf("/status without the token = %d", code)
	}

	// No token configured: open.
	sw2 := &fakeSwitch{}
	f2 := newFixture(t, WithSwitch(sw2.fn))
	sw2.do = switchedTo(f2.routes, routing.Planned)
	if rec := f2.post(t, `{"to": "standby"}`, ""); rec.Code != 200 {
		t.Fatalf("no token configured: %d %s", rec.Code, rec.Body)
	}
}

func TestSwitchoverBadBodies(t *testing.T) {
	sw := &fakeSwitch{do: func(context.Context, routing.Request) (routing.State, error) { return routing.State{}, nil }}
	f := newFixture(t, WithSwitch(sw.fn), WithToken(testToken))
	for _, tc := range []struct{ body, want string }{
		{"", "the body is empty"},
		{"to=standby", "not a switchover request"},
		{`{"to": "standby"`, "not a switchover request"},
		{`{"to": "standby", "force": true}`, `unknown field "force"`},
		{`{"to": 1}`, "not a switchover request"},
		{`{"mode": "planned"}`, `"to" is required`},
		{`{"to": ""}`, `"to" is required`},
		{`{"to": "standby", "mode": "gentle"}`, `mode "gentle"`},
		{`{"to": "standby", "timeout": "30"}`, `timeout "30": not a duration`},
		{`{"to": "standby", "timeout": "-1s"}`, "timeout -1s: must be more than 0"},
		{`{"to": "standby", "timeout": "0s"}`, "timeout 0s: must be more than 0"},
		{`{"to": "standby", "timeout": "11m"}`, "at most 10m0s"},
		{`{"to": "standby"} {"to": "primary"}`, "more than one JSON value"},
		{`{"to": "standby", "force_unauthenticated": true}`, `force_unauthenticated is for mode "forced" only`},
		{`{"to": "` + strings.Repeat("x", maxSwitchBody) + `"}`, "larger than"},
	} {
		rec := f.post(t, tc.body, testToken)
		e := decodeError(t, rec)
		if rec.Code != 400 || e.Error != routing.ReasonBadRequest || !strings.Contains(e.Message, tc.want) {
			t.Errorf("body %.40q: %d %+v, want 400 bad_request %q", tc.body, rec.Code, e, tc.want)
		}
	}
	if n := sw.calls.Load(); n != 0 {
		t.Fatalf("the switch ran %d times on bad bodies", n)
	}
}

func TestSwitchoverMethods(t *testing.T) {
	sw := &fakeSwitch{do: func(context.Context, routing.Request) (routing.State, error) { return routing.State{}, nil }}
	f := newFixture(t, WithSwitch(sw.fn), WithToken(testToken))
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		req := httptest.NewRequest(m, "/switchover", strings.NewReader(`{"to": "standby"}`))
		req.Header.Set("Authorization", "Bearer "+testToken)
		rec := httptest.NewRecorder()
		f.srv.Handler().ServeHTTP(rec, req)
		if rec.Code != 405 || rec.Header().Get("Allow") != "POST" || decodeError(t, rec).Error != ReasonMethodNotAllowed {
			t.Errorf("%s /switchover = %d %v %s", m, rec.Code, rec.Header(), rec.Body)
		}
	}
	if sw.calls.Load() != 0 {
		t.Fatal("the switch ran")
	}
	// Without a switch function there is no such endpoint.
	if rec := newFixture(t).post(t, `{"to": "standby"}`, ""); rec.Code != 404 {
		t.Fatalf("POST /switchover without WithSwitch = %d", rec.Code)
	}
}

// A client that goes away does not cancel the switch it asked for; the
// switch's context is bounded by its timeout plus the margin instead.
func TestSwitchoverOutlivesClient(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	type seen struct {
		err      error
		deadline time.Duration
	}
	done := make(chan seen, 1)
	sw := &fakeSwitch{}
	f := newFixture(t, WithSwitch(sw.fn))
	sw.do = func(ctx context.Context, req routing.Request) (routing.State, error) {
		close(entered)
		<-release
		// The server notices the closed connection in the background:
		// give it time to (wrongly) cancel.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		dl, _ := ctx.Deadline()
		s := seen{ctx.Err(), time.Until(dl)}
		st, err := switchedTo(f.routes, routing.Planned)(ctx, req)
		done <- s
		return st, err
	}
	addr := serveTCP(t, f, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/switchover", strings.NewReader(`{"to": "standby", "timeout": "3m"}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-entered
	cancel() // the client gives up: the connection closes
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	close(release)
	s := <-done
	if s.err != nil {
		t.Fatalf("the switch's context ended with the client: %v", s.err)
	}
	if s.deadline <= 3*time.Minute-2*time.Second || s.deadline > 3*time.Minute+SwitchMargin {
		t.Fatalf("the switch's context ends in %s, want the timeout (3m) plus at most the margin", s.deadline)
	}
	if st := f.routes.Current(); st.Generation != 1 || st.Active != "standby" {
		t.Fatalf("routing %s after the client left, want the switch done", st)
	}
}

// switchMirror is the mirror a real routing.Switcher drives in these tests.
type switchMirror struct {
	halted []string
	drain  func(ctx context.Context) error
	stop   []routing.Position

	mu      sync.Mutex
	follows []string // active cluster of each Follow
}

func (m *switchMirror) Halted() []string { return m.halted }
func (m *switchMirror) Drain(ctx context.Context) error {
	if m.drain == nil {
		return nil
	}
	return m.drain(ctx)
}
func (m *switchMirror) SyncGroups(context.Context) error { return nil }
func (m *switchMirror) Stop() []routing.Position         { return m.stop }
func (m *switchMirror) Follow(st routing.State) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.follows = append(m.follows, st.Active)
	return nil
}

// switcherFixture is an admin server over a real routing.Switcher, its
// metrics on the fixture's registry.
func switcherFixture(t *testing.T, m *switchMirror) *fixture {
	t.Helper()
	routes := routing.NewTable(routing.State{Active: "primary"})
	sw := routing.NewSwitcher(routes, routing.Local{Table: routes}, m, nil, []string{"primary", "standby"}, zap.NewNop())
	f := newFixture(t, WithRoutes(routes), WithSwitch(sw.Switch), WithToken(testToken))
	f.routes = routes
	return f
}

func metricsHas(t *testing.T, f *fixture, lines ...string) {
	t.Helper()
	_, body := f.get(t, "/metrics")
	for _, l := range lines {
		if !strings.Contains(body, "\n"+l+"\n") {
			t.Errorf("/metrics lacks %q", l)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// Two switches at once: the second is refused while the first drains; the
// first finishes; asking for it again answers the same state.
func TestSwitchoverConcurrentAndRepeat(t *testing.T) {
	draining, release := make(chan struct{}), make(chan struct{})
	var once sync.Once // a planned switch drains twice
	m := &switchMirror{drain: func(ctx context.Context) error {
		once.Do(func() { close(draining) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	f := switcherFixture(t, m)

	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- f.post(t, `{"to": "standby"}`, testToken) }()
	<-draining
	rec := f.post(t, `{"to": "standby"}`, testToken)
	if e := decodeError(t, rec); rec.Code != 409 || e.Error != routing.ReasonRunning {
		t.Fatalf("second switch while the first drains: %d %s, want 409 switch_running", rec.Code, rec.Body)
	}
	if st := f.srv.Status(context.Background()); st.Routing.Phase != routing.PhaseDraining || st.Routing.LastSwitch == nil || st.Routing.LastSwitch.To != "standby" {
		t.Fatalf("/status while draining: %+v", st.Routing)
	}
	running := f.srv.Status(context.Background()).Routing.LastSwitch.ID
	if e := decodeError(t, rec); running == "" || e.Switch != running {
		t.Fatalf("second switch while the first drains: the answer names switch %q, want the running switch %q", e.Switch, running)
	}
	metricsHas(t, f, `ferry_switchover_phase{phase="draining"} 1`, `ferry_switchover_phase{phase="serving"} 0`)
	close(release)
	rec = <-first
	var st RoutingStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &st); rec.Code != 200 || err != nil {
		t.Fatalf("first switch: %d %s", rec.Code, rec.Body)
	}
	if st.Generation != 1 || st.Active != "standby" || st.Phase != routing.PhaseServing || st.LastSwitch.Outcome != "switched" {
		t.Fatalf("first switch answered %s", rec.Body)
	}

	// The same call again (a retry after a lost answer): the same state.
	again := f.post(t, `{"to": "standby"}`, testToken)
	if again.Code != 200 || again.Body.String() != rec.Body.String() {
		t.Fatalf("repeat: %d %s, want 200 %s", again.Code, again.Body, rec.Body)
	}
	// Another mode is another switch, refused.
	if rec := f.post(t, `{"to": "standby", "mode": "forced"}`, testToken); rec.Code != 409 || decodeError(t, rec).Error != routing.ReasonAlreadyActive {
		t.Fatalf("forced to the active cluster: %d %s", rec.Code, rec.Body)
	}
	metricsHas(t, f,
		"ferry_routing_generation 1",
		`ferry_switchover_phase{phase="serving"} 1`,
		`ferry_switchover_phase{phase="draining"} 0`,
		`ferry_switchovers_total{mode="planned",outcome="switched"} 1`, // the repeat changed nothing
		`ferry_switchovers_total{mode="planned",outcome="switch_running"} 1`,
		`ferry_switchovers_total{mode="forced",outcome="already_active"} 1`,
	)
	_, body := f.get(t, "/metrics")
	if !strings.Contains(body, `ferry_switchover_duration_seconds{mode="planned"} `) {
		t.Fatalf("no planned duration in /metrics")
	}
	// /status carries the switch, not the fences.
	_, body = f.get(t, "/status")
	if !strings.Contains(body, `"last_switch": {`) || !strings.Contains(body, `"phase": "serving"`) || strings.Contains(body, "fences") {
		t.Fatalf("/status routing: %s", body)
	}
}

// A drain that does not finish in time rolls back: 504 with the lagging
// partitions, the old cluster still active, the rollback in /status.
func TestSwitchoverDrainTimeout(t *testing.T) {
	m := &switchMirror{drain: func(ctx context.Context) error {
		<-ctx.Done()
		return &routing.LagError{Partitions: []string{"orders[1]: standby 5 of 9"}}
	}}
	f := switcherFixture(t, m)
	rec := f.post(t, `{"to": "standby", "timeout": "50ms"}`, testToken)
	e := decodeError(t, rec)
	if rec.Code != 504 || e.Error != routing.ReasonDrainTimeout || len(e.Partitions) != 1 || e.Partitions[0] != "orders[1]: standby 5 of 9" {
		t.Fatalf("drain timeout: %d %s", rec.Code, rec.Body)
	}
	st := f.srv.Status(context.Background()).Routing
	if st.Generation != 0 || st.Active != "primary" || st.Phase != routing.PhaseServing || st.LastSwitch == nil || !strings.HasPrefix(st.LastSwitch.Outcome, "rolled back") {
		t.Fatalf("after the rollback: %+v %+v", st, st.LastSwitch)
	}
	metricsHas(t, f, `ferry_switchovers_total{mode="planned",outcome="drain_timeout"} 1`, "ferry_routing_generation 0")
	_, body := f.get(t, "/metrics")
	if !strings.Contains(body, `ferry_switchover_duration_seconds{mode="planned"} `) {
		t.Fatal("no duration for the rolled-back switch")
	}

	// A halted mirror refuses a planned switch before anything is held.
	m.halted = []string{"orders[0]: offset_mismatch"}
	rec = f.post(t, `{"to": "standby"}`, testToken)
	if e := decodeError(t, rec); rec.Code != 409 || e.Error != routing.ReasonHalted || len(e.Partitions) != 1 {
		t.Fatalf("halted: %d %s", rec.Code, rec.Body)
	}
}

// A forced switch reports what it lost, in the answer and in the metrics.
func TestSwitchoverForcedLost(t *testing.T) {
	m := &switchMirror{stop: []routing.Position{
		{Topic: "orders", Partition: 0, Standby: 100, Source: 120},
		{Topic: "orders", Partition: 1, Standby: 50, Source: 50},
		{Topic: "audit", Partition: 2, Standby: 7, Source: 10},
	}}
	f := switcherFixture(t, m)
	rec := f.post(t, `{"to": "standby", "mode": "forced"}`, testToken)
	var st RoutingStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &st); rec.Code != 200 || err != nil {
		t.Fatalf("forced: %d %s", rec.Code, rec.Body)
	}
	want := []routing.LostRange{{Topic: "audit", Partition: 2, From: 7, To: 10}, {Topic: "orders", Partition: 0, From: 100, To: 120}}
	if st.Generation != 1 || st.Active != "standby" || st.LastSwitch.Mode != routing.Forced || len(st.LastSwitch.Lost) != 2 ||
		st.LastSwitch.Lost[0] != want[0] || st.LastSwitch.Lost[1] != want[1] {
		t.Fatalf("forced answered %s", rec.Body)
	}
	metricsHas(t, f,
		`ferry_switchover_lost_offsets{partition="0",topic="orders"} 20`,
		`ferry_switchover_lost_offsets{partition="2",topic="audit"} 3`,
		`ferry_switchovers_total{mode="forced",outcome="switched"} 1`,
		"ferry_routing_generation 1",
	)
	_, body := f.get(t, "/metrics")
	if strings.Contains(body, `partition="1",topic="orders"`) {
		t.Fatal("a partition that lost nothing has a lost_offsets series")
	}
}
