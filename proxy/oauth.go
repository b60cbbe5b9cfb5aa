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
// key rotation is picked up without a restart.

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
type oauthValidator struct {
	cfg  OAuthConfig
	http *http.Client
	now  func() time.Time

	mu      sync.Mutex
	set     *jwks
	mtime   time.Time
	probed  time.Time
	fetched time.Time
	onErr   func(error)
}

func newOAuthValidator(ctx context.Context, cfg OAuthConfig, onErr func(error)) (*oauthValidator, error) {
	if cfg.PrincipalClaim == "" {
		cfg.PrincipalClaim = "sub"
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
		if !strings.HasPrefix(cfg.JWKSURL, "https://") && !strings.HasPrefix(cfg.JWKSURL, "http://") {
			return nil, fmt.Errorf("oauth.jwks_url %q: want an http(s) URL", cfg.JWKSURL)
		}
		if err := v.fetch(ctx); err != nil {
			return nil, fmt.Errorf("oauth.jwks_url %s: %w", cfg.JWKSURL, err)
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

// fetch reads the key set from the URL; v.mu is held or v not shared yet.
func (v *oauthValidator) fetch(ctx context.Context) error {
	v.fetched = v.now()
	ctx, cancel := context.WithTimeout(ctx, jwksTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		return err
	}
	resp, err := v.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	set, err := parseJWKS(b)
	if err != nil {
		return err
	}
	v.set = set
	return nil
}

// key returns the key for kid, refreshing the set when it is due or lacks
// the key.
func (v *oauthValidator) key(kid string) (crypto.PublicKey, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	if v.cfg.JWKSFile != "" {
		if now.Sub(v.probed) >= time.Second {
			v.probed = now
			if fi, err := os.Stat(v.cfg.JWKSFile); err == nil && !fi.ModTime().Equal(v.mtime) {
				if err := v.loadFile(fi); err != nil {
					v.mtime = fi.ModTime()
					v.onErr(fmt.Errorf("oauth.jwks_file changed but cannot be used, keeping the keys last read: %w", err))
				}
			}
		}
	} else {
		_, have := v.set.keys[kid]
		if since := now.Sub(v.fetched); since >= jwksRefresh || (!have && since >= jwksMinRefetch) {
			if err := v.fetch(context.Background()); err != nil {
				v.onErr(fmt.Errorf("oauth.jwks_url %s: %w; keeping the keys last fetched", v.cfg.JWKSURL, err))
			}
		}
	}
	k, ok := v.set.keys[kid]
	if !ok && kid == "" && len(v.set.keys) == 1 {
		for _, only := range v.set.keys {
			return only, true
		}
	}
	return k, ok
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
	key, ok := v.key(hdr.Kid)
	if !ok {
		return invalid("invalid_token", "signed with key %q, which the JWKS does not hold", hdr.Kid)
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
