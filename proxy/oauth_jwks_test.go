package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/clientauth/authtest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

func oauthLogin(ctx context.Context, t *testing.T, addr, token string) error {
	return newClient(t, addr, kgo.SASL(oauth.Auth{Token: token}.AsMechanism()), kgo.RequestRetries(0)).Ping(ctx)
}

// TestOAuthSlowJWKSDoesNotStallLogins: while a fetch of the JWKS hangs
// (started by a token naming a key the set lacks), logins whose key the
// set holds complete, each before the hung fetch has returned. With the
// fetch run under the validator's lock, they waited for it.
func TestOAuthSlowJWKSDoesNotStallLogins(t *testing.T) {
	k1, k9 := authtest.NewKey(t, "k1"), authtest.NewKey(t, "k9")
	var hang atomic.Bool
	hung := make(chan struct{}, 1)
	release := make(chan struct{})
	var returned atomic.Bool // a hung fetch has returned
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hang.Load() {
			select {
			case hung <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-r.Context().Done():
			}
			defer returned.Store(true)
		}
		io.WriteString(w, authtest.JWKS(k1))
	}))
	defer srv.Close()
	defer close(release)
	kf := newKfake(t, 1)
	cfg := clientauth.SASLConfig{Mechanisms: []string{clientauth.MechanismOAuthBearer}, OAuth: clientauth.OAuthConfig{JWKSURL: srv.URL, MinRefetch: time.Millisecond}, FailedDelay: time.Millisecond, FailedBurst: 1000}
	_, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testwait.Until(t, 20*time.Second, "a login with the fetched key", func() bool { return oauthLogin(ctx, t, addr, k1.Token("svc")) == nil })

	// The next token naming a key the set lacks fetches again, the
	// refetch interval being past; that fetch hangs.
	hang.Store(true)
	unknown := newClient(t, addr, kgo.SASL(oauth.Auth{Token: k9.Token("svc")}.AsMechanism()), kgo.RequestRetries(0))
	go unknown.Ping(ctx)
	select {
	case <-hung:
	case <-ctx.Done():
		t.Fatal("no fetch of the JWKS for an unknown key")
	}
	for i := range 5 {
		if err := oauthLogin(ctx, t, addr, k1.Token("svc")); err != nil {
			t.Fatalf("login %d with a known key while the fetch hangs: %v", i, err)
		}
		if returned.Load() {
			t.Fatalf("login %d with a known key completed only after the hung fetch returned", i)
		}
	}
}

// TestOAuthJWKSUnreachableAtStart: with the JWKS endpoint failing, Ferry
// starts; OAUTHBEARER logins are refused with a message saying the keys
// are not there yet (counted keys_unavailable), and AuthReady and
// OAuthKeys (/readyz, /status) say why. Once the endpoint answers, the
// keys are fetched without a login asking, and logins succeed.
func TestOAuthJWKSUnreachableAtStart(t *testing.T) {
	k1 := authtest.NewKey(t, "k1")
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, authtest.JWKS(k1))
	}))
	defer srv.Close()
	kf := newKfake(t, 1)
	cfg := clientauth.SASLConfig{Mechanisms: []string{clientauth.MechanismOAuthBearer}, OAuth: clientauth.OAuthConfig{JWKSURL: srv.URL, MinRefetch: 100 * time.Millisecond}, FailedDelay: time.Millisecond, FailedBurst: 1000}
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testwait.Until(t, 20*time.Second, "the first fetch to fail", func() bool {
		return s.OAuthKeys().Error != "" && !strings.Contains(s.OAuthKeys().Error, "under way")
	})
	err := oauthLogin(ctx, t, addr, k1.Token("svc"))
	if !errors.Is(err, kerr.SaslAuthenticationFailed) || !strings.Contains(err.Error(), "token signing keys") {
		t.Errorf("login before the keys: %v, want SASL_AUTHENTICATION_FAILED saying the keys are not there yet", err)
	}
	if authFailures(s, clientauth.MechanismOAuthBearer, "keys_unavailable") == 0 {
		t.Error("not counted as keys_unavailable")
	}
	if err := s.AuthReady(); err == nil || !strings.Contains(err.Error(), srv.URL) || !strings.Contains(err.Error(), "503") {
		t.Errorf("AuthReady: %v, want the URL and its answer", err)
	}
	if st := s.OAuthKeys(); st.Keys != 0 || st.Source != srv.URL || !strings.Contains(st.Error, "503") {
		t.Errorf("status %+v", st)
	}

	up.Store(true)
	testwait.Until(t, 20*time.Second, "the keys fetched", func() bool { return s.AuthReady() == nil })
	if err := oauthLogin(ctx, t, addr, k1.Token("svc")); err != nil {
		t.Errorf("login once the keys are fetched: %v", err)
	}
	if st := s.OAuthKeys(); st.Keys != 1 || st.FetchedAt == nil || st.Error != "" {
		t.Errorf("status once fetched %+v", st)
	}
}
