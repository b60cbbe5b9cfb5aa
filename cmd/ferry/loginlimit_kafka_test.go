package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// TestLoginLimitNoLockoutRealKafka: `ferry serve` with a SCRAM listener in
// front of Kafka. Wrong passwords for mallory from 127.0.0.1 use up
// mallory's allowance there (her right password is refused as
// rate-limited), and alice, from the same address, still logs in,
// creates a topic, produces, and reads her record back at its offset.
func TestLoginLimitNoLockoutRealKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka")
	}
	c := kafkatest.Start(t, 1, kafkatest.WithName("loginlimit"))
	store := usersStore(t, t.TempDir(), map[string]string{"alice": "alice-secret", "mallory": "mallory-secret"})
	p := startFerry(t, "serve", "--config", writeConfig(t, fmt.Sprintf(`
cluster_id: ferry-loginlimit-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters: [{name: main, bootstrap: [%s]}]
sasl: {mechanisms: [SCRAM-SHA-512], credentials_file: %s, failed_login_burst: 3, failed_login_interval: 1h}
`, c.Bootstrap(), store)))
	adminAddr := p.waitFor(t, adminLog, 30*time.Second)[1]
	addr := p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 90*time.Second)[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	from127 := kgo.Dialer((&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Timeout: 5 * time.Second}).DialContext)
	client := func(user, pass string, opts ...kgo.Opt) *kgo.Client {
		return newClient(t, append([]kgo.Opt{kgo.SeedBrokers(addr), from127, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())}, opts...)...)
	}
	for i := range 6 {
		if err := client("mallory", fmt.Sprint("guess-", i)).Ping(ctx); !errors.Is(err, kerr.SaslAuthenticationFailed) {
			t.Fatalf("mallory's guess %d: %v", i, err)
		}
	}
	if err := client("mallory", "mallory-secret").Ping(ctx); !errors.Is(err, kerr.SaslAuthenticationFailed) || !strings.Contains(err.Error(), "too many failed authentications") {
		t.Fatalf("mallory's right password after the guesses: %v; want refused as rate-limited", err)
	}

	alice := client("alice", "alice-secret", kgo.DefaultProduceTopic("alice"), kgo.ConsumeTopics("alice"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	resp, err := kadm.NewClient(alice).CreateTopic(ctx, 1, 1, nil, "alice")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("alice creates a topic from the guessing address: %v", err)
	}
	r, err := alice.ProduceSync(ctx, &kgo.Record{Value: []byte("from alice")}).First()
	if err != nil {
		t.Fatalf("alice produces from the guessing address: %v", err)
	}
	fs := alice.PollFetches(ctx)
	if errs := fs.Errors(); len(errs) > 0 || fs.NumRecords() != 1 || fs.Records()[0].Offset != r.Offset || string(fs.Records()[0].Value) != "from alice" {
		t.Fatalf("alice reads back %d records (%v), want hers at offset %d", fs.NumRecords(), errs, r.Offset)
	}

	_, metrics := httpGet(t, "http://"+adminAddr+"/metrics")
	counter := func(reason string) float64 {
		v := metricValue(metrics, `ferry_client_auth_failures_total{mechanism="SCRAM-SHA-512",reason="`+reason+`"}`)
		if v < 0 {
			t.Fatalf("/metrics lacks the %s failures", reason)
		}
		return v
	}
	if bad, limited := counter("bad_password"), counter("rate_limited"); bad != 3 || limited == 0 {
		t.Errorf("mallory's guesses: %v checked (bad_password), %v rate_limited; want the burst of 3 checked, the rest rate-limited", bad, limited)
	}
	p.stop(t, 15*time.Second)
}
