package clientauth

// SASL/OAUTHBEARER (RFC 7628, KIP-255): the client sends a JWT, which
// Ferry checks against the keys of a JWKS (RFC 7517) read from a file or a
// URL: the signature (RS256/384/512, PS256/384/512, ES256/384/512; never
// "none" nor HMAC), exp (required), nbf and iat with 30 s of allowed clock
// skew, as Kafka's default; iss and aud when configured. The principal is
// the claim principal_claim names (default sub). The JOSE itself (JWK
// parsing, JWS verification, the registered claims' checks) is go-jose's;
// which algorithms, keys and claims are accepted is chosen here.
//
// A JWKS file is read again when it changes (checked at most once a
// second); a URL is fetched at start, every jwksRefresh, and when a token
// names a key ID the set lacks (at most every jwksMinRefetch), so that a
// key rotation is picked up without a restart. The fetch never holds up
// logins whose key the set has, and an endpoint down at start does not
// keep Ferry from starting: OAUTHBEARER logins are refused
// (keys_unavailable) until the keys arrive, and /readyz says so.

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// OAuthConfig configures SASL/OAUTHBEARER.
type OAuthConfig struct {
	// JWKSFile or JWKSURL (one of them) holds the keys tokens are signed
	// with.
	JWKSFile string
	JWKSURL  string
	// Issuer and Audience, when set, must match the token's iss and (one
	// of) its aud.
	Issuer   string
	Audience string
	// PrincipalClaim names the claim that holds the principal (default
	// sub).
	PrincipalClaim string

	// MinRefetch is how often at most a JWKS URL is fetched again for a
	// key ID its set lacks; 0: 10s. Not in Ferry's configuration file:
	// tests shorten it.
	MinRefetch time.Duration
}

const (
	jwtClockSkew   = 30 * time.Second
	jwksRefresh    = 5 * time.Minute
	jwksMinRefetch = 10 * time.Second
	jwksTimeout    = 10 * time.Second
)

// jwks is a key set: public keys by key ID ("" for a key without one).
type jwks struct {
	keys map[string]crypto.PublicKey
}

// parseJWKS reads a JWKS document. Keys Ferry cannot use (symmetric ones,
// types go-jose does not know, keys for encryption) are skipped; a
// malformed RSA or EC key (an EC point off its curve), an RSA key under
// 2048 bits, or a set with no usable key is an error. A private key's
// public half is used.
func parseJWKS(b []byte) (*jwks, error) {
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("not a JWKS document: %w", err)
	}
	set := &jwks{keys: map[string]crypto.PublicKey{}}
	for i, raw := range doc.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil {
			if errors.Is(err, jose.ErrUnsupportedKeyType) {
				continue
			}
			var named struct {
				Kid string `json:"kid"`
			}
			json.Unmarshal(raw, &named)
			return nil, fmt.Errorf("keys[%d] (kid %q): %w", i, named.Kid, err)
		}
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		pub := k.Public().Key // a private key's public half; nil for a symmetric one
		switch key := pub.(type) {
		case *rsa.PublicKey:
			if key.N.BitLen() < 2048 {
				return nil, fmt.Errorf("keys[%d] (kid %q): RSA key of %d bits; at least 2048 are required", i, k.KeyID, key.N.BitLen())
			}
		case *ecdsa.PublicKey:
		default:
			continue // HMAC secrets, Ed25519, ...: never accepted
		}
		set.keys[k.KeyID] = pub
	}
	if len(set.keys) == 0 {
		return nil, errors.New("the JWKS has no RSA or EC signing key")
	}
	return set, nil
}

// acceptedAlgorithms are the JWS algorithms a token may be signed with:
// never "none", never HMAC (whose key would be the JWKS's public key).
var acceptedAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
}

// oauthValidator checks tokens against the configured key set.
//
// With a URL, the set is fetched by one goroutine at a time, outside the
// lock (startFetch): a login whose key the set holds never waits for a
// fetch, however slow the endpoint; one naming a key the set lacks starts
// a fetch (at most every MinRefetch) or joins the one under way, and
// waits for it up to jwksWait. run fetches at start, retries every
// MinRefetch while there are no keys, and refreshes every jwksRefresh.
// Until a first fetch succeeds, OAUTHBEARER logins are refused
// (keys_unavailable) and keysReady reports why.
type oauthValidator struct {
	cfg  OAuthConfig
	http *http.Client
	now  func() time.Time

	mu       sync.Mutex
	set      *jwks // nil until a URL's first fetch succeeds
	mtime    time.Time
	probed   time.Time
	fetched  time.Time     // the last fetch started
	inflight chan struct{} // closed when the fetch under way ends; nil when none is
	okAt     time.Time     // the last fetch that succeeded
	lastErr  error         // the last fetch's error, nil once one succeeds
	onErr    func(error)
}

// jwksWait bounds how long a login naming a key the set lacks waits for
// the fetch that may bring it.
const jwksWait = 5 * time.Second

// errKeysUnavailable refuses OAUTHBEARER logins until the key set is
// fetched.
var errKeysUnavailable = errors.New("no token signing keys yet")

func newOAuthValidator(cfg OAuthConfig, onErr func(error)) (*oauthValidator, error) {
	if cfg.PrincipalClaim == "" {
		cfg.PrincipalClaim = "sub"
	}
	if cfg.MinRefetch == 0 {
		cfg.MinRefetch = jwksMinRefetch
	}
	v := &oauthValidator{cfg: cfg, http: &http.Client{Timeout: jwksTimeout}, now: time.Now, onErr: onErr}
	switch {
	case (cfg.JWKSFile == "") == (cfg.JWKSURL == ""):
		return nil, errors.New("oauth: set one of jwks_file and jwks_url")
	case cfg.JWKSFile != "":
		fi, err := os.Stat(cfg.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("oauth.jwks_file: %w", err)
		}
		if err := v.loadFile(fi); err != nil {
			return nil, fmt.Errorf("oauth.jwks_file %s: %w", cfg.JWKSFile, err)
		}
	default:
		// Not fetched here: an endpoint down at start must not keep
		// Ferry from serving the other mechanisms (run fetches).
		if !strings.HasPrefix(cfg.JWKSURL, "https://") && !strings.HasPrefix(cfg.JWKSURL, "http://") {
			return nil, fmt.Errorf("oauth.jwks_url %q: want an http(s) URL", cfg.JWKSURL)
		}
	}
	return v, nil
}

func (v *oauthValidator) loadFile(fi os.FileInfo) error {
	b, err := os.ReadFile(v.cfg.JWKSFile)
	if err != nil {
		return err
	}
	set, err := parseJWKS(b)
	if err != nil {
		return err
	}
	v.set, v.mtime = set, fi.ModTime()
	return nil
}

// fetch reads the key set from the URL.
func (v *oauthValidator) fetch() (*jwks, error) {
	ctx, cancel := context.WithTimeout(context.Background(), jwksTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := v.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	return parseJWKS(b)
}

// startFetch starts a fetch unless one is under way, and returns the
// channel closed when it ends; v.mu is held.
func (v *oauthValidator) startFetch() <-chan struct{} {
	if v.inflight != nil {
		return v.inflight
	}
	v.fetched = v.now()
	done := make(chan struct{})
	v.inflight = done
	go func() {
		set, err := v.fetch()
		v.mu.Lock()
		if err == nil {
			v.set, v.okAt, v.lastErr = set, v.now(), nil
		} else {
			v.lastErr = err
		}
		v.inflight = nil
		v.mu.Unlock()
		close(done)
		if err != nil {
			v.onErr(fmt.Errorf("oauth.jwks_url %s: %w; keeping the keys last fetched", v.cfg.JWKSURL, err))
		}
	}()
	return done
}

// run keeps a URL's key set fresh until ctx ends: fetched at once, again
// every MinRefetch while there are no keys, and every jwksRefresh.
func (v *oauthValidator) run(ctx context.Context) {
	if v.cfg.JWKSURL == "" {
		return
	}
	for {
		v.mu.Lock()
		every := jwksRefresh
		if v.set == nil {
			every = v.cfg.MinRefetch
		}
		var wait <-chan struct{}
		next := time.Duration(0)
		if since := v.now().Sub(v.fetched); v.fetched.IsZero() || since >= every {
			wait = v.startFetch()
		} else {
			next = every - since
		}
		v.mu.Unlock()
		if wait == nil {
			t := time.NewTimer(next)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return
		}
	}
}

// key returns the key for kid. A file is read again when it changed; a
// URL's set is fetched again when it lacks kid (at most every MinRefetch),
// and only then is the fetch waited for.
func (v *oauthValidator) key(kid string) (crypto.PublicKey, *Failure) {
	v.mu.Lock()
	now := v.now()
	if v.cfg.JWKSFile != "" && now.Sub(v.probed) >= time.Second {
		v.probed = now
		if fi, err := os.Stat(v.cfg.JWKSFile); err == nil && !fi.ModTime().Equal(v.mtime) {
			if err := v.loadFile(fi); err != nil {
				v.mtime = fi.ModTime()
				v.onErr(fmt.Errorf("oauth.jwks_file changed but cannot be used, keeping the keys last read: %w", err))
			}
		}
	}
	k, ok := v.set.lookup(kid)
	var wait <-chan struct{}
	if !ok && v.cfg.JWKSURL != "" {
		wait = v.inflight
		if wait == nil && (v.fetched.IsZero() || now.Sub(v.fetched) >= v.cfg.MinRefetch) {
			wait = v.startFetch()
		}
	}
	v.mu.Unlock()
	if wait != nil {
		t := time.NewTimer(jwksWait)
		select {
		case <-wait:
		case <-t.C:
		}
		t.Stop()
		v.mu.Lock()
		k, ok = v.set.lookup(kid)
		v.mu.Unlock()
	}
	if ok {
		return k, nil
	}
	if err := v.keysReady(); err != nil {
		return nil, &Failure{Reason: "keys_unavailable", Msg: "Ferry cannot check tokens yet: its token signing keys (the JWKS) have not been fetched; retry later", Err: err}
	}
	return nil, &Failure{Reason: "invalid_token", Msg: fmt.Sprintf("invalid token: signed with key %q, which the JWKS does not hold", kid)}
}

// lookup finds kid's key; a token without kid uses a set's only key.
func (set *jwks) lookup(kid string) (crypto.PublicKey, bool) {
	if set == nil {
		return nil, false
	}
	k, ok := set.keys[kid]
	if !ok && kid == "" && len(set.keys) == 1 {
		for _, only := range set.keys {
			return only, true
		}
	}
	return k, ok
}

// keysReady is nil once there are keys to check tokens with, else why
// not.
func (v *oauthValidator) keysReady() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.set != nil {
		return nil
	}
	if v.lastErr != nil {
		return fmt.Errorf("%w: oauth.jwks_url %s: %w", errKeysUnavailable, v.cfg.JWKSURL, v.lastErr)
	}
	return fmt.Errorf("%w: oauth.jwks_url %s: the first fetch is under way", errKeysUnavailable, v.cfg.JWKSURL)
}

// OAuthKeysStatus is the OAUTHBEARER key set as /status reports it.
type OAuthKeysStatus struct {
	// Source is the jwks_url or jwks_file.
	Source string `json:"source"`
	Keys   int    `json:"keys"`
	// FetchedAt is when the URL was last fetched successfully.
	FetchedAt *time.Time `json:"fetched_at,omitempty"`
	// Error is why the last fetch failed, or why there are no keys.
	Error string `json:"error,omitempty"`
}

func (v *oauthValidator) status() *OAuthKeysStatus {
	v.mu.Lock()
	defer v.mu.Unlock()
	st := &OAuthKeysStatus{Source: v.cfg.JWKSFile + v.cfg.JWKSURL}
	if v.set != nil {
		st.Keys = len(v.set.keys)
	}
	if !v.okAt.IsZero() {
		at := v.okAt.UTC()
		st.FetchedAt = &at
	}
	switch {
	case v.lastErr != nil:
		st.Error = v.lastErr.Error()
	case v.set == nil:
		st.Error = "the first fetch is under way"
	}
	return st
}

// validate checks a compact JWS token and returns its principal.
func (v *oauthValidator) validate(token string) (string, *Failure) {
	invalid := func(reason, format string, args ...any) (string, *Failure) {
		return "", &Failure{Reason: reason, Msg: "invalid token: " + fmt.Sprintf(format, args...)}
	}
	tok, err := jwt.ParseSigned(token, acceptedAlgorithms)
	if err != nil {
		if alg := (*jose.ErrUnexpectedSignatureAlgorithm)(nil); errors.As(err, &alg) {
			return invalid("invalid_signature", "algorithm %q is not accepted (RS, PS or ES 256/384/512)", alg.Got)
		}
		return invalid("invalid_token", "not a signed JWT (header.payload.signature): %v", err)
	}
	key, f := v.key(tok.Headers[0].KeyID)
	if f != nil {
		return "", f
	}
	var c jwt.Claims
	var raw map[string]any
	if err := tok.Claims(key, &c, &raw); err != nil {
		if errors.Is(err, jose.ErrCryptoFailure) {
			return invalid("invalid_signature", "bad signature")
		}
		return invalid("invalid_token", "claims: %v", err)
	}
	if c.Expiry == nil {
		return invalid("invalid_token", "no exp claim")
	}
	want := jwt.Expected{Issuer: v.cfg.Issuer, Time: v.now()}
	if v.cfg.Audience != "" {
		want.AnyAudience = jwt.Audience{v.cfg.Audience}
	}
	switch err := c.ValidateWithLeeway(want, jwtClockSkew); {
	case err == nil:
	case errors.Is(err, jwt.ErrExpired):
		return invalid("expired_token", "expired at %s", c.Expiry.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrNotValidYet):
		return invalid("invalid_token", "not valid before %s", c.NotBefore.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return invalid("invalid_token", "issued in the future (%s)", c.IssuedAt.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return invalid("invalid_token", "issuer %q is not the one expected", c.Issuer)
	case errors.Is(err, jwt.ErrInvalidAudience):
		return invalid("invalid_token", "audience %q does not include the one expected", []string(c.Audience))
	default:
		return invalid("invalid_token", "%v", err)
	}
	p, _ := raw[v.cfg.PrincipalClaim].(string)
	if p == "" {
		return invalid("invalid_token", "no %s claim to name the principal", v.cfg.PrincipalClaim)
	}
	return p, nil
}

// parseOAuthBearer reads the client's initial response (RFC 7628 3.1):
// gs2-header, then kvpairs separated by 0x01, one of them
// auth=Bearer <token>.
func parseOAuthBearer(msg []byte) (token string, err error) {
	s := string(msg)
	gs2, rest, ok := strings.Cut(s, "\x01")
	if !ok || !(strings.HasPrefix(gs2, "n,") || strings.HasPrefix(gs2, "y,")) {
		return "", errors.New("malformed OAUTHBEARER message")
	}
	for _, kv := range strings.Split(rest, "\x01") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "auth" {
			scheme, tok, ok := strings.Cut(v, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
				return "", errors.New("malformed OAUTHBEARER auth value: want \"Bearer <token>\"")
			}
			return strings.TrimSpace(tok), nil
		}
	}
	return "", errors.New("OAUTHBEARER message has no auth=Bearer <token>")
}
