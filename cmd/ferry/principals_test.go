package main

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// mappedClusters is a configuration with clusters a and b, each given the
// principals section of the same index (indented under the cluster).
func mappedClusters(extra string, principals ...string) string {
	y := "cluster_id: vc\nadmin_open: true\n" + extra + "clusters:\n"
	for i, name := range []string{"a", "b"} {
		y += "  - name: " + name + "\n    bootstrap: [\"k1:9092\"]\n"
		if i < len(principals) && principals[i] != "" {
			y += "    principals:\n" + principals[i]
		}
	}
	return y
}

const (
	aliceMapped = "      - {principal: \"User:alice\", sasl: {mechanism: SCRAM-SHA-512, username: alice, password_env: ALICE_PW}}\n"
	bobMapped   = "      - {principal: \"User:bob\", sasl: {mechanism: SCRAM-SHA-512, username: bob, password_env: BOB_PW}}\n"
)

// TestPrincipalMappingConfig: clusters[].principals and
// unmapped_principals are checked with the other keys: the principal's
// form, its sasl section by the cluster's own rules (no password in
// clear), the same principals on every cluster, and refuse only with
// clients that have principals.
func TestPrincipalMappingConfig(t *testing.T) {
	if _, err := configFrom(mappedClusters("", aliceMapped+bobMapped, bobMapped+aliceMapped)); err != nil {
		t.Fatalf("the same principals on both clusters: %v", err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"not on the other cluster", mappedClusters("", aliceMapped+bobMapped, aliceMapped),
			"clusters[1] (b) principals: User:bob mapped on a but not here; every cluster must map the same principals"},
		{"no User: prefix", mappedClusters("", "      - {principal: alice, sasl: {mechanism: PLAIN, username: a, password_env: P}}\n", ""),
			"clusters[0] (a) principals[0] (alice): principal must be User:<name>"},
		{"twice", mappedClusters("", aliceMapped+aliceMapped, aliceMapped), "clusters[0] (a) principals[1] (User:alice): mapped twice"},
		{"no sasl", mappedClusters("", "      - {principal: \"User:alice\"}\n", aliceMapped), "clusters[0] (a) principals[0] (User:alice): sasl is required"},
		{"no secret", mappedClusters("", "      - {principal: \"User:alice\", sasl: {mechanism: SCRAM-SHA-512, username: alice}}\n", aliceMapped),
			"clusters[0] (a) principals[0] (User:alice): sasl: SCRAM-SHA-512 needs the password"},
		{"clear password", mappedClusters("", "      - {principal: \"User:alice\", sasl: {mechanism: SCRAM-SHA-512, username: alice, password: hunter2}}\n", aliceMapped),
			`key "password": a secret is never written in the configuration file`},
		{"unknown unmapped", mappedClusters("unmapped_principals: deny\n", aliceMapped, aliceMapped), `unmapped_principals "deny": want service`},
		{"refuse without principals", mappedClusters("unmapped_principals: refuse\n", aliceMapped, aliceMapped),
			"unmapped_principals: refuse needs clients with principals: sasl, or tls with client_ca_file"},
	} {
		_, err := configFrom(tc.yaml)
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the password", tc.name)
		}
	}
	// The secret files are read when the member is built.
	cfg, err := configFrom(mappedClusters("admin_listen: 127.0.0.1:0\nlisten: 127.0.0.1:0\n",
		"      - {principal: \"User:alice\", sasl: {mechanism: SCRAM-SHA-512, username: alice, password_file: /nonexistent/alice}}\n", aliceMapped))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("ALICE_PW", "x")
	_, err = newNode(cfg, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), "clusters[0] (a) principals[0] (User:alice): sasl: reading the password: open /nonexistent/alice") {
		t.Errorf("unreadable password file: %v", err)
	}
}

// TestSwitchoverPrintsPrincipals: `ferry switchover` prints each principal
// of a principals_unauthenticated refusal on its own line, and
// --force-unauthenticated goes with --forced only.
func TestSwitchoverPrintsPrincipals(t *testing.T) {
	raw := []byte(`{"error":"principals_unauthenticated","message":"1 mapped client principal(s) cannot authenticate on b","principals":["User:bob: SASL authentication failed"]}`)
	err := refusal("switchover", &http.Response{StatusCode: 409, Status: "409 Conflict"}, raw)
	want := "switchover refused (409 principals_unauthenticated): 1 mapped client principal(s) cannot authenticate on b\n  User:bob: SASL authentication failed"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if _, err := parseSwitchoverFlags([]string{"--to", "b", "--force-unauthenticated"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--force-unauthenticated goes with --forced") {
		t.Errorf("--force-unauthenticated without --forced: %v", err)
	}
	f, err := parseSwitchoverFlags([]string{"--to", "b", "--forced", "--force-unauthenticated"}, io.Discard)
	if err != nil || !f.forceUnauthenticated {
		t.Errorf("--forced --force-unauthenticated: %+v %v", f, err)
	}
}
