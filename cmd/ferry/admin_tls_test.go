package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferry-gw/ferry/conformance/testpki"
)

// TestServeAdminTLS: `ferry serve` with admin_tls and client certificates
// requested. The CLI reaches the API over https with --cacert; plain http
// is refused; an endpoint that changes something accepts a verified client
// certificate in place of the admin token, and without either answers 401;
// a certificate from another CA does not stand for the token.
func TestServeAdminTLS(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	dir := t.TempDir()
	ca, err := testpki.NewCA("ferry-admin-ca")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteFile(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *testpki.CA, name string, o testpki.LeafOptions) (string, string) {
		t.Helper()
		leaf, err := ca.Issue(o)
		if err != nil {
			t.Fatal(err)
		}
		c, k, err := leaf.WriteFiles(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	serverCert, serverKey := issue(ca, "server", testpki.LeafOptions{CommonName: "ferry-0", Hosts: []string{"127.0.0.1"}})
	opCert, opKey := issue(ca, "operator", testpki.LeafOptions{CommonName: "operator", Client: true})
	other, err := testpki.NewCA("another-ca")
	if err != nil {
		t.Fatal(err)
	}
	strangerCert, strangerKey := issue(other, "stranger", testpki.LeafOptions{CommonName: "stranger", Client: true})

	path := writeConfig(t, fmt.Sprintf(`
cluster_id: vc
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
admin_token_file: %s
admin_tls: {cert_file: %s, key_file: %s, client_ca_file: %s, client_auth: request}
clusters:
  - name: main
    bootstrap: [%s]
`, tokenFile(t, testAdminToken), serverCert, serverKey, caFile, strings.Join(kf.ListenAddrs(), ", ")))
	p := startFerry(t, "serve", "--config", path)
	m := p.waitFor(t, regexp.MustCompile(`"msg":"admin API listening".*"admin":"([^"]+)".*"scheme":"https"`), 60*time.Second)
	addr := m[1]

	// The CLI over https, trusting the CA.
	code, out, errs := runCLI(t, "status", "--admin", addr, "--cacert", caFile)
	if code != 0 || !strings.Contains(out, "routing    generation 0, active main, serving") {
		t.Fatalf("ferry status --cacert: exit %d\n%s%s", code, out, errs)
	}
	// Without the CA the member's certificate is not trusted.
	if code, _, errs := runCLI(t, "status", "--admin", "https://"+addr); code != 1 || !strings.Contains(errs, "certificate") {
		t.Errorf("ferry status without --cacert: exit %d, %q; want 1 and a certificate error", code, errs)
	}
	// Plain http to the TLS port: refused by the server.
	if resp, err := http.Get("http://" + addr + "/status"); err == nil {
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain http to the TLS admin port: %s, want 400", resp.Status)
		}
		resp.Body.Close()
	}

	post := func(certFile, keyFile, token string) int {
		t.Helper()
		cfg := &tls.Config{RootCAs: ca.Pool()}
		if certFile != "" {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/switchover", strings.NewReader(`{"to": "nowhere"}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Neither token nor certificate: 401. The operator's certificate, or
	// the token: past the check (the switch is then refused: no such
	// cluster). A certificate of another CA: no handshake.
	if got := post("", "", ""); got != http.StatusUnauthorized {
		t.Errorf("POST /switchover with neither token nor certificate: %d, want 401", got)
	}
	if got := post(opCert, opKey, ""); got != http.StatusBadRequest && got != http.StatusConflict && got != http.StatusNotFound {
		t.Errorf("POST /switchover with the operator's certificate: %d, want past the token check (a refusal of the unknown cluster)", got)
	}
	if got := post("", "", testAdminToken); got == http.StatusUnauthorized || got < 0 {
		t.Errorf("POST /switchover with the token: %d, want past the token check", got)
	}
	// (Go's client does not even present it: the server names the CAs it
	// accepts. Either way it does not stand for the token.)
	if got := post(strangerCert, strangerKey, ""); got != -1 && got != http.StatusUnauthorized {
		t.Errorf("POST /switchover with another CA's certificate: %d, want the handshake refused or 401", got)
	}
	// The CLI with the operator's certificate and no token.
	os.Unsetenv("FERRY_ADMIN_TOKEN")
	code, _, errs = runCLI(t, "switchover", "--admin", addr, "--cacert", caFile, "--cert", opCert, "--key", opKey, "--to", "nowhere")
	if code == 0 || strings.Contains(errs, "401") || strings.Contains(errs, "token") {
		t.Errorf("ferry switchover with the operator's certificate: exit %d, %q; want refused for the cluster, not for want of a token", code, errs)
	}
	if _, _, errs := runCLI(t, "status", "--admin", addr, "--cacert", filepath.Join(dir, "missing.crt")); !strings.Contains(errs, "--cacert") {
		t.Errorf("a missing --cacert file: %q", errs)
	}
	p.stop(t, 15*time.Second)
}
