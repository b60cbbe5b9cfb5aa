package clientauth

import (
	"crypto/pbkdf2"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/clientauth/authtest"
)

// TestSCRAMServerExchange drives the server side by hand with the client
// side computed here (RFC 5802): a good proof gets the server signature
// that proves the server knows the key; tampering with the nonce, the
// proof or the channel binding fails; librdkafka 2.0.2's doubled nonce is
// accepted.
func TestSCRAMServerExchange(t *testing.T) {
	const mech = MechanismSCRAMSHA256
	cred, err := NewSCRAMCredential(mech, "pencil", 4096)
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(u string) (SCRAMCredential, bool) { return cred, u == "user" }
	fake := func(string) SCRAMCredential { return SCRAMCredential{Salt: []byte("fake-salt"), Iterations: 4096} }
	h := scramHash(mech)
	salted, _ := pbkdf2Key(h, "pencil", cred.Salt, cred.Iterations)
	clientKey := hmacSum(h, salted, []byte("Client Key"))
	serverKey := hmacSum(h, salted, []byte("Server Key"))
	run := func(cnonce string, final func(serverFirst, nonce string) string) ([]byte, error) {
		s := newSCRAMServer(mech, lookup, fake)
		sf, done, err := s.Next([]byte("n,,n=user,r=" + cnonce))
		if err != nil || done {
			t.Fatalf("client-first: %v %v", done, err)
		}
		nonce := strings.TrimPrefix(strings.Split(string(sf), ",")[0], "r=")
		if !strings.HasPrefix(nonce, cnonce) || len(nonce) <= len(cnonce) {
			t.Fatalf("server nonce %q does not extend %q", nonce, cnonce)
		}
		out, done, err := s.Next([]byte(final(string(sf), nonce)))
		if err == nil && !done {
			t.Fatal("not done after client-final")
		}
		return out, err
	}
	prove := func(bare, sf, withoutProof string) string {
		authMsg := bare + "," + sf + "," + withoutProof
		stored := sha256.Sum256(clientKey)
		sig := hmacSum(h, stored[:], []byte(authMsg))
		proof := make([]byte, len(sig))
		for i := range sig {
			proof[i] = clientKey[i] ^ sig[i]
		}
		return withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof)
	}
	good := func(sf, nonce string) string {
		return prove("n=user,r=abc", sf, "c=biws,r="+nonce)
	}
	out, err := run("abc", good)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "v=") {
		t.Fatalf("server-final %q", out)
	}
	// The server signature checks out against ServerKey.
	var sfSeen, nonceSeen string
	out, _ = run("abc", func(sf, nonce string) string { sfSeen, nonceSeen = sf, nonce; return good(sf, nonce) })
	want := hmacSum(h, serverKey, []byte("n=user,r=abc,"+sfSeen+",c=biws,r="+nonceSeen))
	if string(out) != "v="+base64.StdEncoding.EncodeToString(want) {
		t.Errorf("server signature %q, want v=%s", out, base64.StdEncoding.EncodeToString(want))
	}
	if _, err := run("abc", func(sf, nonce string) string { return prove("n=user,r=abc", sf, "c=biws,r=abc"+nonce) }); err != nil {
		t.Errorf("doubled client nonce (librdkafka 2.0.2): %v", err)
	}
	for name, final := range map[string]func(sf, nonce string) string{
		"other nonce": func(sf, nonce string) string { return prove("n=user,r=abc", sf, "c=biws,r=abcXYZ") },
		"bad proof": func(sf, nonce string) string {
			return "c=biws,r=" + nonce + ",p=" + base64.StdEncoding.EncodeToString(make([]byte, 32))
		},
		"channel bound": func(sf, nonce string) string { return prove("n=user,r=abc", sf, "c=cD10bHMtdW5pcXVlLCw=,r="+nonce) },
		"no proof":      func(sf, nonce string) string { return "c=biws,r=" + nonce },
	} {
		if _, err := run("abc", final); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// An unknown user is answered a salt all the same, and fails at the
	// proof.
	s := newSCRAMServer(mech, lookup, fake)
	sf, _, err := s.Next([]byte("n,,n=nobody,r=abc"))
	if err != nil || !strings.Contains(string(sf), ",s="+base64.StdEncoding.EncodeToString([]byte("fake-salt"))+",") {
		t.Errorf("unknown user's server-first %q, %v", sf, err)
	}
	for _, bad := range []string{"p=tls-unique,,n=user,r=abc", "n,,m=x,n=user,r=abc", "n,,n=us=er,r=abc", "n,a=other,n=user,r=abc", "x"} {
		if _, _, err := newSCRAMServer(mech, lookup, fake).Next([]byte(bad)); err == nil {
			t.Errorf("client-first %q accepted", bad)
		}
	}
}

func pbkdf2Key(h func() hash.Hash, pw string, salt []byte, iter int) ([]byte, error) {
	return pbkdf2.Key(h, pw, salt, iter, h().Size())
}

// TestLoginLimiterRefills: a bucket empties after burst attempts and
// allows one more per interval/burst; a token given back is taken again
// at once, and wakes a waiter; a key never used is never limited; the
// table stays bounded.
func TestLoginLimiterRefills(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewTokenBuckets(3, time.Minute, loginLimiterMax, func() time.Time { return now })
	for range 3 {
		if ok, _, _ := l.Take("a"); !ok {
			t.Fatal("limited before the burst")
		}
	}
	ok, retry, freed := l.Take("a")
	if ok || retry <= 0 || retry > 20*time.Second {
		t.Fatalf("after the burst: taken %v, retry %v (want ≤ 20s)", ok, retry)
	}
	if ok, _, _ := l.Take("b"); !ok {
		t.Error("another key limited")
	}
	l.Refund("a")
	select {
	case <-freed:
	default:
		t.Error("a refund did not wake the waiter")
	}
	if ok, _, _ := l.Take("a"); !ok {
		t.Error("the token given back could not be taken")
	}
	now = now.Add(20 * time.Second)
	if ok, _, _ := l.Take("a"); !ok {
		t.Error("still limited after one refill interval")
	}
	for i := range loginLimiterMax + 10 {
		l.Take(fmt.Sprint("x", i))
	}
	if n := len(l.buckets); n > loginLimiterMax {
		t.Errorf("%d buckets, want at most %d", n, loginLimiterMax)
	}
}

// TestOAuthJWKSURL: keys fetched from a URL; a token naming a key the set
// lacks makes Ferry fetch the set again (a rotation), at most every
// jwksMinRefetch.
func TestOAuthJWKSURL(t *testing.T) {
	k1, k2 := authtest.NewKey(t, "k1"), authtest.NewKey(t, "k2")
	var body atomic.Value
	body.Store(authtest.JWKS(k1))
	var fetches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		io.WriteString(w, body.Load().(string))
	}))
	defer srv.Close()
	v, err := newOAuthValidator(OAuthConfig{JWKSURL: srv.URL}, func(err error) { t.Log(err) })
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	v.now = func() time.Time { return now }
	if p, f := v.validate(k1.Token("svc")); f != nil || p != "svc" {
		t.Fatalf("k1: %q %v", p, f)
	}
	body.Store(authtest.JWKS(k1, k2))
	if _, f := v.validate(k2.Token("svc")); f == nil || f.Reason != "invalid_token" {
		t.Fatalf("k2 before the set could be fetched again: %+v, want refused as invalid_token (a key the set does not hold)", f)
	}
	now = now.Add(jwksMinRefetch)
	if p, f := v.validate(k2.Token("svc")); f != nil || p != "svc" {
		t.Fatalf("k2 after the rotation: %q %v", p, f)
	}
	if n := fetches.Load(); n != 2 {
		t.Errorf("%d fetches, want 2", n)
	}
	good := strings.SplitN(k1.Token("svc"), ".", 2)
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"k1"}`)) + "." + strings.Split(good[1], ".")[0] + "."
	if _, f := v.validate(none); f == nil {
		t.Error("alg none accepted")
	}
}
