package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/conformance/testpki"
)

// TestExampleListenerSecurity: the commented tls and sasl block of the
// example configuration validates once uncommented, with its defaults.
func TestExampleListenerSecurity(t *testing.T) {
	b, err := os.ReadFile("../../docs/ferry.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, "# --- begin listener security\n"), strings.Index(s, "# --- end listener security")
	if i < 0 || j < i {
		t.Fatal("the example has no listener security block")
	}
	var block []string
	for _, l := range strings.Split(s[i:j], "\n")[1:] {
		block = append(block, strings.TrimPrefix(strings.TrimPrefix(l, "#"), " "))
	}
	c, err := configFrom(minimal + strings.Join(block, "\n"))
	if err != nil {
		t.Fatalf("the listener security example does not validate: %v", err)
	}
	if c.TLS == nil || c.TLS.ClientAuth != "request" || c.SASL == nil || len(c.SASL.Mechanisms) != 3 ||
		c.SASL.OAuth.JWKSURL == "" || c.SASL.FailedLoginInterval != time.Minute {
		t.Errorf("parsed %+v %+v", c.TLS, c.SASL)
	}
}

func TestListenerSecurityConfig(t *testing.T) {
	c, err := configFrom(minimal + "tls: {cert_file: a.crt, key_file: a.key}\nsasl: {mechanisms: [SCRAM-SHA-512], credentials_file: u.yaml}\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.TLS.ClientAuth != "none" || c.TLS.MinVersion != "1.2" || c.SASL.FailedLoginBurst != clientauth.DefaultFailedAuthBurst ||
		c.SASL.FailedLoginDelay != clientauth.DefaultFailedAuthDelay || c.SASL.FailedLoginInterval != clientauth.DefaultFailedAuthInterval ||
		c.SASL.FailedLoginAddressBurst != clientauth.DefaultFailedAuthAddressFactor*clientauth.DefaultFailedAuthBurst {
		t.Errorf("defaults: %+v %+v", c.TLS, c.SASL)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"sasl: {mechanisms: [PLAIN], credentials_file: u.yaml}\n", "allow_plain_without_tls"},
		{"sasl: {mechanisms: [PLAIN], credentials_file: u.yaml, allow_plain_without_tls: true}\n", ""},
		{"sasl: {mechanisms: [GSSAPI], credentials_file: u.yaml}\n", `sasl.mechanisms[0] "GSSAPI"`},
		{"sasl: {mechanisms: [SCRAM-SHA-256]}\n", "sasl.credentials_file is required"},
		{"sasl: {mechanisms: [OAUTHBEARER]}\n", "jwks_file or jwks_url"},
		{"sasl: {}\n", "sasl.mechanisms"},
		{"sasl: {mechanisms: [SCRAM-SHA-512], credentials_file: u.yaml, failed_login_address_burst: -1}\n", "sasl.failed_login_address_burst -1: must not be negative"},
		{"tls: {cert_file: a.crt}\n", "cert_file and key_file"},
		{"tls: {cert_file: a.crt, key_file: a.key, client_auth: require}\n", "client_ca_file is required"},
		{"tls: {cert_file: a.crt, key_file: a.key, client_auth: maybe}\n", "tls.client_auth"},
		{"tls: {cert_file: a.crt, key_file: a.key, min_version: \"1.1\"}\n", "tls.min_version"},
	} {
		_, err := configFrom(minimal + tc.yaml)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.yaml, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v; want an error mentioning %q", tc.yaml, err, tc.want)
		}
	}
	// The environment reaches the sections, creating them.
	c2, err := parseConfig(strings.NewReader(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.applyEnv([]string{"FERRY_SASL_MECHANISMS=SCRAM-SHA-512,SCRAM-SHA-256", "FERRY_SASL_CREDENTIALS_FILE=/u.yaml", "FERRY_TLS_CERT_FILE=/c", "FERRY_TLS_KEY_FILE=/k"}); err != nil {
		t.Fatal(err)
	}
	if c2.SASL == nil || len(c2.SASL.Mechanisms) != 2 || c2.TLS == nil || c2.TLS.KeyFile != "/k" {
		t.Errorf("from the environment: %+v %+v", c2.TLS, c2.SASL)
	}
}

// TestUsersCommand: add (password on stdin, or in a file), list, replace,
// delete; the store holds no password and authenticates what was set.
func TestUsersCommand(t *testing.T) {
	store := filepath.Join(t.TempDir(), "users.yaml")
	run := func(stdin string, args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := usersCmd(args, strings.NewReader(stdin), &out, &errb)
		return out.String() + errb.String(), err
	}
	if _, err := run("s3cret-pw\n", "add", "--store", store, "--user", "alice", "--iterations", "4096"); err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pwFile, []byte("bob-pw\n"), 0o600)
	if _, err := run("", "add", "--store", store, "--user", "bob", "--mechanism", "SCRAM-SHA-256", "--password-file", pwFile); err != nil {
		t.Fatal(err)
	}
	out, err := run("", "list", "--store", store)
	if err != nil || out != "alice\tSCRAM-SHA-256,SCRAM-SHA-512\nbob\tSCRAM-SHA-256\n" {
		t.Errorf("list: %q %v", out, err)
	}
	b, _ := os.ReadFile(store)
	if bytes.Contains(b, []byte("s3cret-pw")) || bytes.Contains(b, []byte("bob-pw")) {
		t.Error("the store holds a password")
	}
	if fi, _ := os.Stat(store); fi.Mode().Perm() != 0o600 {
		t.Errorf("store mode %v, want 0600", fi.Mode().Perm())
	}
	creds, err := clientauth.LoadCredentials(store)
	if err != nil || len(creds.Users["alice"]) != 2 || creds.Users["alice"]["SCRAM-SHA-512"].Iterations != 4096 {
		t.Fatalf("store: %+v %v", creds, err)
	}
	if _, err := run("", "add", "--store", store, "--user", "carol"); err == nil {
		t.Error("an empty password was accepted")
	}
	if _, err := run("x\n", "add", "--store", store, "--user", "carol", "--iterations", "10"); err == nil {
		t.Error("10 iterations were accepted")
	}
	if _, err := run("", "delete", "--store", store, "--user", "bob"); err != nil {
		t.Fatal(err)
	}
	if out, _ := run("", "list", "--store", store); out != "alice\tSCRAM-SHA-256,SCRAM-SHA-512\n" {
		t.Errorf("after delete: %q", out)
	}
	if _, err := run("", "delete", "--store", store, "--user", "bob"); err == nil {
		t.Error("deleting a missing user succeeded")
	}
}

// listenerTLS issues a certificate for 127.0.0.1 from a new CA and writes
// it to dir, for a listener's tls.
func listenerTLS(t *testing.T, dir, caName string) (ca *testpki.CA, certFile, keyFile string) {
	t.Helper()
	ca, err := testpki.NewCA(caName)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.LeafOptions{CommonName: "ferry", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if certFile, keyFile, err = leaf.WriteFiles(dir, "ferry"); err != nil {
		t.Fatal(err)
	}
	return ca, certFile, keyFile
}

// usersStore makes a credential store in dir with `ferry users add`, one
// user per name, each with its password, and returns its path.
func usersStore(t *testing.T, dir string, passwords map[string]string) string {
	t.Helper()
	store := filepath.Join(dir, "users.yaml")
	for user, password := range passwords {
		add := ferryCmd(t, "users", "add", "--store", store, "--user", user)
		add.Stdin = strings.NewReader(password + "\n")
		if out, err := add.CombinedOutput(); err != nil {
			t.Fatalf("ferry users add %s: %v\n%s", user, err, out)
		}
	}
	return store
}

// scramServeConfig is the configuration of a `ferry serve` in front of a
// new in-process cluster, with TLS and SASL (mechanisms, a YAML list's
// items) on its listener and one user, svc (password svc-password), and
// extra lines; store is the credentials file, ca signed the listener's
// certificate.
func scramServeConfig(t *testing.T, clusterID, mechanisms, extra string) (config, store string, ca *testpki.CA) {
	t.Helper()
	dir := t.TempDir()
	ca, certFile, keyFile := listenerTLS(t, dir, clusterID+"-ca")
	store = usersStore(t, dir, map[string]string{"svc": "svc-password"})
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	return fmt.Sprintf(`
cluster_id: %s
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters: [{name: main, bootstrap: [%s]}]
tls: {cert_file: %s, key_file: %s}
sasl: {mechanisms: [%s], credentials_file: %s}
%s`, clusterID, strings.Join(kf.ListenAddrs(), ", "), certFile, keyFile, mechanisms, store, extra), store, ca
}

// startScramServe starts `ferry serve` with a scramServeConfig and returns
// it, its admin and Kafka addresses, and a client TLS configuration that
// trusts ca.
func startScramServe(t *testing.T, config string, ca *testpki.CA) (p *proc, adminAddr, addr string, tlsCfg *tls.Config) {
	t.Helper()
	p = startFerry(t, "serve", "--config", writeConfig(t, config))
	adminAddr = p.waitFor(t, adminLog, 30*time.Second)[1]
	addr = p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 60*time.Second)[1]
	return p, adminAddr, addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
}

// scramClient is a client of addr over tlsCfg that logs in as user with
// SCRAM-SHA-512.
func scramClient(t *testing.T, addr string, tlsCfg *tls.Config, user, pass string) *kgo.Client {
	t.Helper()
	return newClient(t, kgo.SeedBrokers(addr), kgo.DialTLSConfig(tlsCfg), kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
}

// TestServeClientSecurity: `ferry users add` makes a user, `ferry serve`
// with tls and sasl serves it over TLS and SCRAM-SHA-512 (and nobody with
// a wrong password), /connections shows the principal, /metrics counts
// the authentications; a credentials_file that does not exist stops the
// start with an error naming it.
func TestServeClientSecurity(t *testing.T) {
	config, store, ca := scramServeConfig(t, "ferry-sec-test", "SCRAM-SHA-512, PLAIN", "")
	bad := ferryCmd(t, "serve", "--config", writeConfig(t, strings.Replace(config, store, filepath.Join(filepath.Dir(store), "missing.yaml"), 1)))
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "credentials_file") {
		t.Fatalf("a missing credentials_file: %v\n%s", err, out)
	}

	p, adminAddr, addr, tlsCfg := startScramServe(t, config, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := scramClient(t, addr, tlsCfg, "svc", "nope").Ping(ctx); !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("wrong password: %v", err)
	}
	if err := scramClient(t, addr, tlsCfg, "svc", "svc-password").Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if _, body := httpGet(t, "http://"+adminAddr+"/connections"); !strings.Contains(body, `"principal": "User:svc"`) {
		t.Errorf("/connections shows no principal User:svc:\n%s", body)
	}
	_, metrics := httpGet(t, "http://"+adminAddr+"/metrics")
	for _, want := range []string{`ferry_client_auth_successes_total{mechanism="SCRAM-SHA-512"}`, `ferry_client_auth_failures_total{mechanism="SCRAM-SHA-512",reason="bad_password"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	p.stop(t, 15*time.Second)
}
