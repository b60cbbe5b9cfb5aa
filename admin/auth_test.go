package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/upstream"
)

// TestAuthReadyAndStatus: while the proxy says clients cannot
// authenticate (OAUTHBEARER's keys not fetched), /readyz answers 503 with
// the reason and /status shows it with the auth section; once they can,
// the member is ready.
func TestAuthReadyAndStatus(t *testing.T) {
	var keys atomic.Bool
	st := func() AuthStatus {
		ks := &clientauth.OAuthKeysStatus{Source: "https://idp.test/jwks", Error: "HTTP 503 Service Unavailable"}
		if keys.Load() {
			ks = &clientauth.OAuthKeysStatus{Source: "https://idp.test/jwks", Keys: 1}
		}
		return AuthStatus{OAuthKeys: ks}
	}
	ready := func() error {
		if keys.Load() {
			return nil
		}
		return errors.New("no token signing keys yet: oauth.jwks_url https://idp.test/jwks: HTTP 503 Service Unavailable")
	}
	f := newFixture(t, WithAuth(st, ready))
	f.started.Store(true)
	if code, body := f.get(t, "/readyz"); code != 503 || !strings.Contains(body, "no token signing keys yet") {
		t.Fatalf("/readyz without keys = %d %q", code, body)
	}
	_, body := f.get(t, "/status")
	var s Status
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	if s.Ready || !strings.Contains(s.NotReady, "no token signing keys yet") || s.Auth == nil || s.Auth.OAuthKeys == nil || s.Auth.OAuthKeys.Error == "" {
		t.Fatalf("/status without keys: ready %v %q, auth %+v", s.Ready, s.NotReady, s.Auth)
	}
	keys.Store(true)
	if code, body := f.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz with keys = %d %q", code, body)
	}
}

// TestStatusUpstreamFailuresRedactedWithoutToken: /status names the client
// principals a cluster refuses and the error (which names the upstream
// user mapped to each) only with the admin token or admin_public_read;
// without them those fields are emptied, and the cluster, broker and time
// stay for whoever watches the member.
func TestStatusUpstreamFailuresRedactedWithoutToken(t *testing.T) {
	st := func() AuthStatus {
		return AuthStatus{UpstreamFailures: []upstream.AuthFailure{{
			Cluster: "a", Principal: "User:bob", Broker: 2, At: time.Now(),
			Error: "broker 10.9.8.7:9092: SASL authentication SCRAM-SHA-512 as bob-app failed",
		}}}
	}
	personal := []string{"User:bob", "bob-app", "10.9.8.7"}
	read := func(t *testing.T, what string, rec *httptest.ResponseRecorder, want bool) {
		t.Helper()
		var s Status
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", what, rec.Code, rec.Body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil || s.Auth == nil || len(s.Auth.UpstreamFailures) != 1 {
			t.Fatalf("%s: %v %s", what, err, rec.Body)
		}
		if f := s.Auth.UpstreamFailures[0]; f.Cluster != "a" || f.Broker != 2 || f.At.IsZero() {
			t.Errorf("%s: the failure's cluster, broker and time are gone: %+v", what, f)
		}
		for _, p := range personal {
			if got := strings.Contains(rec.Body.String(), p); got != want {
				t.Errorf("%s: shows %q: %v, want %v:\n%s", what, p, got, want, rec.Body)
			}
		}
		if redacted := len(s.Redacted) > 0; redacted == want {
			t.Errorf("%s: redacted %q", what, s.Redacted)
		}
	}
	f := newFixture(t, WithAuth(st, func() error { return nil }), WithToken(testToken))
	read(t, "no token", f.getAs(t, "/status", ""), false)
	read(t, "the token", f.getAs(t, "/status", "Bearer "+testToken), true)
	if rec := f.getAs(t, "/status", "Bearer wrong"); rec.Code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401", rec.Code)
	}
	pub := newFixture(t, WithAuth(st, func() error { return nil }), WithToken(testToken), WithPublicRead(true))
	read(t, "admin_public_read", pub.getAs(t, "/status", ""), true)
	open := newFixture(t, WithAuth(st, func() error { return nil }))
	read(t, "no token configured", open.getAs(t, "/status", ""), true)
}
