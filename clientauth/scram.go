package clientauth

// SCRAM-SHA-256 and SCRAM-SHA-512, server side (RFC 5802, RFC 7677), as
// Kafka brokers speak them (KIP-84): no channel binding, no authorization
// identity other than the user's own, and no extensions (Kafka's one,
// tokenauth, is for delegation tokens, which Ferry does not issue).
//
// The exchange, one SaslAuthenticate round each way:
//
//	client-first  n,,n=<user>,r=<client nonce>
//	server-first  r=<client nonce><server nonce>,s=<salt, base64>,i=<iterations>
//	client-final  c=biws,r=<both nonces>,p=<ClientProof, base64>
//	server-final  v=<ServerSignature, base64>
//
// The server keeps per user only StoredKey = H(ClientKey) and ServerKey
// (credentials.go), never the password: ClientKey is recovered from the
// proof as ClientProof XOR HMAC(StoredKey, AuthMessage) and checked against
// StoredKey. An unknown user is answered a server-first message like any
// other, its salt derived from the name and a secret of the process, its
// iteration count one of the store's users' drawn by the name (so a made-up
// name is not told by the default count), and fails at the proof: the
// exchange does not reveal which users exist.

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
)

// SCRAM mechanism names.
const (
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismSCRAMSHA512 = "SCRAM-SHA-512"
	MechanismPlain       = "PLAIN"
	MechanismOAuthBearer = "OAUTHBEARER"
)

// MinSCRAMIterations is Kafka's minimum (and the RFC's advice): fewer make
// a stolen store cheap to attack.
const MinSCRAMIterations = 4096

// DefaultSCRAMIterations is what `ferry users add` uses by default.
const DefaultSCRAMIterations = 8192

// scramHash is the hash function of a SCRAM mechanism, nil for a name that
// is not one.
func scramHash(mechanism string) func() hash.Hash {
	switch mechanism {
	case MechanismSCRAMSHA256:
		return sha256.New
	case MechanismSCRAMSHA512:
		return sha512.New
	}
	return nil
}

// SCRAMCredential is one user's credential for one SCRAM mechanism: what a
// Kafka broker keeps (kafka-configs --alter --add-config
// 'SCRAM-SHA-512=[...]' stores the same four values).
type SCRAMCredential struct {
	Salt       []byte
	Iterations int
	StoredKey  []byte
	ServerKey  []byte
}

// NewSCRAMCredential derives the credential of password for mechanism
// (SCRAM-SHA-256 or SCRAM-SHA-512) with a random salt.
func NewSCRAMCredential(mechanism, password string, iterations int) (SCRAMCredential, error) {
	h := scramHash(mechanism)
	if h == nil {
		return SCRAMCredential{}, fmt.Errorf("%q is not a SCRAM mechanism (want %s or %s)", mechanism, MechanismSCRAMSHA256, MechanismSCRAMSHA512)
	}
	if iterations < MinSCRAMIterations {
		return SCRAMCredential{}, fmt.Errorf("%d iterations: at least %d are required", iterations, MinSCRAMIterations)
	}
	salt := make([]byte, 32)
	rand.Read(salt)
	stored, server, err := scramKeys(h, password, salt, iterations)
	if err != nil {
		return SCRAMCredential{}, err
	}
	return SCRAMCredential{Salt: salt, Iterations: iterations, StoredKey: stored, ServerKey: server}, nil
}

// scramKeys derives StoredKey and ServerKey from a password.
func scramKeys(h func() hash.Hash, password string, salt []byte, iterations int) (stored, server []byte, err error) {
	salted, err := pbkdf2.Key(h, password, salt, iterations, h().Size())
	if err != nil {
		return nil, nil, err
	}
	clientKey := hmacSum(h, salted, []byte("Client Key"))
	s := h()
	s.Write(clientKey)
	return s.Sum(nil), hmacSum(h, salted, []byte("Server Key")), nil
}

// verifyPassword reports whether password is the one cred was made from.
func (cred SCRAMCredential) verifyPassword(mechanism, password string) bool {
	h := scramHash(mechanism)
	if h == nil {
		return false
	}
	stored, _, err := scramKeys(h, password, cred.Salt, cred.Iterations)
	return err == nil && subtle.ConstantTimeCompare(stored, cred.StoredKey) == 1
}

func hmacSum(h func() hash.Hash, key, msg []byte) []byte {
	m := hmac.New(h, key)
	m.Write(msg)
	return m.Sum(nil)
}

// errSCRAMMalformed is wrapped by every error of a SCRAM exchange the client got
// wrong (as opposed to wrong credentials).
var errSCRAMMalformed = errors.New("malformed SCRAM message")

// SCRAMServer is one connection's SCRAM exchange, server side.
type SCRAMServer struct {
	mechanism string
	h         func() hash.Hash
	lookup    func(user string) (SCRAMCredential, bool)
	fake      func(user string) SCRAMCredential // an unknown user's salt and iterations

	step        int
	user        string
	known       bool
	cred        SCRAMCredential
	clientBare  string
	serverFirst string
	nonce       string
}

func newSCRAMServer(mechanism string, lookup func(string) (SCRAMCredential, bool), fake func(string) SCRAMCredential) *SCRAMServer {
	return &SCRAMServer{mechanism: mechanism, h: scramHash(mechanism), lookup: lookup, fake: fake}
}

// Next answers one client message. done is set with the last answer; a
// *Failure says why the client is refused.
func (s *SCRAMServer) Next(msg []byte) (out []byte, done bool, err error) {
	switch s.step {
	case 0:
		s.step++
		return s.clientFirst(string(msg))
	case 1:
		s.step++
		return s.clientFinal(string(msg))
	}
	return nil, false, &Failure{Reason: "malformed", Msg: "unexpected SCRAM message after the exchange completed"}
}

func (s *SCRAMServer) clientFirst(msg string) ([]byte, bool, error) {
	malformed := func(why string) ([]byte, bool, error) {
		return nil, false, &Failure{Reason: "malformed", Msg: "invalid SCRAM client-first message: " + why, Err: errSCRAMMalformed}
	}
	// gs2-header: cbind-flag "," [authzid] ","
	flag, rest, ok := strings.Cut(msg, ",")
	if !ok {
		return malformed("no GS2 header")
	}
	switch {
	case flag == "n", flag == "y":
	case strings.HasPrefix(flag, "p="):
		return malformed("channel binding is not supported")
	default:
		return malformed("bad channel binding flag")
	}
	authzid, bare, ok := strings.Cut(rest, ",")
	if !ok {
		return malformed("no GS2 header")
	}
	attrs := strings.Split(bare, ",")
	if strings.HasPrefix(attrs[0], "m=") {
		return malformed("mandatory extensions are not supported")
	}
	if len(attrs) < 2 || !strings.HasPrefix(attrs[0], "n=") || !strings.HasPrefix(attrs[1], "r=") {
		return malformed("want n=<user>,r=<nonce>")
	}
	for _, ext := range attrs[2:] {
		if k, _, _ := strings.Cut(ext, "="); k == "tokenauth" {
			return nil, false, &Failure{Reason: "unsupported", Msg: "delegation tokens are not supported by Ferry"}
		}
	}
	user, err := scramUnescape(attrs[0][2:])
	if err != nil || user == "" {
		return malformed("bad user name")
	}
	if authzid != "" {
		a, err := scramUnescape(strings.TrimPrefix(authzid, "a="))
		if !strings.HasPrefix(authzid, "a=") || err != nil || a != user {
			return nil, false, &Failure{Reason: "authzid", User: user, Msg: "an authorization identity other than the user's own is not supported"}
		}
	}
	cnonce := attrs[1][2:]
	if cnonce == "" || strings.ContainsAny(cnonce, ",") {
		return malformed("bad nonce")
	}
	s.user, s.clientBare = user, bare
	s.cred, s.known = s.lookup(user)
	if !s.known {
		s.cred = s.fake(user)
	}
	snonce := make([]byte, 24)
	rand.Read(snonce)
	s.nonce = cnonce + base64.RawURLEncoding.EncodeToString(snonce)
	s.serverFirst = "r=" + s.nonce + ",s=" + base64.StdEncoding.EncodeToString(s.cred.Salt) + ",i=" + strconv.Itoa(s.cred.Iterations)
	return []byte(s.serverFirst), false, nil
}

func (s *SCRAMServer) clientFinal(msg string) ([]byte, bool, error) {
	malformed := func(why string) ([]byte, bool, error) {
		return nil, false, &Failure{Reason: "malformed", User: s.user, Msg: "invalid SCRAM client-final message: " + why, Err: errSCRAMMalformed}
	}
	i := strings.LastIndex(msg, ",p=")
	if i < 0 {
		return malformed("no proof")
	}
	withoutProof, proofB64 := msg[:i], msg[i+3:]
	attrs := strings.Split(withoutProof, ",")
	if len(attrs) < 2 || !strings.HasPrefix(attrs[0], "c=") || !strings.HasPrefix(attrs[1], "r=") {
		return malformed("want c=<binding>,r=<nonce>,p=<proof>")
	}
	cbind, err := base64.StdEncoding.DecodeString(attrs[0][2:])
	if err != nil || !(string(cbind) == "n,," || string(cbind) == "y,," || strings.HasPrefix(string(cbind), "n,a=") || strings.HasPrefix(string(cbind), "y,a=")) {
		return malformed("bad channel binding")
	}
	// The nonce must end with the combined one, where Kafka (4.4's
	// ScramSaslServer) wants it equal: librdkafka 2.0.2 (Debian 12's)
	// sends its own nonce again in front of it, and its SCRAM could not
	// authenticate otherwise. The server's random part must be there
	// either way, so the exchange stays fresh, and the proof signs the
	// message as sent.
	if !strings.HasSuffix(attrs[1][2:], s.nonce) {
		return malformed("the nonce is not the server's")
	}
	proof, err := base64.StdEncoding.DecodeString(proofB64)
	if err != nil || len(proof) != s.h().Size() {
		return malformed("bad proof")
	}
	// An unknown user's proof is checked all the same (against no key),
	// so the answer takes as long as a wrong password's.
	stored := s.cred.StoredKey
	if !s.known {
		stored = make([]byte, s.h().Size())
	}
	authMsg := []byte(s.clientBare + "," + s.serverFirst + "," + withoutProof)
	sig := hmacSum(s.h, stored, authMsg)
	clientKey := make([]byte, len(proof))
	for i := range proof {
		clientKey[i] = proof[i] ^ sig[i]
	}
	hs := s.h()
	hs.Write(clientKey)
	match := subtle.ConstantTimeCompare(hs.Sum(nil), stored) == 1
	switch {
	case !s.known:
		return nil, false, &Failure{Reason: "unknown_user", User: s.user, Msg: "invalid credentials"}
	case !match:
		return nil, false, &Failure{Reason: "bad_password", User: s.user, Msg: "invalid credentials"}
	}
	return []byte("v=" + base64.StdEncoding.EncodeToString(hmacSum(s.h, s.cred.ServerKey, authMsg))), true, nil
}

// scramUnescape decodes a SCRAM saslname: "=2C" is ",", "=3D" is "=", and
// any other "=" is an error.
func scramUnescape(s string) (string, error) {
	if !strings.Contains(s, "=") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '=' {
			b.WriteByte(s[i])
			continue
		}
		switch {
		case strings.HasPrefix(s[i:], "=2C"):
			b.WriteByte(',')
		case strings.HasPrefix(s[i:], "=3D"):
			b.WriteByte('=')
		default:
			return "", errors.New("bad escape in name")
		}
		i += 2
	}
	return b.String(), nil
}

// User is the user the client named in its first message, "" before it.
func (s *SCRAMServer) User() string { return s.user }
