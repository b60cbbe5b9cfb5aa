package clientauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// signed is a compact JWS of header and claims: ES256 by an EC key,
// RS256 by an RSA key, HS256 by a byte secret.
func signed(t *testing.T, header, claims map[string]any, key any) string {
	t.Helper()
	h, _ := json.Marshal(header)
	c, _ := json.Marshal(claims)
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
	d := sha256.Sum256([]byte(in))
	var sig []byte
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		r, s, err := ecdsa.Sign(rand.Reader, k, d[:])
		if err != nil {
			t.Fatal(err)
		}
		sig = append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
	case *rsa.PrivateKey:
		var err error
		if sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, d[:]); err != nil {
			t.Fatal(err)
		}
	case []byte:
		m := hmac.New(sha256.New, k)
		m.Write([]byte(in))
		sig = m.Sum(nil)
	case nil:
	}
	return in + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// TestOAuthRefusals: every token Ferry must refuse is refused, with the
// reason its metric counts: alg none; HS256 keyed with the JWKS's public
// key (key confusion); an algorithm of another key type; a signature of
// another key; expired, not yet valid, issued in the future, without
// exp; another issuer; an audience without Ferry's; no principal claim;
// a key ID the set lacks. Within the allowed clock skew a token is
// accepted. And the JWKS itself: an RSA key under 2048 bits and an EC
// point off its curve are refused, a symmetric key is never used.
func TestOAuthRefusals(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	ecJWK := fmt.Sprintf(`{"kty":"EC","crv":"P-256","kid":"ec","x":%q,"y":%q}`, b64(ec.X.FillBytes(make([]byte, 32))), b64(ec.Y.FillBytes(make([]byte, 32))))
	rsaJWK := fmt.Sprintf(`{"kty":"RSA","kid":"rsa","n":%q,"e":"AQAB"}`, b64(rsaKey.N.Bytes()))
	secret := []byte(ecJWK) // what a confused verifier would key HMAC with
	octJWK := fmt.Sprintf(`{"kty":"oct","kid":"oct","k":%q}`, b64(secret))
	dir := t.TempDir()
	file := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(file, []byte(`{"keys":[`+ecJWK+`,`+rsaJWK+`,`+octJWK+`]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := newOAuthValidator(OAuthConfig{JWKSFile: file, Issuer: "https://idp.test", Audience: "ferry"}, func(err error) { t.Log(err) })
	if err != nil {
		t.Fatal(err)
	}
	if n := len(v.set.keys); n != 2 {
		t.Fatalf("%d keys read, want 2 (the symmetric one skipped)", n)
	}
	now := time.Now()
	v.now = func() time.Time { return now }
	claims := func(change map[string]any) map[string]any {
		c := map[string]any{"sub": "svc", "iss": "https://idp.test", "aud": []string{"other", "ferry"}, "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
		for k, val := range change {
			if val == nil {
				delete(c, k)
			} else {
				c[k] = val
			}
		}
		return c
	}
	es := map[string]any{"alg": "ES256", "kid": "ec"}
	for _, ok := range []struct {
		name string
		tok  string
	}{
		{"ES256", signed(t, es, claims(nil), ec)},
		{"RS256", signed(t, map[string]any{"alg": "RS256", "kid": "rsa"}, claims(nil), rsaKey)},
		{"expired within the skew", signed(t, es, claims(map[string]any{"exp": now.Add(-20 * time.Second).Unix()}), ec)},
		{"audience a string", signed(t, es, claims(map[string]any{"aud": "ferry"}), ec)},
	} {
		if p, f := v.validate(ok.tok); f != nil || p != "svc" {
			t.Errorf("%s: %q %+v, want accepted as svc", ok.name, p, f)
		}
	}
	for _, bad := range []struct {
		name, reason string
		tok          string
	}{
		{"alg none", "invalid_signature", signed(t, map[string]any{"alg": "none", "kid": "ec"}, claims(nil), nil)},
		{"HS256 keyed with the public key", "invalid_signature", signed(t, map[string]any{"alg": "HS256", "kid": "ec"}, claims(nil), secret)},
		{"HS256 naming the symmetric key", "invalid_signature", signed(t, map[string]any{"alg": "HS256", "kid": "oct"}, claims(nil), secret)},
		{"RS256 naming the EC key", "invalid_signature", signed(t, map[string]any{"alg": "RS256", "kid": "ec"}, claims(nil), rsaKey)},
		{"another key's signature", "invalid_signature", signed(t, es, claims(nil), other)},
		{"expired", "expired_token", signed(t, es, claims(map[string]any{"exp": now.Add(-time.Minute).Unix()}), ec)},
		{"not yet valid", "invalid_token", signed(t, es, claims(map[string]any{"nbf": now.Add(time.Minute).Unix()}), ec)},
		{"issued in the future", "invalid_token", signed(t, es, claims(map[string]any{"iat": now.Add(time.Minute).Unix()}), ec)},
		{"no exp", "invalid_token", signed(t, es, claims(map[string]any{"exp": nil}), ec)},
		{"another issuer", "invalid_token", signed(t, es, claims(map[string]any{"iss": "https://evil.test"}), ec)},
		{"no issuer", "invalid_token", signed(t, es, claims(map[string]any{"iss": nil}), ec)},
		{"another audience", "invalid_token", signed(t, es, claims(map[string]any{"aud": []string{"other"}}), ec)},
		{"no principal", "invalid_token", signed(t, es, claims(map[string]any{"sub": nil}), ec)},
		{"a key the set lacks", "invalid_token", signed(t, map[string]any{"alg": "ES256", "kid": "gone"}, claims(nil), ec)},
		{"not a JWT", "invalid_token", "abc"},
		{"claims not JSON", "invalid_token", strings.Join([]string{b64([]byte(`{"alg":"ES256","kid":"ec"}`)), b64([]byte("{")), "x"}, ".")},
	} {
		p, f := v.validate(bad.tok)
		if f == nil || f.Reason != bad.reason {
			t.Errorf("%s: %q %+v, want refused %s", bad.name, p, f, bad.reason)
		}
	}

	for _, set := range []struct{ name, jwks, want string }{
		{"RSA under 2048 bits", fmt.Sprintf(`{"keys":[{"kty":"RSA","kid":"small","n":%q,"e":"AQAB"}]}`, b64(small.N.Bytes())), "at least 2048"},
		{"EC point off its curve", fmt.Sprintf(`{"keys":[{"kty":"EC","crv":"P-256","kid":"off","x":%q,"y":%q}]}`, b64(ec.X.FillBytes(make([]byte, 32))), b64(other.Y.FillBytes(make([]byte, 32)))), "kid \"off\""},
		{"only a symmetric key", `{"keys":[` + octJWK + `]}`, "no RSA or EC signing key"},
	} {
		if _, err := parseJWKS([]byte(set.jwks)); err == nil || !strings.Contains(err.Error(), set.want) {
			t.Errorf("%s: %v, want an error mentioning %q", set.name, err, set.want)
		}
	}
}
