package clusterauth

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// tokenSource gets OAUTHBEARER tokens from an OAuth 2 token endpoint with
// the client-credentials grant (RFC 6749 §4.4), and keeps one until 80% of
// its lifetime has passed.
type tokenSource struct {
	endpoint string
	clientID string
	secret   secret
	scope    string
	client   *http.Client // nil: a default one with a 10 s timeout

	mu      sync.Mutex
	cached  string
	renewAt time.Time
}

func (ts *tokenSource) token(ctx context.Context) (string, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.cached != "" && time.Now().Before(ts.renewAt) {
		return ts.cached, nil
	}
	sec, err := ts.secret.read()
	if err != nil {
		return "", err
	}
	form := url.Values{"grant_type": {"client_credentials"}}
	if ts.scope != "" {
		form.Set("scope", ts.scope)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(ts.clientID), url.QueryEscape(sec))
	cl := ts.client
	if cl == nil {
		cl = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := cl.Do(req)
	if err != nil {
		return "", fmt.Errorf("token endpoint: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("token endpoint: %w", err)
	}
	var tr struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	_ = json.Unmarshal(body, &tr)
	if resp.StatusCode != http.StatusOK || tr.AccessToken == "" {
		why := tr.Error
		if tr.Description != "" {
			why += ": " + tr.Description
		}
		if why == "" {
			why = "no access_token in the answer"
		}
		return "", fmt.Errorf("token endpoint %s answered %s: %s", ts.endpoint, resp.Status, why)
	}
	life := time.Duration(tr.ExpiresIn) * time.Second
	if life <= 0 {
		life = 5 * time.Minute
	}
	ts.cached, ts.renewAt = tr.AccessToken, time.Now().Add(life*4/5)
	return ts.cached, nil
}
