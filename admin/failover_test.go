package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/routing"
)

// TestFailoverEndpoints: GET /failover shows the detector (404 when it is
// off); pause and resume need the token, take an optional reason, and
// answer whether it is paused in the routing state now; a refusal (a
// switch running) is the switch's error body and status.
func TestFailoverEndpoints(t *testing.T) {
	var calls []*routing.FailoverPause
	busy := false
	pause := func(_ context.Context, p *routing.FailoverPause) (routing.State, error) {
		if busy {
			return routing.State{}, &routing.Error{Reason: routing.ReasonRunning, Msg: "a switch is running"}
		}
		calls = append(calls, p)
		return routing.State{Generation: 3, Active: "primary", FailoverPaused: p}, nil
	}
	status := func() failover.Status { return failover.Status{Enabled: true, After: "30s", Actor: 7} }
	f := newFixture(t, WithFailover(status), WithFailoverPause(pause), WithToken(testToken))
	do := func(method, path, body, token string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		f.srv.Handler().ServeHTTP(rec, req)
		return rec
	}

	rec := do(http.MethodGet, "/failover", "", "")
	var st failover.Status
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &st) != nil || st.Actor != 7 || st.After != "30s" {
		t.Fatalf("GET /failover: %d %s", rec.Code, rec.Body)
	}
	if rec := do(http.MethodPost, "/failover/pause", "", ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("pause without the token: %d %s", rec.Code, rec.Body)
	}
	if rec := do(http.MethodPost, "/failover/pause", `{"reason": 5}`, testToken); rec.Code != http.StatusBadRequest {
		t.Fatalf("pause with a bad body: %d %s", rec.Code, rec.Body)
	}
	if len(calls) != 0 {
		t.Fatalf("refused requests paused: %v", calls)
	}
	rec = do(http.MethodPost, "/failover/pause", `{"reason": "upgrade"}`, testToken)
	var ans FailoverAnswer
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &ans) != nil || ans.Paused == nil || ans.Paused.Reason != "upgrade" ||
		ans.Paused.At.IsZero() || ans.Routing.FailoverPaused == nil || ans.Routing.Generation != 3 {
		t.Fatalf("pause: %d %s", rec.Code, rec.Body)
	}
	rec = do(http.MethodPost, "/failover/resume", "", testToken)
	ans = FailoverAnswer{}
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &ans) != nil || ans.Paused != nil || len(calls) != 2 || calls[1] != nil {
		t.Fatalf("resume: %d %s (calls %v)", rec.Code, rec.Body, calls)
	}
	busy = true
	if rec := do(http.MethodPost, "/failover/pause", "", testToken); rec.Code != http.StatusConflict || decodeError(t, rec).Error != routing.ReasonRunning {
		t.Fatalf("pause during a switch: %d %s", rec.Code, rec.Body)
	}

	off := newFixture(t)
	req := httptest.NewRequest(http.MethodGet, "/failover", nil)
	rec = httptest.NewRecorder()
	off.srv.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusNotFound {
		t.Fatalf("GET /failover with failover off: %d %s", rec.Code, rec.Body)
	}
	req = httptest.NewRequest(http.MethodPost, "/failover/pause", nil)
	rec = httptest.NewRecorder()
	off.srv.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /failover/pause with failover off: %d %s", rec.Code, rec.Body)
	}
}
