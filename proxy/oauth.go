package proxy

// SASL/OAUTHBEARER (RFC 7628, KIP-255): the client sends a JWT, which
// Ferry checks against the keys of a JWKS (RFC 7517) read from a file or a
// URL: the signature (RS256/384/512, PS256/384/512, ES256/384/512; never
// "none" nor HMAC), exp (required), nbf and iat with 30 s of allowed clock
// skew, as Kafka's default; iss and aud when configured. The principal is
// the claim principal_claim names (default sub). Standard library only:
// the parts of JOSE used here are small, and every choice (which
// algorithms, which claims) is explicit.
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
	"crypto/elliptic"
	"crypto/rsa"
	_ "crypto/sha256" // the hashes of the JWS algorithms
	_ "crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
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

	// minRefetch is jwksMinRefetch but in tests.
	minRefetch time.Duration
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

type jwkJSON struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// parseJWKS reads a JWKS document. Keys of a type Ferry cannot use, or for
// encryption, are skipped; a set with no usable key is an error.
func parseJWKS(b []byte) (*jwks, error) {
	var doc struct {
		Keys []jwkJSON `json:"keys"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("not a JWKS document: %w", err)
	}
	set := &jwks{keys: map[string]crypto.PublicKey{}}
	for i, k := range doc.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		var pub crypto.PublicKey
		switch k.Kty {
		case "RSA":
			n, err1 := b64Int(k.N)
			e, err2 := b64Int(k.E)
			if err1 != nil || err2 != nil || !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 {
				return nil, fmt.Errorf("keys[%d] (kid %q): bad RSA key", i, k.Kid)
			}
			if n.BitLen() < 2048 {
				return nil, fmt.Errorf("keys[%d] (kid %q): RSA key of %d bits; at least 2048 are required", i, k.Kid, n.BitLen())
			}
			pub = &rsa.PublicKey{N: n, E: int(e.Int64())}
		case "EC":
			var curve elliptic.Curve
			switch k.Crv {
			case "P-256":
				curve = elliptic.P256()
			case "P-384":
				curve = elliptic.P384()
			case "P-521":
				curve = elliptic.P521()
			default:
				return nil, fmt.Errorf("keys[%d] (kid %q): unsupported curve %q", i, k.Kid, k.Crv)
			}
			size := (curve.Params().BitSize + 7) / 8
			x, err1 := b64Bytes(k.X)
			y, err2 := b64Bytes(k.Y)
			if err1 != nil || err2 != nil || len(x) != size || len(y) != size {
				return nil, fmt.Errorf("keys[%d] (kid %q): bad EC key: want %d-byte coordinates", i, k.Kid, size)
			}
			ek, err := ecdsa.ParseUncompressedPublicKey(curve, append(append([]byte{4}, x...), y...)) // checks the point is on the curve
			if err != nil {
				return nil, fmt.Errorf("keys[%d] (kid %q): bad EC key: %w", i, k.Kid, err)
			}
			pub = ek
		default:
			continue
		}
		set.keys[k.Kid] = pub
	}
	if len(set.keys) == 0 {
		return nil, errors.New("the JWKS has no RSA or EC signing key")
	}
	return set, nil
}

func b64Int(s string) (*big.Int, error) {
	b, err := b64Bytes(s)
	if err != nil {
		return nil, err
	}
	return new(big.Int).SetBytes(b), nil
}

func b64Bytes(s string) ([]byte, error) {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil || len(b) == 0 {
		return nil, errors.New("bad base64url value")
	}
	return b, nil
}

// jwtClaims are the claims Ferry reads; the principal claim is read from
// the raw map.
type jwtClaims struct {
	raw map[string]any
	exp *float64
	nbf *float64
	iat *float64
	iss string
	aud []string
}

// oauthValidator checks tokens against the configured key set.
//
// With a URL, the set is fetched by one goroutine at a time, outside the
// lock (startFetch): a login whose key the set holds never waits for a
// fetch, however slow the endpoint; one naming a key the set lacks starts
// a fetch (at most every minRefetch) or joins the one under way, and
// waits for it up to jwksWait. run fetches at start, retries every
// minRefetch while there are no keys, and refreshes every jwksRefresh.
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
	if cfg.minRefetch == 0 {
		cfg.minRefetch = jwksMinRefetch
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
// every minRefetch while there are no keys, and every jwksRefresh.
func (v *oauthValidator) run(ctx context.Context) {
	if v.cfg.JWKSURL == "" {
		return
	}
	for {
		v.mu.Lock()
		every := jwksRefresh
		if v.set == nil {
			every = v.cfg.minRefetch
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
// URL's set is fetched again when it lacks kid (at most every minRefetch),
// and only then is the fetch waited for.
func (v *oauthValidator) key(kid string) (crypto.PublicKey, *authFailure) {
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
		if wait == nil && (v.fetched.IsZero() || now.Sub(v.fetched) >= v.cfg.minRefetch) {
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
		return nil, &authFailure{reason: "keys_unavailable", msg: "Ferry cannot check tokens yet: its token signing keys (the JWKS) have not been fetched; retry later", err: err}
	}
	return nil, &authFailure{reason: "invalid_token", msg: fmt.Sprintf("invalid token: signed with key %q, which the JWKS does not hold", kid)}
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
func (v *oauthValidator) validate(token string) (string, *authFailure) {
	invalid := func(reason, format string, args ...any) (string, *authFailure) {
		return "", &authFailure{reason: reason, msg: "invalid token: " + fmt.Sprintf(format, args...)}
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return invalid("invalid_token", "not a signed JWT (header.payload.signature)")
	}
	var hdr struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
		Typ string `json:"typ"`
	}
	if err := decodeSegment(parts[0], &hdr); err != nil {
		return invalid("invalid_token", "header: %v", err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return invalid("invalid_token", "signature is not base64url")
	}
	key, f := v.key(hdr.Kid)
	if f != nil {
		return "", f
	}
	if err := verifyJWS(hdr.Alg, key, []byte(parts[0]+"."+parts[1]), sig); err != nil {
		return invalid("invalid_signature", "%v", err)
	}
	var raw map[string]any
	if err := decodeSegment(parts[1], &raw); err != nil {
		return invalid("invalid_token", "claims: %v", err)
	}
	c := claimsOf(raw)
	now := v.now()
	switch {
	case c.exp == nil:
		return invalid("invalid_token", "no exp claim")
	case now.After(unixTime(*c.exp).Add(jwtClockSkew)):
		return invalid("expired_token", "expired at %s", unixTime(*c.exp).UTC().Format(time.RFC3339))
	case c.nbf != nil && now.Add(jwtClockSkew).Before(unixTime(*c.nbf)):
		return invalid("invalid_token", "not valid before %s", unixTime(*c.nbf).UTC().Format(time.RFC3339))
	case c.iat != nil && now.Add(jwtClockSkew).Before(unixTime(*c.iat)):
		return invalid("invalid_token", "issued in the future (%s)", unixTime(*c.iat).UTC().Format(time.RFC3339))
	case v.cfg.Issuer != "" && c.iss != v.cfg.Issuer:
		return invalid("invalid_token", "issuer %q is not the one expected", c.iss)
	case v.cfg.Audience != "" && !contains(c.aud, v.cfg.Audience):
		return invalid("invalid_token", "audience %q does not include the one expected", c.aud)
	}
	p, _ := raw[v.cfg.PrincipalClaim].(string)
	if p == "" {
		return invalid("invalid_token", "no %s claim to name the principal", v.cfg.PrincipalClaim)
	}
	return p, nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

func unixTime(f float64) time.Time { return time.Unix(0, int64(f*1e9)) }

func decodeSegment(seg string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return errors.New("not base64url")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errors.New("not JSON")
	}
	return nil
}

func claimsOf(raw map[string]any) jwtClaims {
	c := jwtClaims{raw: raw}
	num := func(k string) *float64 {
		if f, ok := raw[k].(float64); ok {
			return &f
		}
		return nil
	}
	c.exp, c.nbf, c.iat = num("exp"), num("nbf"), num("iat")
	c.iss, _ = raw["iss"].(string)
	switch a := raw["aud"].(type) {
	case string:
		c.aud = []string{a}
	case []any:
		for _, e := range a {
			if s, ok := e.(string); ok {
				c.aud = append(c.aud, s)
			}
		}
	}
	return c
}

// verifyJWS checks a JWS signature of one of the asymmetric algorithms.
func verifyJWS(alg string, key crypto.PublicKey, signed, sig []byte) error {
	var h crypto.Hash
	switch alg {
	case "RS256", "PS256", "ES256":
		h = crypto.SHA256
	case "RS384", "PS384", "ES384":
		h = crypto.SHA384
	case "RS512", "PS512", "ES512":
		h = crypto.SHA512
	default:
		return fmt.Errorf("algorithm %q is not accepted (RS, PS or ES 256/384/512)", alg)
	}
	d := h.New()
	d.Write(signed)
	digest := d.Sum(nil)
	switch k := key.(type) {
	case *rsa.PublicKey:
		var err error
		switch alg[0] {
		case 'R':
			err = rsa.VerifyPKCS1v15(k, h, digest, sig)
		case 'P':
			err = rsa.VerifyPSS(k, h, digest, sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
		default:
			return fmt.Errorf("algorithm %s does not fit the key's type (RSA)", alg)
		}
		if err != nil {
			return errors.New("bad signature")
		}
	case *ecdsa.PublicKey:
		size := (k.Curve.Params().BitSize + 7) / 8
		if alg[0] != 'E' || len(sig) != 2*size {
			return fmt.Errorf("algorithm %s does not fit the key's type (EC %s)", alg, k.Curve.Params().Name)
		}
		r, s := new(big.Int).SetBytes(sig[:size]), new(big.Int).SetBytes(sig[size:])
		if !ecdsa.Verify(k, digest, r, s) {
			return errors.New("bad signature")
		}
	default:
		return errors.New("unusable key")
	}
	return nil
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
