// Package authtest makes OAUTHBEARER signing keys, their JWKS and tokens
// for tests of Ferry's client authentication.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Key is an ES256 signing key and its key ID.
type Key struct {
	ID  string
	Key *ecdsa.PrivateKey
}

// NewKey makes a P-256 key named kid.
func NewKey(t testing.TB, kid string) Key {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return Key{kid, k}
}

// JWK is k's public key as a JWKS entry.
func (k Key) JWK() string {
	return fmt.Sprintf(`{"kty":"EC","crv":"P-256","kid":%q,"x":%q,"y":%q}`, k.ID,
		base64.RawURLEncoding.EncodeToString(k.Key.X.FillBytes(make([]byte, 32))), base64.RawURLEncoding.EncodeToString(k.Key.Y.FillBytes(make([]byte, 32))))
}

// JWKS is a key set holding keys.
func JWKS(keys ...Key) string {
	entries := make([]string, len(keys))
	for i, k := range keys {
		entries[i] = k.JWK()
	}
	return `{"keys":[` + strings.Join(entries, ",") + `]}`
}

// Token is a JWT for sub signed by k, valid for two hours.
func (k Key) Token(sub string) string {
	h, _ := json.Marshal(map[string]string{"alg": "ES256", "kid": k.ID})
	c, _ := json.Marshal(map[string]any{"sub": sub, "exp": time.Now().Add(2 * time.Hour).Unix()})
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
	d := sha256.Sum256([]byte(in))
	r, s, _ := ecdsa.Sign(rand.Reader, k.Key, d[:])
	return in + "." + base64.RawURLEncoding.EncodeToString(append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...))
}
