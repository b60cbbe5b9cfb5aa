package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/conformance/testpki"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// secureKfake is a kfake cluster that takes SCRAM-SHA-512 only, as user
// with password pw, and with withTLS TLS only (a certificate of p's CA);
// it returns the cluster and the options of a client of it, made here
// rather than by the code under test.
func secureKfake(t *testing.T, p *pki, withTLS bool, user, pw string) (*kfake.Cluster, []kgo.Opt) {
	t.Helper()
	opts := []kgo.Opt{kgo.SASL(scram.Auth{User: user, Pass: pw}.AsSha512Mechanism())}
	kopts := []kfake.Opt{kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", user, pw)}
	if !withTLS {
		c, err := kfake.NewCluster(kopts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c, append(opts, kgo.SeedBrokers(c.ListenAddrs()...))
	}
	leaf, err := p.ca.Issue(testpki.LeafOptions{CommonName: "broker", Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(append(kopts, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	pem, err := os.ReadFile(p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return c, append(opts, kgo.SeedBrokers(c.ListenAddrs()...), kgo.DialTLSConfig(&tls.Config{RootCAs: roots}))
}

// TestSwitchStandbyEndsOverSASL: the switch's fences come from the
// standby's end offsets, listed with the standby's TLS and SASL. The
// standby holds records beyond what the mirror counted (as when a writer
// stopped with appends sent and their answers unread); the positions the
// stopped mirror gives the switch are the standby's ends read directly,
// and nothing says the listing failed. A listing without the cluster's
// security failed against such a standby and fell back to the mirror's
// own count: a fence below records the standby holds. Both with SASL
// alone (SASL_PLAINTEXT) and over TLS (SASL_SSL).
func TestSwitchStandbyEndsOverSASL(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "SASL_PLAINTEXT", true: "SASL_SSL"}[withTLS], func(t *testing.T) { testSwitchStandbyEnds(t, withTLS) })
	}
}

func testSwitchStandbyEnds(t *testing.T, withTLS bool) {
	p := newPKI(t)
	a, aOpts := secureKfake(t, p, withTLS, "ferry-a", "a-pw")
	b, bOpts := secureKfake(t, p, withTLS, "ferry-b", "b-pw")
	tlsKey := ""
	if withTLS {
		tlsKey = "tls: {ca_file: " + p.caFile + "}"
	}
	cfg, err := configFrom(fmt.Sprintf(`
cluster_id: vc
admin_listen: 127.0.0.1:0
clusters:
  - name: a
    bootstrap: [%s]
    %[3]s
    sasl: {mechanism: SCRAM-SHA-512, username: ferry-a, password_file: %[4]s}
  - name: b
    bootstrap: [%[2]s]
    %[3]s
    sasl: {mechanism: SCRAM-SHA-512, username: ferry-b, password_file: %[5]s}
mirror: {sync_interval: 1s}
`, a.ListenAddrs()[0], b.ListenAddrs()[0], tlsKey, p.secret(t, "a-pw", "a-pw"), p.secret(t, "b-pw", "b-pw")))
	if err != nil {
		t.Fatal(err)
	}
	secs, err := cfg.security()
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	r := newMirrorRunner(cfg, zap.New(zapcore.NewTee(core, zapcoreTest(t))), prometheus.NewRegistry(), secs, nil, nil)
	t.Cleanup(r.Close)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srcCl := newClient(t, append(aOpts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if _, err := kadm.NewClient(srcCl).CreateTopic(ctx, 2, 1, nil, "t"); err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{5, 3} {
		for j := range n {
			if err := srcCl.ProduceSync(ctx, &kgo.Record{Topic: "t", Partition: int32(i), Value: fmt.Appendf(nil, "a%d-%d", i, j)}).FirstErr(); err != nil {
				t.Fatalf("produce to a: %v", err)
			}
		}
	}
	if err := r.Follow(routing.State{Active: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitCaughtUp(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	dstCl := newClient(t, append(bOpts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	for j := range 2 {
		if err := dstCl.ProduceSync(ctx, &kgo.Record{Topic: "t", Partition: 0, Value: fmt.Appendf(nil, "beyond-%d", j)}).FirstErr(); err != nil {
			t.Fatalf("produce to b: %v", err)
		}
	}
	ends, err := kadm.NewClient(dstCl).ListEndOffsets(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { want[o.Partition] = o.Offset })
	if want[0] != 7 || want[1] != 3 {
		t.Fatalf("the standby's ends read directly: %v; want 7 and 3", want)
	}

	got := map[int32]int64{}
	for _, pos := range (switchMirror{r}).Stop() {
		if pos.Topic == "t" {
			got[pos.Partition] = pos.Standby
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the stopped mirror's standby positions %v; want the standby's ends %v", got, want)
	}
	for _, e := range logs.All() {
		t.Errorf("logged at the switch: %s %v", e.Message, e.ContextMap())
	}
}

// TestSwitchListsSourceEnds: when the mirror stops at a switch, what the
// source holds beyond the standby is taken from the source's end offsets,
// listed then, not from the writers' last readings: a writer that had not
// fetched yet (source end -1) or read its end before the last records
// came (a reading up to a second old) would leave acknowledged records
// missing from the reported lost ranges (issue 18: 16 records missing
// and "lost: []"). With the source gone, the writers' readings are used,
// within the listing's bound.
func TestSwitchListsSourceEnds(t *testing.T) {
	src, dst := kfakeCluster(t, kfake.SeedTopics(3, "t")), kfakeCluster(t, kfake.SeedTopics(3, "t"))
	fill := func(c *kfake.Cluster, counts ...int) {
		for p, n := range counts {
			values := make([]string, n)
			for j := range values {
				values[j] = fmt.Sprintf("%d-%d", p, j)
			}
			produceTo(t, c.ListenAddrs(), "t", int32(p), values...)
		}
	}
	fill(src, 10, 10, 10)
	fill(dst, 10, 4, 0)
	r := newMirrorRunner(kfakePairConfig(t, src, dst, ""), zap.New(zapcoreTest(t)), prometheus.NewRegistry(), nil, nil, nil)
	t.Cleanup(r.Close)
	// What the writers had read when they stopped: partition 1's end read
	// before its last 6 records, partition 2's writer not yet fetching.
	sts := []mirror.PartitionStatus{
		{Topic: "t", Partition: 0, Mirrored: 10, SourceEnd: 10},
		{Topic: "t", Partition: 1, Mirrored: 4, SourceEnd: 4},
		{Topic: "t", Partition: 2, Mirrored: -1, SourceEnd: -1},
	}
	check := func(want map[int32][2]int64) {
		t.Helper()
		got := map[int32][2]int64{}
		for _, p := range r.positions("a", "b", sts) {
			got[p.Partition] = [2]int64{p.Standby, p.Source}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("positions (standby, source) by partition: %v, want %v", got, want)
		}
	}
	// Lost: t[1] offsets 4 to 10, t[2] 0 to 10.
	check(map[int32][2]int64{0: {10, 10}, 1: {4, 10}, 2: {0, 10}})
	// A writer halted where the standby parts from the source names
	// where (Matches); one halted on request does not.
	matches := func() map[int32]int64 {
		out := map[int32]int64{}
		for _, p := range r.positions("a", "b", sts) {
			if p.Matches != nil {
				out[p.Partition] = *p.Matches
			}
		}
		return out
	}
	sts[0].State, sts[0].Err, sts[0].Mirrored = mirror.StateHalted, &mirror.HaltError{Topic: "t", Err: mirror.ErrDiverged}, 7
	sts[1].State, sts[1].Err = mirror.StateHalted, &mirror.HaltError{Topic: "t", Partition: 1, Err: mirror.ErrHaltedOnRequest}
	if got := matches(); fmt.Sprint(got) != "map[0:7]" {
		t.Errorf("positions' Matches by partition: %v, want map[0:7]", got)
	}
	sts[0].State, sts[0].Err, sts[0].Mirrored = 0, nil, 10
	sts[1].State, sts[1].Err = 0, nil

	src.Close()
	start := time.Now()
	check(map[int32][2]int64{0: {10, 10}, 1: {4, 4}, 2: {0, -1}})
	if took := time.Since(start); took > sourceEndsTimeout+5*time.Second {
		t.Errorf("with the source gone the positions took %v, want about the listing's bound, %v", took, sourceEndsTimeout)
	}
}
