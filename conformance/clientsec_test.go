package conformance

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/conformance/testpki"
	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/upstream"
)

// secureTarget starts Ferry in front of the shared cluster with TLS and
// SASL/SCRAM-SHA-512 on both sides: towards the clients, one user alice;
// towards the cluster, its SASL_SSL listener as the SCRAM user ferry. It
// returns Ferry, the environment that makes the client programs use the
// same security (clients/README.md, "Security"), and the client TLS
// configuration trusting Ferry's CA.
func secureTarget(t *testing.T, c *kafkatest.Cluster) (*ferrytest.Ferry, []string, *tls.Config) {
	t.Helper()
	dir := t.TempDir()
	upCA, err := shared.ca.WriteFile(dir, "kafka-ca")
	if err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(dir, "ferry-password")
	if err := os.WriteFile(pwFile, []byte("ferry-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.AddSCRAMUser(ctx, "SCRAM-SHA-512", "ferry", "ferry-secret"); err != nil {
		t.Fatal(err)
	}
	sec, err := clusterauth.New("primary", &clusterauth.TLS{Enabled: true, CAFile: upCA},
		&clusterauth.SASL{Mechanism: "SCRAM-SHA-512", Username: "ferry", PasswordFile: pwFile})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := testpki.NewCA("ferry-conformance-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.LeafOptions{CommonName: "ferry", Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := leaf.WriteFiles(dir, "ferry")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteFile(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "users.yaml")
	creds := &clientauth.Credentials{}
	for _, m := range []string{clientauth.MechanismSCRAMSHA512, clientauth.MechanismSCRAMSHA256} {
		cred, err := clientauth.NewSCRAMCredential(m, "alice-secret", clientauth.DefaultSCRAMIterations)
		if err != nil {
			t.Fatal(err)
		}
		creds.Set("alice", m, cred)
	}
	if err := creds.Save(store); err != nil {
		t.Fatal(err)
	}
	f := ferrytest.Start(t, c.Bootstrap(),
		proxy.WithClusters(upstream.Config{Name: "primary", Bootstrap: c.ListenerAddrs(sharedSecure), Security: sec}),
		proxy.WithClientTLS(clientauth.TLSConfig{CertFile: certFile, KeyFile: keyFile}),
		proxy.WithClientSASL(clientauth.SASLConfig{Mechanisms: []string{clientauth.MechanismSCRAMSHA512, clientauth.MechanismSCRAMSHA256}, CredentialsFile: store}))
	env := []string{
		"CONFORMANCE_SECURITY_PROTOCOL=SASL_SSL",
		"CONFORMANCE_SSL_CA_FILE=" + caFile,
		"CONFORMANCE_SASL_MECHANISM=SCRAM-SHA-512",
		"CONFORMANCE_SASL_USERNAME=alice",
		"CONFORMANCE_SASL_PASSWORD=alice-secret",
	}
	return f, env, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
}

// withEnv is cl whose programs run with env added to theirs.
func withEnv(cl *client, env []string) *client {
	c := *cl
	c.command = func(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
		cmd := cl.command(ctx, t, args...)
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, env...)
		return cmd
	}
	return &c
}

// TestClientSecurity runs each client family through Ferry with TLS and
// SASL/SCRAM-SHA-512 on the client side, and Ferry to the cluster over
// SASL_SSL (SCRAM-SHA-512) too: Java, librdkafka (PyPI's and Debian's
// 2.0.2), confluent-kafka-go, kafkajs, kafka-python and franz-go each
// produce (idempotent), consume the records back in a consumer group, and
// write transactions, half aborted, that a read_committed group reader sees
// only the committed half of. Every connection Ferry held shows the
// principal User:alice.
//
//	TestClientSecurity/<client>/{produce-consume,transactions}
func TestClientSecurity(t *testing.T) {
	c := sharedCluster(t)
	adm := admin(t, c)
	f, env, tlsCfg := secureTarget(t, c)
	const count = 50
	t.Run("franz-go", func(t *testing.T) {
		t.Parallel()
		franzSecure(t, f.Addr, createTopic(t, adm, "sec-franz"), tlsCfg)
	})
	for _, cl := range clients(t) {
		cl := withEnv(cl, env)
		t.Run(cl.name, func(t *testing.T) {
			t.Parallel()
			t.Run("produce-consume", func(t *testing.T) {
				topic := createTopic(t, adm, "sec-"+cl.name)
				recs := cl.produce(t, f.Addr, topic, count, "none")
				checkProduced(t, recs, count)
				got := cl.consume(t, f.Addr, topic, "g-"+topic, count, "classic")
				checkConsumed(t, got, recs)
			})
			t.Run("transactions", func(t *testing.T) {
				topic := createTopic(t, adm, "sec-txn-"+cl.name)
				all := cl.produce(t, f.Addr, topic, count, "none", "--transactional-id", "txn-"+topic)
				checkProduced(t, all, count)
				var committed []record
				for _, r := range all {
					if !r.Aborted {
						committed = append(committed, r)
					}
				}
				if len(committed) == 0 || len(committed) == len(all) {
					t.Fatalf("want both committed and aborted records, got %d committed of %d", len(committed), len(all))
				}
				got := cl.consume(t, f.Addr, topic, "g-"+topic, len(committed), "classic", "--isolation", "read_committed")
				checkConsumed(t, got, committed)
			})
		})
	}
	t.Cleanup(func() {
		cz, err := f.Server.Connz(connstats.Query{State: "all", Limit: 1000})
		if err != nil {
			t.Error(err)
			return
		}
		n := 0
		for _, ci := range cz.Connections {
			if ci.RequestsTotal > 2 && ci.Principal != "User:alice" { // more than ApiVersions and the handshake
				t.Errorf("connection %d (%s %s): principal %q, want User:alice", ci.ID, ci.ClientID, ci.SoftwareName, ci.Principal)
			}
			if ci.Principal == "User:alice" {
				n++
			}
		}
		fails := testutil.CollectAndCount(f.Registry, "ferry_client_auth_failures_total")
		t.Logf("%d connections authenticated as User:alice (%d failure series)", n, fails)
	})
}

// franzSecure: franz-go produces idempotently, consumes in a group and
// commits one transaction and aborts another, over TLS and SCRAM-SHA-512.
func franzSecure(t *testing.T, addr, topic string, tlsCfg *tls.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sec := []kgo.Opt{kgo.SeedBrokers(addr), kgo.DialTLSConfig(tlsCfg), kgo.SASL(scram.Auth{User: "alice", Pass: "alice-secret"}.AsSha512Mechanism())}
	newCl := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append(sec, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	prod := newCl(kgo.DefaultProduceTopic(topic))
	for i := range 50 {
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: []byte("plain")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	txn := newCl(kgo.DefaultProduceTopic(topic), kgo.TransactionalID("txn-"+topic))
	for _, commit := range []bool{true, false} {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			txn.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: []byte(fmt.Sprint("txn-", commit))}, nil)
		}
		if err := txn.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	cons := newCl(kgo.ConsumeTopics(topic), kgo.ConsumerGroup("g-"+topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	seen := map[string]int{}
	for seen["plain"]+seen["txn-true"] < 60 {
		fs := cons.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++ })
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	if seen["plain"] != 50 || seen["txn-true"] != 10 || seen["txn-false"] != 0 {
		t.Errorf("read %v; want 50 plain, 10 committed, no aborted", seen)
	}
}
