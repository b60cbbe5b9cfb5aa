package proxy

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
)

// saslRound sends one SaslAuthenticate (v2) and reads its answer, without
// failing the test: it runs on many goroutines.
func saslRound(c *rawClient, corr int32, msg []byte) (*kmsg.SASLAuthenticateResponse, error) {
	return rawRoundTrip(c, corr, &kmsg.SASLAuthenticateRequest{Version: 2, SASLAuthBytes: msg}, &kmsg.SASLAuthenticateResponse{}) // the caller checks the code
}

func rawRoundTrip[R kmsg.Response](c *rawClient, corr int32, req kmsg.Request, resp R) (R, error) {
	b := protocol.AppendRequestHeader(nil, req, corr, "raw")
	b = req.AppendTo(b)
	frame := append(binaryLen(len(b)), b...)
	if _, err := c.nc.Write(frame); err != nil {
		return resp, err
	}
	in, err := c.read()
	if err != nil {
		return resp, err
	}
	resp.SetVersion(req.GetVersion())
	return resp, resp.ReadFrom(in[protocol.ResponseHeaderSize(req.Key(), req.GetVersion()):])
}

func binaryLen(n int) []byte { return []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} }

// scramLogin runs one SCRAM-SHA-512 exchange from ip on one connection,
// as a client does: nil, or the answer's error with its message.
func scramLogin(ctx context.Context, addr, ip, user, pass string) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	c := &rawClient{nc: nc}
	hs, err := rawRoundTrip(c, 1, &kmsg.SASLHandshakeRequest{Version: 1, Mechanism: clientauth.MechanismSCRAMSHA512}, &kmsg.SASLHandshakeResponse{})
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(hs.ErrorCode); err != nil {
		return err
	}
	sess, msg, err := scram.Auth{User: user, Pass: pass}.AsSha512Mechanism().Authenticate(ctx, "127.0.0.1")
	if err != nil {
		return err
	}
	for corr := int32(2); ; corr++ {
		resp, err := saslRound(c, corr, msg)
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			if resp.ErrorMessage != nil {
				return fmt.Errorf("%w: %s", err, *resp.ErrorMessage)
			}
			return err
		}
		var done bool
		if done, msg, err = sess.Challenge(resp.SASLAuthBytes); err != nil || done {
			return err
		}
	}
}

// TestSCRAMParallelProofsLimited: 200 connections from one address each
// send SCRAM client-first for alice, then all send wrong proofs. The
// limit is taken when each exchange starts, so at most the burst of
// proofs is checked (answered "invalid credentials", counted
// bad_password); every other exchange is refused rate_limited. Counting
// failures only when a proof fails let all 200 proofs be checked.
func TestSCRAMParallelProofsLimited(t *testing.T) {
	const conns, burst = 200, 5
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	cfg := e.sasl(clientauth.MechanismSCRAMSHA512)
	cfg.FailedBurst, cfg.FailedInterval = burst, time.Hour
	// All 200 are unauthenticated at once, from one address: above the
	// default bound on those (preauth.go), which is not what this tests.
	cfg.PreAuth.MaxPerIP = conns
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(cfg))

	type exchange struct {
		c     *rawClient
		nonce string
		err   error
		resp  *kmsg.SASLAuthenticateResponse
	}
	xs := make([]*exchange, conns)
	var wg sync.WaitGroup
	for i := range xs {
		x := &exchange{}
		xs[i] = x
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		nc.SetDeadline(time.Now().Add(60 * time.Second))
		x.c = &rawClient{nc: nc}
		wg.Add(1)
		go func() {
			defer wg.Done()
			hs, err := rawRoundTrip(x.c, 1, &kmsg.SASLHandshakeRequest{Version: 1, Mechanism: clientauth.MechanismSCRAMSHA512}, &kmsg.SASLHandshakeResponse{})
			if err != nil || hs.ErrorCode != 0 {
				x.err = fmt.Errorf("handshake: %v %v", hs.ErrorCode, err)
				return
			}
			cnonce := fmt.Sprintf("nonce%d", i)
			x.resp, x.err = saslRound(x.c, 2, []byte("n,,n=alice,r="+cnonce))
			if x.err == nil && x.resp.ErrorCode == 0 {
				x.nonce = strings.TrimPrefix(strings.Split(string(x.resp.SASLAuthBytes), ",")[0], "r=")
			}
		}()
	}
	wg.Wait()
	// Every client-first answered; now every proof, all at once.
	wrong := base64.StdEncoding.EncodeToString(make([]byte, 64))
	for _, x := range xs {
		if x.err != nil || x.nonce == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.resp, x.err = saslRound(x.c, 3, []byte("c=biws,r="+x.nonce+",p="+wrong))
		}()
	}
	wg.Wait()
	checked, limited := 0, 0
	for i, x := range xs {
		switch {
		case x.err != nil:
			t.Fatalf("connection %d: %v", i, x.err)
		case x.resp.ErrorCode != kerr.SaslAuthenticationFailed.Code || x.resp.ErrorMessage == nil:
			t.Fatalf("connection %d: code %d, want SASL_AUTHENTICATION_FAILED", i, x.resp.ErrorCode)
		case strings.Contains(*x.resp.ErrorMessage, "invalid credentials"):
			checked++
		case strings.Contains(*x.resp.ErrorMessage, "too many failed authentications"):
			limited++
		default:
			t.Fatalf("connection %d: %q", i, *x.resp.ErrorMessage)
		}
	}
	t.Logf("%d proofs checked, %d exchanges refused as rate-limited", checked, limited)
	if checked > burst || checked+limited != conns {
		t.Errorf("%d wrong proofs checked (answered invalid credentials), %d rate-limited; want at most %d checked, the rest rate-limited", checked, limited, burst)
	}
	if got := authFailures(s, clientauth.MechanismSCRAMSHA512, "bad_password"); got != float64(checked) || got > burst {
		t.Errorf("ferry_client_auth_failures_total{reason=bad_password} = %v, want %d (at most %d)", got, checked, burst)
	}
	if got := authFailures(s, clientauth.MechanismSCRAMSHA512, "rate_limited"); got != float64(limited) {
		t.Errorf("ferry_client_auth_failures_total{reason=rate_limited} = %v, want %d", got, limited)
	}
}

// TestLoginLimitNoLockout: an address guessing mallory's password
// locks mallory out from that address only. alice, behind the same
// address, still logs in and produces, and mallory from another address
// too. Logins that succeed give their tokens back, so alice's many logins
// spend none of the address's budget, while one address trying many user
// names is stopped by it.
func TestLoginLimitNoLockout(t *testing.T) {
	e := newSecEnv(t)
	e.addUser(t, "mallory", "mallory-secret")
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	cfg := e.sasl(clientauth.MechanismSCRAMSHA512)
	cfg.FailedBurst, cfg.FailedAddressBurst, cfg.FailedInterval = 3, 8, time.Hour
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	login := func(ip, user, pass string) error { return scramLogin(ctx, addr, ip, user, pass) }
	for range 3 {
		if err := login("127.0.0.1", "mallory", "guess"); !errors.Is(err, kerr.SaslAuthenticationFailed) {
			t.Fatalf("mallory's wrong password: %v", err)
		}
	}
	if err := login("127.0.0.1", "mallory", "mallory-secret"); !errors.Is(err, kerr.SaslAuthenticationFailed) || !strings.Contains(err.Error(), "too many failed authentications") {
		t.Errorf("mallory's right password from the guessing address: %v; want refused as rate-limited", err)
	}
	for i := range 12 { // more than the address's burst: successes spend none of it
		cl := newClient(t, addr, kgo.Dialer((&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).DialContext), scram512("alice", "alice-secret"), kgo.DefaultProduceTopic("t"))
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("alice")}).FirstErr(); err != nil {
			t.Fatalf("alice's login %d from the guessing address: %v", i, err)
		}
		cl.Close()
	}
	if err := login("127.0.0.2", "mallory", "mallory-secret"); err != nil {
		t.Errorf("mallory from another address: %v", err)
	}
	// The address's budget: 3 of 8 spent on mallory; 5 more user names,
	// then the address is refused whatever the name.
	for i := range 5 {
		if err := login("127.0.0.1", fmt.Sprint("user", i), "guess"); !errors.Is(err, kerr.SaslAuthenticationFailed) || strings.Contains(err.Error(), "too many") {
			t.Fatalf("guess %d for a new user name: %v, want invalid credentials", i, err)
		}
	}
	if err := login("127.0.0.1", "user-next", "guess"); !errors.Is(err, kerr.SaslAuthenticationFailed) || !strings.Contains(err.Error(), "too many failed authentications from 127.0.0.1") {
		t.Errorf("a new user name past the address's budget: %v; want refused as rate-limited", err)
	}
	testwait.Until(t, 10*time.Second, "two connections closed auth_rate_limited", func() bool { return closes(s, "auth_rate_limited") >= 2 })
}

// TestSCRAMUnknownUserAnswerShape: a made-up user is answered the way a
// real one is. The store's users have 16384 iterations (three) and 4096
// (one), none the default 8192: an unknown name's server-first names one
// of the store's counts, the same salt and count every time it is asked,
// and over many names each count about as often as users have it. A wrong
// password and an unknown user leave the same close error on the
// connection's record, without the claimed name, and the same reason in
// the log; the metric tells them apart.
func TestSCRAMUnknownUserAnswerShape(t *testing.T) {
	e := newSecEnv(t) // alice at 4096 iterations
	c, err := clientauth.LoadCredentials(e.store)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"bob", "carol", "dave"} {
		cred, err := clientauth.NewSCRAMCredential(clientauth.MechanismSCRAMSHA512, u+"-secret", 16384)
		if err != nil {
			t.Fatal(err)
		}
		c.Set(u, clientauth.MechanismSCRAMSHA512, cred)
	}
	if err := c.Save(e.store); err != nil {
		t.Fatal(err)
	}
	kf := newKfake(t, 1)
	core, logs := observer.New(zap.InfoLevel)
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA512)), WithLogger(zap.New(core)))
	serverFirst := func(user string) (salt, iterations string) {
		t.Helper()
		rc := rawConn(t, addr, nil)
		var hs kmsg.SASLHandshakeResponse
		rc.roundTrip(t, &kmsg.SASLHandshakeRequest{Version: 1, Mechanism: clientauth.MechanismSCRAMSHA512}, &hs)
		var ar kmsg.SASLAuthenticateResponse
		rc.roundTrip(t, &kmsg.SASLAuthenticateRequest{Version: 2, SASLAuthBytes: []byte("n,,n=" + user + ",r=abc")}, &ar)
		if ar.ErrorCode != 0 {
			t.Fatalf("%s: client-first answered %d", user, ar.ErrorCode)
		}
		for _, kv := range strings.Split(string(ar.SASLAuthBytes), ",") {
			switch {
			case strings.HasPrefix(kv, "s="):
				salt = kv[2:]
			case strings.HasPrefix(kv, "i="):
				iterations = kv[2:]
			}
		}
		return salt, iterations
	}
	if _, it := serverFirst("bob"); it != "16384" {
		t.Fatalf("bob's iterations %s, want his own 16384", it)
	}
	for _, name := range []string{"zed", "nobody", "mallory"} {
		salt, it := serverFirst(name)
		if it != "16384" && it != "4096" {
			t.Errorf("unknown user %s answered %s iterations, which no user of the store has (16384, 4096)", name, it)
		}
		if salt2, it2 := serverFirst(name); salt2 != salt || it2 != it {
			t.Errorf("unknown user %s answered differently when asked again: %s/%s then %s/%s", name, salt, it, salt2, it2)
		}
	}
	// Over many names, the counts come up as often as users have them.
	counts := map[int]int{}
	for i := range 2000 {
		first, _, err := s.auth.SCRAM(clientauth.MechanismSCRAMSHA512).Next([]byte(fmt.Sprint("n,,n=name", i, ",r=abc")))
		if err != nil {
			t.Fatal(err)
		}
		_, it, _ := strings.Cut(string(first), ",i=")
		n, _ := strconv.Atoi(it)
		counts[n]++
	}
	if len(counts) != 2 || counts[16384] < 1300 || counts[4096] < 300 {
		t.Errorf("iterations of 2000 unknown names %v, want about 1500 at 16384 and 500 at 4096", counts)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, login := range [][2]string{{"alice", "wrong"}, {"zed-unknown", "wrong"}} {
		if err := scramLogin(ctx, addr, "127.0.0.1", login[0], login[1]); !errors.Is(err, kerr.SaslAuthenticationFailed) {
			t.Fatalf("%s: %v, want SASL_AUTHENTICATION_FAILED", login[0], err)
		}
	}
	var failed []connstats.Info
	testwait.Until(t, 10*time.Second, "both failed logins recorded", func() bool {
		cz, _ := s.Connz(connstats.Query{State: "closed"})
		failed = failed[:0]
		for _, ci := range cz.Connections {
			if ci.CloseReason == "auth_failed" {
				failed = append(failed, ci)
			}
		}
		return len(failed) == 2
	})
	if failed[0].CloseError != failed[1].CloseError {
		t.Errorf("close errors differ: %q and %q", failed[0].CloseError, failed[1].CloseError)
	}
	for _, ci := range failed {
		for _, leak := range []string{"unknown_user", "bad_password", "alice", "zed-unknown"} {
			if strings.Contains(ci.CloseError, leak) {
				t.Errorf("close error %q shows %q", ci.CloseError, leak)
			}
		}
	}
	// The log names the user claimed (an operator looks for a client's
	// mistakes there) but not whether it exists: with the name, that
	// would list the users for whoever reads the logs.
	logged := logs.FilterMessageSnippet("client authentication failed").All()
	if len(logged) == 0 {
		t.Fatal("no failed login logged")
	}
	for _, l := range logged {
		if r := l.ContextMap()["auth_reason"]; r != "invalid_credentials" {
			t.Errorf("failed login logged with auth_reason %v, want invalid_credentials: %v", r, l.ContextMap())
		}
	}
	if authFailures(s, clientauth.MechanismSCRAMSHA512, "unknown_user") != 1 || authFailures(s, clientauth.MechanismSCRAMSHA512, "bad_password") != 1 {
		t.Errorf("metric: unknown_user %v, bad_password %v; want 1 each", authFailures(s, clientauth.MechanismSCRAMSHA512, "unknown_user"), authFailures(s, clientauth.MechanismSCRAMSHA512, "bad_password"))
	}
}

// TestLoginHerdQueues: 40 clients of alice at one address log in at
// once, more than the burst of 3 at a time. Each exchange holds its token
// only while it runs and gives it back when it succeeds, and a client
// without one waits for it: every login succeeds, none is refused as
// rate-limited.
func TestLoginHerdQueues(t *testing.T) {
	const clients = 40
	e := newSecEnv(t)
	kf := newKfake(t, 1)
	cfg := e.sasl(clientauth.MechanismSCRAMSHA512)
	cfg.FailedBurst, cfg.FailedInterval, cfg.AdmitWait = 3, time.Hour, clientauth.DefaultAdmitWait
	s, addr := startFerry(t, kf.ListenAddrs(), WithClientSASL(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make(chan error, clients)
	for range clients {
		go func() { errs <- scramLogin(ctx, addr, "127.0.0.1", "alice", "alice-secret") }()
	}
	for i := range clients {
		if err := <-errs; err != nil {
			t.Errorf("login %d of the herd: %v", i, err)
		}
	}
	if n := authFailures(s, clientauth.MechanismSCRAMSHA512, "rate_limited"); n != 0 {
		t.Errorf("%v logins refused as rate-limited, want none", n)
	}
}
