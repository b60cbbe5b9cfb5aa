package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestClusterSecurityConfig: the tls and sasl sections of a cluster are
// checked with the other keys, each problem naming the cluster; a password
// written in the file is refused with what to do instead.
func TestClusterSecurityConfig(t *testing.T) {
	for _, tc := range []struct {
		name, section, want string
	}{
		{"clear password", "sasl: {mechanism: SCRAM-SHA-512, username: ferry, password: hunter2}",
			`line 7: key "password": a secret is never written in the configuration file: put it in a file or an environment variable and name it with password_file or password_env`},
		{"unknown mechanism", "sasl: {mechanism: KERBEROS, username: ferry, password_env: PW}",
			`clusters[0] (a): sasl.mechanism "KERBEROS": not one Ferry speaks; use one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER`},
		{"no secret", "sasl: {mechanism: PLAIN, username: ferry}",
			"clusters[0] (a): sasl: PLAIN needs the password: sasl.password_file or sasl.password_env"},
		{"bad min_version", "tls: {enabled: true, min_version: '1.0'}",
			`clusters[0] (a): tls.min_version "1.0": TLS 1.0 and 1.1 are not accepted`},
		{"oauth endpoint without id", "sasl: {mechanism: OAUTHBEARER, token_endpoint: 'https://idp/token', client_secret_env: S}",
			"clusters[0] (a): sasl.client_id is required with token_endpoint"},
	} {
		_, err := configFrom(minimal + "    " + tc.section + "\n")
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the password: %v", tc.name, err)
		}
	}
}

// TestClusterSecurityFiles: files named by the sections are read when the
// member is built: an unreadable one fails naming the cluster and the key.
func TestClusterSecurityFiles(t *testing.T) {
	for _, tc := range []struct{ section, want string }{
		{"sasl: {mechanism: PLAIN, username: ferry, password_file: /nonexistent/pw}", "cluster a: sasl: reading the password: open /nonexistent/pw"},
		{"sasl: {mechanism: PLAIN, username: ferry, password_env: FERRY_TEST_UNSET_PW}", "cluster a: sasl: the password environment variable FERRY_TEST_UNSET_PW is not set"},
		{"tls: {ca_file: /nonexistent/ca.crt}", "cluster a: tls: ca_file: stat /nonexistent/ca.crt"},
		{"tls: {cert_file: /nonexistent/c.crt, key_file: /nonexistent/c.key}", "cluster a: tls: cert_file: stat /nonexistent/c.crt"},
	} {
		cfg, err := configFrom(minimal + "    " + tc.section + "\nadmin_listen: 127.0.0.1:0\nlisten: 127.0.0.1:0\n")
		if err != nil {
			t.Fatal(err)
		}
		_, err = newNode(cfg, zap.NewNop())
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.section, err, tc.want)
		}
	}
}

// TestPrintConfigNoSecret: --print-config shows the mechanism, the user
// and where the secrets are, never a secret itself.
func TestPrintConfigNoSecret(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("hunter2\n"), 0o600)
	t.Setenv("FERRY_TEST_SECRET", "s3cr3t-env")
	cfg, err := configFrom(`
cluster_id: vc
admin_open: true
clusters:
  - name: a
    bootstrap: ["k1:9092"]
    tls: {enabled: true, server_name: kafka.example}
    sasl: {mechanism: SCRAM-SHA-512, username: ferry, password_file: ` + pw + `}
  - name: b
    bootstrap: ["k2:9092"]
    sasl: {mechanism: OAUTHBEARER, token_endpoint: "https://idp/token", client_id: ferry, client_secret_env: FERRY_TEST_SECRET}
`)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printConfig(&out, cfg); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"mechanism: SCRAM-SHA-512", "username: ferry", "password_file: " + pw, "client_secret_env: FERRY_TEST_SECRET", "server_name: kafka.example"} {
		if !strings.Contains(s, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, s)
		}
	}
	for _, secret := range []string{"hunter2", "s3cr3t-env"} {
		if strings.Contains(s, secret) {
			t.Errorf("--print-config shows a secret:\n%s", s)
		}
	}
	secs, err := cfg.security()
	if err != nil {
		t.Fatal(err)
	}
	if d := secs["a"].Describe(); d != "SASL_SSL SCRAM-SHA-512 as ferry" {
		t.Errorf("cluster a: %q", d)
	}
	if d := secs["b"].Describe(); d != "SASL_PLAINTEXT OAUTHBEARER" {
		t.Errorf("cluster b: %q", d)
	}
}

// TestSecretFromEnvironmentRefused: FERRY_CLUSTERS_<NAME>_SASL_PASSWORD
// is not a key; the error says how to give the password instead.
func TestSecretFromEnvironmentRefused(t *testing.T) {
	c, err := parseConfig(strings.NewReader(minimal + "    sasl: {mechanism: PLAIN, username: u, password_env: PW}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.applyEnv([]string{"FERRY_CLUSTERS_A_SASL_PASSWORD=hunter2"})
	if err == nil || !strings.Contains(err.Error(), "FERRY_CLUSTERS_A_SASL_PASSWORD: a secret is not a configuration key") ||
		!strings.Contains(err.Error(), "sasl.password_file or password_env") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("%v", err)
	}
}
