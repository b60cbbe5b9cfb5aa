package admin

import (
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ferry-gw/ferry/proxy"
)

// TestAuthReadyAndStatus: while the proxy says clients cannot
// authenticate (OAUTHBEARER's keys not fetched), /readyz answers 503 with
// the reason and /status shows it with the auth section; once they can,
// the member is ready.
func TestAuthReadyAndStatus(t *testing.T) {
	var keys atomic.Bool
	st := func() proxy.AuthStatus {
		ks := &proxy.OAuthKeysStatus{Source: "https://idp.test/jwks", Error: "HTTP 503 Service Unavailable"}
		if keys.Load() {
			ks = &proxy.OAuthKeysStatus{Source: "https://idp.test/jwks", Keys: 1}
		}
		return proxy.AuthStatus{OAuthKeys: ks}
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
