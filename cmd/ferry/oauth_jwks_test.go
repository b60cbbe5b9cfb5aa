package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestServeOAuthJWKSDown: a member whose jwks_url fails starts all the
// same (it refused to before); /readyz answers 503 naming the URL and
// /status shows the key set's error under auth, until the endpoint answers
// and the keys are fetched without a login asking.
func TestServeOAuthJWKSDown(t *testing.T) {
	var up atomic.Bool
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		// An RSA key of 2048 bits: n is 256 bytes of 0xff, e 65537.
		fmt.Fprintf(w, `{"keys":[{"kty":"RSA","kid":"k1","n":%q,"e":"AQAB"}]}`, strings.Repeat("_", 341)+"w")
	}))
	defer jwks.Close()
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	n, _ := startNode(t, fmt.Sprintf(`
cluster_id: ferry-jwks-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters: [{name: main, bootstrap: [%s]}]
sasl: {mechanisms: [OAUTHBEARER], oauth: {jwks_url: %q}}
`, strings.Join(kf.ListenAddrs(), ", "), jwks.URL))
	adminURL := "http://" + n.adminLn.Addr().String()
	testwait.Eventually(t, 20*time.Second, "/readyz naming the failing JWKS", func() error {
		code, body := httpGet(t, adminURL+"/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "token signing keys") || !strings.Contains(body, jwks.URL) || !strings.Contains(body, "503") {
			return fmt.Errorf("%d %q", code, body)
		}
		return nil
	})
	_, body := httpGet(t, adminURL+"/status")
	var st admin.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Ready || st.Auth == nil || st.Auth.OAuthKeys == nil || st.Auth.OAuthKeys.Source != jwks.URL || !strings.Contains(st.Auth.OAuthKeys.Error, "503") {
		t.Fatalf("/status with the JWKS down: ready %v, auth %+v", st.Ready, st.Auth)
	}
	up.Store(true)
	testwait.Eventually(t, 30*time.Second, "/readyz once the JWKS answers", func() error {
		if code, body := httpGet(t, adminURL+"/readyz"); code != http.StatusOK {
			return fmt.Errorf("%d %q", code, body)
		}
		return nil
	})
}
