package main

// Ferry in front of real Apache Kafka clusters reached over SASL_SSL
// (skipped under -short): certificates made here with Go's crypto
// packages, SCRAM users created through the admin API.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/conformance/testpki"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/routing"
)

// reauthAfter is the brokers' connections.max.reauth.ms in these tests:
// traffic runs across several sessions.
const reauthAfter = 10 * time.Second

// pki is a CA and a directory holding what a test writes.
type pki struct {
	ca  *testpki.CA
	dir string
	// caFile is the CA certificate, what Ferry trusts.
	caFile string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := testpki.NewCA("ferry-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{ca: ca, dir: t.TempDir()}
	if p.caFile, err = ca.WriteFile(p.dir, "ca"); err != nil {
		t.Fatal(err)
	}
	return p
}

// secret writes a secret file and returns its path.
func (p *pki) secret(t *testing.T, name, value string) string {
	t.Helper()
	f := filepath.Join(p.dir, name)
	if err := os.WriteFile(f, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// scramCluster starts a 1-node cluster with a SASL_SSL listener (SCRAM-SHA-512,
// sessions of reauthAfter) and the SCRAM user ferry with password pw.
func scramCluster(t *testing.T, name string, p *pki, pw string) *kafkatest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("real Kafka")
	}
	c := kafkatest.Start(t, 1, kafkatest.WithName(name), kafkatest.WithSecureListener(kafkatest.Secure{
		CA: p.ca, Mechanisms: []string{"SCRAM-SHA-512"}, ReauthAfter: reauthAfter,
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.AddSCRAMUser(ctx, "SCRAM-SHA-512", "ferry", pw); err != nil {
		t.Fatalf("creating the SCRAM user on %s: %v", name, err)
	}
	return c
}

// observed is a logger at info that tests read back, and a test logger
// at warn.
func observed(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	return zap.New(zapcore.NewTee(core, zapcoreTest(t))), logs
}

func zapcoreTest(t *testing.T) zapcore.Core {
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	return zapcore.NewCore(enc, zapcore.AddSync(testWriter{t}), zap.WarnLevel)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// startNodeLogged is startNode with the given logger.
func startNodeLogged(t *testing.T, yaml string, log *zap.Logger) (*node, string) {
	t.Helper()
	cfg, err := configFrom(yaml)
	if err != nil {
		t.Fatal(err)
	}
	n, err := newNode(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := n.start(ctx); err != nil {
		t.Fatal(err)
	}
	return n, n.ln.Addr().String()
}

// endsListed fails if a log line says the switch could not list the
// standby's end offsets (its fences would come from the mirror's own
// count), or that a client reached a cluster without its TLS or SASL.
func endsListed(t *testing.T, logs *observer.ObservedLogs) {
	t.Helper()
	for _, e := range logs.All() {
		line := fmt.Sprint(e.Message, " ", e.ContextMap())
		if strings.HasPrefix(e.Message, "listing the standby's end offsets") || strings.Contains(line, "is SASL missing") || strings.Contains(line, "is TLS missing") {
			t.Errorf("%s", line)
		}
	}
}

// noKilledConnections fails if a log line says an upstream connection or a
// mirror session was lost: with sessions that expire, that is a broker
// closing a connection used past its session's end.
func noKilledConnections(t *testing.T, logs *observer.ObservedLogs) {
	t.Helper()
	for _, e := range logs.All() {
		switch e.Message {
		case "upstream connection closed", "mirror partition session ended, retrying", "upstream authentication failed":
			t.Errorf("%s: %v", e.Message, e.ContextMap())
		}
	}
}

// TestUpstreamSCRAMRealKafka: Ferry (plaintext towards clients) in front of
// a cluster reached over SASL_SSL with SCRAM-SHA-512, whose sessions last
// 10 s. An idempotent producer and a consumer group run through Ferry for
// over 2.5 sessions: nothing fails, every acknowledged record is consumed
// at its offset and is on the cluster there, and no connection is lost
// (Ferry replaces its pooled connections before their sessions end; a
// broker closes one used past it). /status says how the cluster is reached.
func TestUpstreamSCRAMRealKafka(t *testing.T) {
	p := newPKI(t)
	c := scramCluster(t, "scram", p, "ferry-pw-1")
	log, logs := observed(t)
	n, addr := startNodeLogged(t, fmt.Sprintf(`
cluster_id: ferry-scram-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - name: secure
    bootstrap: [%s]
    tls: {ca_file: %s, min_version: "1.2"}
    sasl: {mechanism: SCRAM-SHA-512, username: ferry, password_file: %s}
`, strings.Join(c.ListenerAddrs("SECURE"), ","), p.caFile, p.secret(t, "pw", "ferry-pw-1")), log)

	const topic, parts, group = "secured", 3, "secured-group"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, topic, parts)
	start := time.Now()
	tr := startTraffic(t, addr, topic, parts, group)
	tr.waitMore(300, time.Minute)
	for time.Since(start) < 2*reauthAfter+5*time.Second {
		tr.waitMore(100, time.Minute)
	}
	tr.stopProducing()
	tr.waitConsumed(time.Minute)
	tr.stop()
	total := tr.verifyOn(ctx, c.Addrs())
	t.Logf("%d records through Ferry over SASL_SSL in %v (sessions of %v)", total, time.Since(start).Round(time.Second), reauthAfter)
	noKilledConnections(t, logs)

	st := n.admin.Status(ctx)
	if len(st.Clusters) != 1 || st.Clusters[0].Security != "SASL_SSL SCRAM-SHA-512 as ferry" || !st.Clusters[0].Reachable {
		t.Fatalf("/status clusters: %+v", st.Clusters)
	}
}

// TestUpstreamWrongPasswordRealKafka: `ferry serve` with a wrong SCRAM
// password for its only cluster keeps running and retrying; the log and
// /status say that authentication failed for the cluster, and never show
// the password; a client gets an error in bounded time rather than a hang.
// With the password file put right, Ferry connects and serves, without a
// restart. When the broker then changes the password, clients get
// retriable Kafka errors once the sessions end, and the log and /status
// say why.
func TestUpstreamWrongPasswordRealKafka(t *testing.T) {
	p := newPKI(t)
	c := scramCluster(t, "wrongpw", p, "the-right-one")
	const wrong = "not-the-pw-5521"
	pwFile := p.secret(t, "pw", wrong)
	kafkaAddr := deadAddr(t)
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: ferry-wrongpw-test
listen: %s
admin_listen: 127.0.0.1:0
clusters:
  - name: secure
    bootstrap: [%s]
    tls: {ca_file: %s}
    sasl: {mechanism: SCRAM-SHA-512, username: ferry, password_file: %s}
`, kafkaAddr, c.ListenerAddr("SECURE", 1), p.caFile, pwFile))
	proc := startFerry(t, "serve", "--config", path)
	adminAddr := proc.waitFor(t, adminLog, 30*time.Second)[1]
	line := proc.waitFor(t, regexp.MustCompile(`"msg":"authentication to the cluster failed; retrying".*"cluster":"secure".*$`), 60*time.Second)[0]
	if !strings.Contains(line, "SASL_AUTHENTICATION_FAILED") || !strings.Contains(line, `"security":"SASL_SSL SCRAM-SHA-512 as ferry"`) {
		t.Fatalf("the log does not say authentication failed, as whom: %s", line)
	}

	var st admin.Status
	_, body := httpGet(t, "http://"+adminAddr+"/status")
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v\n%s", err, body)
	}
	if len(st.Clusters) != 1 || !st.Clusters[0].AuthFailed || st.Clusters[0].Reachable ||
		!strings.Contains(st.Clusters[0].Error, "cluster secure") || !strings.Contains(st.Clusters[0].Error, "SASL authentication SCRAM-SHA-512 as ferry failed") ||
		st.Clusters[0].Security != "SASL_SSL SCRAM-SHA-512 as ferry" {
		t.Fatalf("/status clusters: %+v", st.Clusters)
	}
	t.Logf("/status: %s", st.Clusters[0].Error)

	// A client is refused at once (the Kafka port is closed until Ferry
	// can serve) and gives up within its own timeout.
	cl := newClient(t, kgo.SeedBrokers(kafkaAddr), kgo.DefaultProduceTopic("t"))
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	startP := time.Now()
	err := cl.ProduceSync(pctx, &kgo.Record{Value: []byte("v")}).FirstErr()
	pcancel()
	if err == nil || time.Since(startP) > 10*time.Second {
		t.Fatalf("produce while Ferry cannot authenticate: %v after %v", err, time.Since(startP))
	}
	select {
	case <-proc.done:
		t.Fatalf("ferry exited (%v)", proc.err)
	default:
	}

	// Put right: read at the next attempt.
	os.WriteFile(pwFile, []byte("the-right-one\n"), 0o600)
	proc.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients"`), 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, kafkaAddr, "t", 1)
	prod := newClient(t, kgo.SeedBrokers(kafkaAddr), kgo.DefaultProduceTopic("t"), kgo.RecordRetries(0))
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce once the password is right: %v", err)
	}

	// While serving, the broker changes the password: once the sessions
	// end (10 s), new connections are refused. A client's produce gets a
	// retriable Kafka error in bounded time; the log and /status say so.
	if err := c.AddSCRAMUser(ctx, "SCRAM-SHA-512", "ferry", "rotated-on-the-broker"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(reauthAfter + time.Second)
	startP = time.Now()
	err = prod.ProduceSync(ctx, &kgo.Record{Value: []byte("refused")}).FirstErr()
	if err == nil || !kerr.IsRetriable(err) || time.Since(startP) > 30*time.Second {
		t.Fatalf("produce after the broker changed the password: %v after %v, want a retriable Kafka error", err, time.Since(startP))
	}
	t.Logf("client: %v after %v", err, time.Since(startP).Round(time.Millisecond))
	proc.waitFor(t, regexp.MustCompile(`"msg":"upstream authentication failed".*"cluster":"secure"`), 30*time.Second)
	testwait.Eventually(t, 10*time.Second, "/status says the cluster refused the credentials", func() error {
		_, body := httpGet(t, "http://"+adminAddr+"/status")
		if !strings.Contains(body, `"auth_failed": true`) {
			return fmt.Errorf("%s", body)
		}
		return nil
	})
	select {
	case <-proc.done:
		t.Fatalf("ferry exited (%v)", proc.err)
	default:
	}
	for _, secret := range []string{wrong, "the-right-one", "rotated-on-the-broker"} {
		if strings.Contains(proc.output(), secret) {
			t.Fatalf("the log shows a password")
		}
		if _, body := httpGet(t, "http://"+adminAddr+"/status"); strings.Contains(body, secret) {
			t.Fatalf("/status shows a password: %s", body)
		}
	}
	proc.stop(t, 15*time.Second)
}

// TestMirrorSASLSSLRealKafka: the mirror between two clusters reached over
// SASL_SSL, the primary with SCRAM-SHA-512, the standby with PLAIN and a
// client certificate it requires (mutual TLS), both with 10 s sessions.
// An idempotent producer and a consumer group run through Ferry while it
// switches (planned) to the standby: nothing fails, every acknowledged
// record is on the standby at the offset it was acknowledged at, the
// group's offsets were there at the switch (nothing committed is read
// again), and no connection of the proxy or the mirror is lost. With the
// traffic stopped, a planned switch back: generation 1's fence on each
// partition is the standby's end read directly from the broker, and no
// switch failed to list the standby's ends over SASL_SSL.
func TestMirrorSASLSSLRealKafka(t *testing.T) {
	p := newPKI(t)
	clientCA, err := testpki.NewCA("ferry-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := clientCA.Issue(testpki.LeafOptions{CommonName: "ferry", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := leaf.WriteFiles(p.dir, "ferry-client")
	if err != nil {
		t.Fatal(err)
	}
	primary := scramCluster(t, "primary", p, "primary-pw")
	standby := kafkatest.Start(t, 1, kafkatest.WithName("standby"), kafkatest.WithSecureListener(kafkatest.Secure{
		CA: p.ca, ClientCA: clientCA, Mechanisms: []string{"PLAIN"}, PlainUsers: map[string]string{"ferry": "standby-pw"}, ReauthAfter: reauthAfter,
	}))
	t.Setenv("FERRY_TEST_STANDBY_PW", "standby-pw")
	log, logs := observed(t)
	n, addr := startNodeLogged(t, fmt.Sprintf(`
cluster_id: ferry-mirror-sasl-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - name: primary
    bootstrap: [%s]
    tls: {ca_file: %[3]s}
    sasl: {mechanism: SCRAM-SHA-512, username: ferry, password_file: %[4]s}
  - name: standby
    bootstrap: [%[2]s]
    tls: {ca_file: %[3]s, cert_file: %[5]s, key_file: %[6]s}
    sasl: {mechanism: PLAIN, username: ferry, password_env: FERRY_TEST_STANDBY_PW}
mirror: {sync_interval: 1s}
`, primary.ListenerAddr("SECURE", 1), standby.ListenerAddr("SECURE", 1), p.caFile, p.secret(t, "primary-pw", "primary-pw"), certFile, keyFile), log)

	const topic, parts, group = "mirrored", 3, "mirrored-group"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, topic, parts)
	start := time.Now()
	tr := startTraffic(t, addr, topic, parts, group)
	for time.Since(start) < reauthAfter+5*time.Second {
		tr.waitMore(100, time.Minute)
	}
	since := tr.rereads()
	st, err := n.switchover(ctx, routing.Request{To: "standby", Timeout: time.Minute})
	if err != nil {
		t.Fatalf("switch to the standby: %v", err)
	}
	if st.Generation != 1 || st.Active != "standby" || st.Last == nil || st.Last.Outcome != "switched" {
		t.Fatalf("state after the switch: %+v", st)
	}
	atSwitch := committed(t, primary.Addrs(), group, topic)
	for end := time.Now().Add(reauthAfter + 2*time.Second); time.Now().Before(end); {
		tr.waitMore(100, time.Minute)
	}
	if bad := tr.rereadBelow(since, atSwitch); len(bad) > 0 {
		t.Fatalf("re-read records below the offsets committed at the switch (%v): %v", atSwitch, bad)
	}
	tr.stopProducing()
	tr.waitConsumed(time.Minute)
	tr.stop()
	total := tr.verifyOn(ctx, standby.Addrs())
	t.Logf("%d records across a switch between SASL_SSL clusters in %v; %d re-read", total, time.Since(start).Round(time.Second), tr.rereads())
	noKilledConnections(t, logs)

	// Nothing writes now: the standby's ends read directly are the fence
	// the switch back must record for generation 1.
	ends := endOffsets(t, standby.Addrs(), topic)
	st, err = n.switchover(ctx, routing.Request{To: "primary", Timeout: time.Minute})
	if err != nil {
		t.Fatalf("switch back to the primary: %v", err)
	}
	if st.Generation != 2 || st.Active != "primary" {
		t.Fatalf("state after the switch back: %+v", st)
	}
	for part := range int32(parts) {
		if e, ok := st.FenceEnd(1, topic, part); !ok || e != ends[part] {
			t.Errorf("generation 1's fence on %s[%d]: %d, %v; want the standby's end %d", topic, part, e, ok, ends[part])
		}
	}
	endsListed(t, logs)
}

// TestForcedSwitchSASLRealKafka: a forced switch between two clusters
// reached over SASL_SSL with SCRAM-SHA-512. The mirror is held back by a
// transaction left open on the primary, and the primary dies. The switch's
// fence is the standby's end read directly from the broker, its lost range
// runs from there to the primary's end, the first record produced after it
// is acknowledged at the fence, and the switch did not fail to list the
// standby's ends (the fence would then be the mirror's own count, below
// appends a stopped writer had sent: TestSwitchStandbyEndsOverSASL).
func TestForcedSwitchSASLRealKafka(t *testing.T) {
	p := newPKI(t)
	primary := scramCluster(t, "primary", p, "primary-pw")
	standby := scramCluster(t, "standby", p, "standby-pw")
	log, logs := observed(t)
	n, addr := startNodeLogged(t, fmt.Sprintf(`
cluster_id: ferry-forced-sasl-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - name: primary
    bootstrap: [%s]
    tls: {ca_file: %[3]s}
    sasl: {mechanism: SCRAM-SHA-512, username: ferry, password_file: %[4]s}
  - name: standby
    bootstrap: [%[2]s]
    tls: {ca_file: %[3]s}
    sasl: {mechanism: SCRAM-SHA-512, username: ferry, password_file: %[5]s}
mirror: {sync_interval: 1s}
`, primary.ListenerAddr("SECURE", 1), standby.ListenerAddr("SECURE", 1), p.caFile, p.secret(t, "primary-pw", "primary-pw"), p.secret(t, "standby-pw", "standby-pw")), log)

	const topic = "forced-sasl"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, topic, 1)
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	produce := func(prefix string, count int) []int64 { return produceNumbered(t, ctx, prod, prefix, count) }
	produce("before", 50)
	if err := n.mirror.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatal(err)
	}
	// A transaction left open stops the mirror at its first offset;
	// what follows is acknowledged by the primary only.
	leaveTxnOpen(t, ctx, addr, topic, "forced-sasl-open")
	unmirrored := produce("unmirrored", 20)
	end := unmirrored[len(unmirrored)-1] + 1
	waitMirrorHeldAt(t, n, 50, end)
	fence := endOffsets(t, standby.Addrs(), topic)[0]
	if fence != 50 {
		t.Fatalf("the standby's end read directly: %d; want 50", fence)
	}

	if err := primary.Kill(primary.NodeIDs()[0]); err != nil {
		t.Fatal(err)
	}
	st, err := n.switchover(ctx, routing.Request{To: "standby", Mode: routing.Forced})
	if err != nil {
		t.Fatalf("forced switch: %v", err)
	}
	want := []routing.LostRange{{Topic: topic, Partition: 0, From: fence, To: end}}
	if st.Generation != 1 || st.Active != "standby" || st.Last == nil || fmt.Sprint(st.Last.Lost) != fmt.Sprint(want) {
		t.Fatalf("after the forced switch: %+v, last %+v; want generation 1 on standby with lost %v", st, st.Last, want)
	}
	if e, ok := st.FenceEnd(0, topic, 0); !ok || e != fence {
		t.Fatalf("generation 0's fence: %d, %v; want the standby's end %d", e, ok, fence)
	}
	if after := produce("after", 1); after[0] != fence {
		t.Fatalf("first record after the switch acknowledged at %d, want %d (the fence)", after[0], fence)
	}
	endsListed(t, logs)
}

// unsecuredJWT is a token Kafka's default OAUTHBEARER validator accepts
// (alg none: for tests), for subject sub, valid an hour.
func unsecuredJWT(sub string) string {
	enc := base64.RawURLEncoding
	now := time.Now().Unix()
	return enc.EncodeToString([]byte(`{"alg":"none"}`)) + "." +
		enc.EncodeToString([]byte(fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, sub, now, now+3600))) + "."
}

// TestOAuthBearerRealKafka: Ferry reaches a SASL_SSL cluster with
// OAUTHBEARER, its token from an OAuth 2 token endpoint (client
// credentials, the secret from a file): records produced and consumed
// through Ferry are at their offsets, and the endpoint was asked with the
// client's credentials. A token from a file works too.
func TestOAuthBearerRealKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka")
	}
	p := newPKI(t)
	c := kafkatest.Start(t, 1, kafkatest.WithName("oauth"), kafkatest.WithSecureListener(kafkatest.Secure{
		CA: p.ca, Mechanisms: []string{"OAUTHBEARER"},
	}))
	var asked atomic.Int64
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, secret, ok := r.BasicAuth()
		if !ok || id != "ferry" || secret != "client-secret-42" || r.FormValue("grant_type") != "client_credentials" || r.FormValue("scope") != "kafka" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"invalid_client"}`)
			return
		}
		asked.Add(1)
		fmt.Fprintf(w, `{"access_token":%q,"token_type":"bearer","expires_in":3600}`, unsecuredJWT("ferry"))
	}))
	defer idp.Close()
	_, addr := startNode(t, fmt.Sprintf(`
cluster_id: ferry-oauth-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - name: oauth
    bootstrap: [%s]
    tls: {ca_file: %s}
    sasl: {mechanism: OAUTHBEARER, token_endpoint: %q, token_endpoint_insecure: true, client_id: ferry, client_secret_file: %s, scope: kafka}
`, c.ListenerAddr("SECURE", 1), p.caFile, idp.URL, p.secret(t, "client-secret", "client-secret-42")))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createTopicVia(t, ctx, addr, "tokens", 1)
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("tokens"))
	var rs []*kgo.Record
	for i := range 100 {
		rs = append(rs, &kgo.Record{Value: []byte(fmt.Sprint(i))})
	}
	if err := prod.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce through Ferry: %v", err)
	}
	cons := newClient(t, kgo.SeedBrokers(addr), kgo.ConsumeTopics("tokens"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for got := 0; got < 100; {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of 100", got)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset != int64(got) || string(r.Value) != fmt.Sprint(got) {
				t.Fatalf("record %d: offset %d value %s", got, r.Offset, r.Value)
			}
			got++
		})
	}
	if asked.Load() == 0 {
		t.Fatal("the token endpoint was never asked")
	}

	sec, err := clusterauth.New("oauth", &clusterauth.TLS{CAFile: p.caFile}, &clusterauth.SASL{Mechanism: "OAUTHBEARER", TokenFile: p.secret(t, "token", unsecuredJWT("ferry"))})
	if err != nil {
		t.Fatal(err)
	}
	if err := sec.Check(ctx, 10*time.Second, c.ListenerAddrs("SECURE")); err != nil {
		t.Fatalf("token from a file: %v", err)
	}
}
