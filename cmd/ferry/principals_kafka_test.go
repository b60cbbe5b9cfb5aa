package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/routing"
)

// aclCluster is a 1-node cluster with a SASL_SSL listener (SCRAM-SHA-512),
// Kafka's StandardAuthorizer, and the SCRAM users given (user →
// password). ferry and ANONYMOUS (the PLAINTEXT listener, which the
// brokers and the test use) are super users; every other user has only
// the ACLs the test creates.
func aclCluster(t *testing.T, name string, p *pki, users map[string]string) *kafkatest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("real Kafka")
	}
	c := kafkatest.Start(t, 1, kafkatest.WithName(name),
		kafkatest.WithSecureListener(kafkatest.Secure{CA: p.ca, Mechanisms: []string{"SCRAM-SHA-512"}}),
		kafkatest.WithBrokerConfig("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer"),
		kafkatest.WithBrokerConfig("super.users", "User:ferry;User:ANONYMOUS"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for u, pw := range users {
		if err := c.AddSCRAMUser(ctx, "SCRAM-SHA-512", u, pw); err != nil {
			t.Fatalf("creating the SCRAM user %s on %s: %v", u, name, err)
		}
	}
	adm := kadm.NewClient(newRawClient(t, c.Addrs()))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "a-only"); err != nil {
		t.Fatalf("creating a-only on %s: %v", name, err)
	}
	// alice-app may write a-only; bob-app may only describe it.
	acls := kadm.NewACLs().Allow("User:alice-app").Topics("a-only").Operations(kadm.OpWrite, kadm.OpDescribe).ResourcePatternType(kadm.ACLPatternLiteral)
	bob := kadm.NewACLs().Allow("User:bob-app").Topics("a-only").Operations(kadm.OpDescribe).ResourcePatternType(kadm.ACLPatternLiteral)
	for _, b := range []*kadm.ACLBuilder{acls, bob} {
		res, err := adm.CreateACLs(ctx, b)
		if err == nil {
			for _, r := range res {
				if r.Err != nil {
					err = r.Err
				}
			}
		}
		if err != nil {
			t.Fatalf("creating ACLs on %s: %v", name, err)
		}
	}
	return c
}

func newRawClient(t *testing.T, seeds []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestPrincipalsRealKafka: clients authenticate to Ferry as alice and bob
// (SCRAM over SASL_PLAINTEXT); Ferry maps them to the users alice-app and
// bob-app on both clusters, reached over SASL_SSL with Kafka's
// StandardAuthorizer. The brokers' ACLs decide per application: alice's
// produce to a-only succeeds, bob's is answered TOPIC_AUTHORIZATION_FAILED
// by the broker. A planned switchover to the standby, where bob-app does
// not exist, is refused with principals_unauthenticated naming User:bob,
// nothing held; once bob-app is created there the switch goes through, and
// alice writes to the standby as alice-app.
func TestPrincipalsRealKafka(t *testing.T) {
	p := newPKI(t)
	primary := aclCluster(t, "acl-primary", p, map[string]string{"ferry": "ferry-pw", "alice-app": "alice-app-pw", "bob-app": "bob-app-pw"})
	standby := aclCluster(t, "acl-standby", p, map[string]string{"ferry": "ferry-pw", "alice-app": "alice-app-pw"})

	store := filepath.Join(p.dir, "users.yaml")
	creds, err := clientauth.LoadCredentials(store)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"alice", "bob"} {
		cred, err := clientauth.NewSCRAMCredential(clientauth.MechanismSCRAMSHA512, u+"-secret", clientauth.MinSCRAMIterations)
		if err != nil {
			t.Fatal(err)
		}
		creds.Set(u, clientauth.MechanismSCRAMSHA512, cred)
	}
	if err := creds.Save(store); err != nil {
		t.Fatal(err)
	}
	cluster := func(name string, c *kafkatest.Cluster) string {
		return fmt.Sprintf(`  - name: %s
    bootstrap: [%s]
    tls: {ca_file: %s}
    sasl: {mechanism: SCRAM-SHA-512, username: ferry, password_file: %s}
    principals:
      - {principal: "User:alice", sasl: {mechanism: SCRAM-SHA-512, username: alice-app, password_file: %s}}
      - {principal: "User:bob", sasl: {mechanism: SCRAM-SHA-512, username: bob-app, password_file: %s}}
`, name, c.ListenerAddr("SECURE", 1), p.caFile, p.secret(t, name+"-ferry", "ferry-pw"), p.secret(t, name+"-alice", "alice-app-pw"), p.secret(t, name+"-bob", "bob-app-pw"))
	}
	n, addr := startNodeLogged(t, `
cluster_id: ferry-principals-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
sasl: {mechanisms: [SCRAM-SHA-512], credentials_file: `+store+`}
unmapped_principals: refuse
mirror: {sync_interval: 1s}
clusters:
`+cluster("primary", primary)+cluster("standby", standby), zap.New(zapcoreTest(t)))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	produce := func(user string) error {
		cl := newRawClient(t, []string{addr}, kgo.SASL(scram.Auth{User: user, Pass: user + "-secret"}.AsSha512Mechanism()),
			kgo.DisableIdempotentWrite(), kgo.RecordRetries(2), kgo.RequestRetries(2))
		return cl.ProduceSync(ctx, &kgo.Record{Topic: "a-only", Value: []byte("from " + user)}).FirstErr()
	}
	start := time.Now()
	if err := produce("alice"); err != nil {
		t.Fatalf("alice (alice-app may write a-only): %v", err)
	}
	if err := produce("bob"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("bob (bob-app may not write a-only): %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	t.Logf("produces through Ferry: %v", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	_, err = n.switchover(ctx, routing.Request{To: "standby", Timeout: time.Minute})
	var re *routing.Error
	if !errors.As(err, &re) || re.Reason != routing.ReasonPrincipals || len(re.Principals) != 1 || !strings.HasPrefix(re.Principals[0], "User:bob: ") {
		t.Fatalf("switch to a standby without bob-app: %v, want %s naming User:bob", err, routing.ReasonPrincipals)
	}
	if st := n.routes.Current(); st.Active != "primary" || st.Phase != routing.PhaseServing || st.Generation != 0 {
		t.Fatalf("after the refusal: %s", st)
	}
	t.Logf("refused in %v: %s", time.Since(start).Round(time.Millisecond), re)

	if err := standby.AddSCRAMUser(ctx, "SCRAM-SHA-512", "bob-app", "bob-app-pw"); err != nil {
		t.Fatal(err)
	}
	st, err := n.switchover(ctx, routing.Request{To: "standby", Timeout: time.Minute})
	if err != nil || st.Active != "standby" {
		t.Fatalf("switch once bob-app exists on the standby: %+v %v", st, err)
	}
	if err := produce("alice"); err != nil {
		t.Fatalf("alice after the switch: %v", err)
	}
	if err := produce("bob"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("bob after the switch: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
}
