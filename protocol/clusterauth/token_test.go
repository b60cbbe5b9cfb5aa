package clusterauth

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestTokenEndpoint: a token is asked with the client-credentials grant
// and kept while fresh; a refusal is an error that quotes the endpoint's
// reason, never the secret; the secret file is read at each request.
func TestTokenEndpoint(t *testing.T) {
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		id, sec, _ := r.BasicAuth()
		if id != "ferry" || sec != "s3cret" || r.FormValue("grant_type") != "client_credentials" || r.FormValue("scope") != "kafka" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"invalid_client","error_description":"bad credentials"}`)
			return
		}
		fmt.Fprintf(w, `{"access_token":"tok-%d","expires_in":3600}`, asked.Load())
	}))
	defer srv.Close()
	f := writeSecret(t, "s3cret")
	ts := &tokenSource{endpoint: srv.URL, clientID: "ferry", secret: secret{what: "client secret", file: f}, scope: "kafka"}
	for range 3 {
		tok, err := ts.token(context.Background())
		if err != nil || tok != "tok-1" {
			t.Fatalf("token %q, %v", tok, err)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("endpoint asked %d times for a fresh token", n)
	}
	ts.cached = ""
	writeFile(t, f, "wrong-secret-99")
	_, err := ts.token(context.Background())
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized: invalid_client: bad credentials") || strings.Contains(err.Error(), "wrong-secret-99") {
		t.Fatalf("refused: %v", err)
	}
}
