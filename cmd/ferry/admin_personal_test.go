package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestServeConnectionsPersonalData: `ferry serve` with SASL and an admin
// token. After a failed login as a user that does not exist and a good one
// as svc, GET /connections without the token shows neither the principal,
// nor the client addresses, nor the name the failed login tried, and
// refuses the principal filter; with the token (the API, and `ferry
// connections` with FERRY_ADMIN_TOKEN) it shows them.
func TestServeConnectionsPersonalData(t *testing.T) {
	const token = "personal-data-token"
	config, _, ca := scramServeConfig(t, "ferry-personal-test", "SCRAM-SHA-512", "admin_token_file: "+tokenFile(t, token)+"\n")
	p, adminAddr, addr, tlsCfg := startScramServe(t, config, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := scramClient(t, addr, tlsCfg, "mallory", "guess").Ping(ctx); !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("an unknown user: %v", err)
	}
	if err := scramClient(t, addr, tlsCfg, "svc", "svc-password").Ping(ctx); err != nil {
		t.Fatal(err)
	}

	get := func(path, auth string) (int, string) {
		t.Helper()
		return httpGetToken(t, "http://"+adminAddr+path, auth)
	}
	// The failed login is among the closed connections once retired.
	var withToken string
	testwait.Eventually(t, 30*time.Second, "/connections with the token showing the failed login and User:svc", func() error {
		_, withToken = get("/connections?state=all", token)
		if !strings.Contains(withToken, `"close_reason": "auth_failed"`) || !strings.Contains(withToken, `"principal": "User:svc"`) {
			return fmt.Errorf("/connections?state=all:\n%s", withToken)
		}
		return nil
	})
	if !strings.Contains(withToken, `"remote": "127.0.0.1:`) {
		t.Errorf("/connections with the token shows no client address:\n%s", withToken)
	}
	code, body := get("/connections?state=all", "")
	if code != http.StatusOK || !strings.Contains(body, `"close_reason": "auth_failed"`) {
		t.Fatalf("/connections without the token: %d\n%s", code, body)
	}
	for _, personal := range []string{"User:svc", "svc", "mallory", "127.0.0.1:"} {
		if strings.Contains(body, personal) {
			t.Errorf("/connections without the token shows %q:\n%s", personal, body)
		}
	}
	if !strings.Contains(body, `"redacted": [`) {
		t.Errorf("/connections without the token does not say what it hid:\n%s", body)
	}
	if code, body := get("/connections?state=all&principal=svc", ""); code != http.StatusUnauthorized {
		t.Errorf("the principal filter without the token: %d %s, want 401", code, body)
	}

	// The CLI, with the token from the environment, shows them.
	t.Setenv(adminTokenEnv, token)
	code, out, errs := runCLI(t, "connections", "--admin", adminAddr, "--principal", "svc")
	if code != 0 || !strings.Contains(out, "User:svc") || !strings.Contains(out, "127.0.0.1:") || strings.Contains(out, "hidden") {
		t.Errorf("ferry connections with the token: exit %d, stderr %q:\n%s", code, errs, out)
	}
	p.stop(t, 15*time.Second)
}
