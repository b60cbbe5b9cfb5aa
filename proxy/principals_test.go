package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/conformance/testpki"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/upstream"
)

// aclKfake is a kfake cluster with SASL and ACLs: the superuser ferry,
// alice-app allowed to write and describe topic a-only, bob-app allowed
// only to describe it, and the users given in extra.
func aclKfake(t *testing.T, extra ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	topic := func(op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "a-only", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	return newKfake(t, 1, append([]kfake.Opt{kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("SCRAM-SHA-512", "ferry", "ferry-pw"),
		kfake.User("SCRAM-SHA-512", "alice-app", "alice-pw", topic(kmsg.ACLOperationWrite), topic(kmsg.ACLOperationDescribe)),
		kfake.SeedTopics(1, "a-only", "other")}, extra...)...)
}

// principalSecurity is a cluster's service identity (ferry) and the
// mapping of User:alice and User:bob to alice-app and bob-app.
func principalSecurity(t *testing.T, cluster string) (*clusterauth.Security, map[string]*clusterauth.Security) {
	t.Helper()
	dir := t.TempDir()
	pw := func(name, v string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	sec, err := clusterauth.New(cluster, nil, &clusterauth.SASL{Mechanism: "SCRAM-SHA-512", Username: "ferry", PasswordFile: pw("ferry", "ferry-pw")})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*clusterauth.Security{}
	for p, u := range map[string]string{"User:alice": "alice-app", "User:bob": "bob-app"} {
		s, err := sec.WithSASL(cluster, p, &clusterauth.SASL{Mechanism: "SCRAM-SHA-512", Username: u, PasswordFile: pw(u, strings.TrimSuffix(u, "-app")+"-pw")})
		if err != nil {
			t.Fatal(err)
		}
		m[p] = s
	}
	return sec, m
}

func produceErr(ctx context.Context, t *testing.T, addr, user string) error {
	t.Helper()
	return produceTo(ctx, t, addr, user, "a-only")
}

func produceTo(ctx context.Context, t *testing.T, addr, user, topic string) error {
	t.Helper()
	cl := newClient(t, addr, scram512(user, user+"-secret"), kgo.DisableIdempotentWrite(), kgo.RecordRetries(1), kgo.RequestRetries(1))
	return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("from " + user)}).FirstErr()
}

// TestPrincipalMapping: clients authenticated to Ferry as alice, bob and
// carol; alice and bob mapped to their own users on the cluster, carol
// not. The broker's ACLs decide per application: alice's produce to
// a-only succeeds, bob's is answered TOPIC_AUTHORIZATION_FAILED (the
// broker's answer, as bob-app); carol's goes on Ferry's own identity (a
// superuser) and succeeds, as does hers to topic other, which alice's
// is refused. With unmapped principals refused, carol's
// authentication fails naming her principal, and alice's still works.
func TestPrincipalMapping(t *testing.T) {
	kf := aclKfake(t, kfake.User("SCRAM-SHA-512", "bob-app", "bob-pw", kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "a-only", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true}))
	e := newSecEnv(t)
	e.addUser(t, "alice", "alice-secret")
	e.addUser(t, "bob", "bob-secret")
	e.addUser(t, "carol", "carol-secret")
	sec, mapped := principalSecurity(t, "a")
	cluster := upstream.Config{Name: "a", Bootstrap: kf.ListenAddrs(), Security: sec, Principals: mapped}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_, addr := startFerry(t, kf.ListenAddrs(), WithClusters(cluster), WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA512)))
	if err := produceErr(ctx, t, addr, "alice"); err != nil {
		t.Errorf("alice (mapped to alice-app, allowed): %v", err)
	}
	if err := produceTo(ctx, t, addr, "alice", "other"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Errorf("alice to topic other (alice-app may not write it): %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	if err := produceTo(ctx, t, addr, "carol", "other"); err != nil {
		t.Errorf("carol to topic other (Ferry's identity): %v", err)
	}
	if err := produceErr(ctx, t, addr, "bob"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Errorf("bob (mapped to bob-app, not allowed to write): %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	if err := produceErr(ctx, t, addr, "carol"); err != nil {
		t.Errorf("carol (unmapped: Ferry's identity, a superuser): %v", err)
	}

	s, addr := startFerry(t, kf.ListenAddrs(), WithClusters(cluster), WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA512)), WithRefuseUnmapped(true))
	err := produceErr(ctx, t, addr, "carol")
	if !errors.Is(err, kerr.SaslAuthenticationFailed) || !strings.Contains(err.Error(), "User:carol has no credentials towards the clusters") {
		t.Errorf("carol with unmapped principals refused: %v, want SASL_AUTHENTICATION_FAILED naming User:carol", err)
	}
	if n := authFailures(s, clientauth.MechanismSCRAMSHA512, "unmapped_principal"); n == 0 {
		t.Error("carol's refusal not counted as unmapped_principal")
	}
	if err := produceErr(ctx, t, addr, "alice"); err != nil {
		t.Errorf("alice with unmapped principals refused: %v", err)
	}

	// The switchover's check: every mapped principal authenticates on
	// the cluster; on one where bob-app does not exist, bob is named.
	if fails, err := s.CheckPrincipals(ctx, "a"); err != nil || len(fails) != 0 {
		t.Errorf("check on a cluster with both users: %v %v", fails, err)
	}
	kb := aclKfake(t)
	secB, mappedB := principalSecurity(t, "b")
	sb, _ := startFerry(t, kb.ListenAddrs(), WithClusters(upstream.Config{Name: "b", Bootstrap: kb.ListenAddrs(), Security: secB, Principals: mappedB}))
	start := time.Now()
	fails, err := sb.CheckPrincipals(ctx, "b")
	if err != nil || len(fails) != 1 || fails[0].Principal != "User:bob" || !clusterauth.AuthFailed(fails[0].Err) {
		t.Fatalf("check on a cluster without bob-app: %v %v, want User:bob's authentication failed", fails, err)
	}
	t.Logf("check took %v: %s", time.Since(start), fails[0])
}

// TestPrincipalMappingClientCertificate: on a TLS listener without SASL,
// the certificate's principal is the one mapped: User:CN=alice writes to
// a-only as alice-app (and is refused topic other, which Ferry's identity
// may write); with unmapped principals refused, a client without a
// certificate is closed after the handshake, counted as unmapped.
func TestPrincipalMappingClientCertificate(t *testing.T) {
	kf := aclKfake(t)
	e := newSecEnv(t)
	sec, mapped := principalSecurity(t, "a")
	mapped = map[string]*clusterauth.Security{"User:CN=alice": mapped["User:alice"]}
	tc := e.tls()
	tc.ClientCAFile, tc.ClientAuth = e.caFile, clientauth.ClientAuthRequest
	s, addr := startFerry(t, kf.ListenAddrs(), WithClusters(upstream.Config{Name: "a", Bootstrap: kf.ListenAddrs(), Security: sec, Principals: mapped}),
		WithClientTLS(tc), WithRefuseUnmapped(true))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leaf, err := e.ca.Issue(testpki.LeafOptions{CommonName: "alice", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	produce := func(topic string, tcfg *tls.Config) error {
		cl := newClient(t, addr, kgo.DialTLSConfig(tcfg), kgo.DisableIdempotentWrite(), kgo.RecordRetries(1), kgo.RequestRetries(1))
		return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr()
	}
	if err := produce("a-only", e.clientTLS(cert)); err != nil {
		t.Errorf("User:CN=alice to a-only: %v", err)
	}
	if err := produce("other", e.clientTLS(cert)); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Errorf("User:CN=alice to other: %v, want TOPIC_AUTHORIZATION_FAILED (alice-app may not write it)", err)
	}
	if err := produce("a-only", e.clientTLS()); err == nil {
		t.Error("a client without a certificate produced with unmapped principals refused")
	}
	if n := authFailures(s, "TLS", "unmapped_principal"); n == 0 {
		t.Error("the refusal of the client without a certificate is not counted")
	}
	if n := closes(s, "auth_failed"); n == 0 {
		t.Error("no connection closed as auth_failed")
	}
}
