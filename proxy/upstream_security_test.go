package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/conformance/testpki"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/upstream"
)

// countingListener counts the connections a fake broker accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// secureKfake is a kfake cluster behind TLS and SCRAM-SHA-512 (user
// ferry), whose sessions last reauth, and the Security Ferry reaches it
// with, its password in pwFile. accepted counts its connections.
func secureKfake(t *testing.T, reauth time.Duration) (c *kfake.Cluster, sec *clusterauth.Security, pwFile string, accepted *atomic.Int64) {
	t.Helper()
	ca, err := testpki.NewCA("ferry-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.LeafOptions{CommonName: "broker", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := leaf.TLSCertificate()
	dir := t.TempDir()
	caFile, _ := ca.WriteFile(dir, "ca")
	pwFile = filepath.Join(dir, "pw")
	os.WriteFile(pwFile, []byte("right-pw\n"), 0o600)
	accepted = new(atomic.Int64)
	c = newKfake(t, 1, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "ferry", "right-pw"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}),
		kfake.BrokerConfigs(map[string]string{"connections.max.reauth.ms": fmt.Sprint(reauth.Milliseconds())}),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			ln, err := net.Listen(network, addr)
			return countingListener{ln, accepted}, err
		}),
		kfake.SeedTopics(1, "t"))
	sec, err = clusterauth.New("a", &clusterauth.TLS{CAFile: caFile}, &clusterauth.SASL{Mechanism: "SCRAM-SHA-512", Username: "ferry", PasswordFile: pwFile})
	if err != nil {
		t.Fatal(err)
	}
	return c, sec, pwFile, accepted
}

// TestUpstreamSASLSSL: Ferry in front of a cluster reached over TLS with
// SCRAM, whose sessions last 2 s. Records produced and consumed through
// Ferry (large enough that fetches are streamed, over the TLS connection,
// not spliced) are at their offsets; the pooled connections are replaced
// before their sessions end while traffic flows, without a failed request.
func TestUpstreamSASLSSL(t *testing.T) {
	c, sec, _, accepted := secureKfake(t, 2*time.Second)
	s, addr := startFerry(t, c.ListenAddrs(), WithClusters(upstream.Config{Name: "a", Bootstrap: c.ListenAddrs(), Security: sec}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prod := newClient(t, addr, kgo.DefaultProduceTopic("t"), kgo.RecordRetries(0))
	val := bytes.Repeat([]byte("v"), 16<<10)
	start := time.Now()
	sent := 0
	for time.Since(start) < 5*time.Second {
		var rs []*kgo.Record
		for range 10 {
			rs = append(rs, &kgo.Record{Key: []byte(fmt.Sprint(sent)), Value: val})
			sent++
		}
		for i, r := range prod.ProduceSync(ctx, rs...) {
			if r.Err != nil {
				t.Fatalf("record %d after %v: %v", sent-10+i, time.Since(start), r.Err)
			}
			if r.Record.Offset != int64(sent-10+i) {
				t.Fatalf("record %d at offset %d", sent-10+i, r.Record.Offset)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	// 5 s of 2 s sessions: each pooled connection was replaced.
	if n := accepted.Load(); n < 4 {
		t.Errorf("%d connections accepted by the broker in 5 s of 2 s sessions: the pooled ones were not replaced", n)
	}
	cons := newClient(t, addr, kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(4<<20))
	for got := 0; got < sent; {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d", got, sent)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset != int64(got) || string(r.Key) != fmt.Sprint(got) || !bytes.Equal(r.Value, val) {
				t.Fatalf("record %d: offset %d key %s", got, r.Offset, r.Key)
			}
			got++
		})
	}
	// Streamed from the TLS connection, copied rather than spliced.
	if n := testutilCounter(t, s, "ferry_fetch_streamed_total"); n == 0 {
		t.Errorf("no fetch answer was streamed")
	}
	if n := testutilCounter(t, s, "ferry_fetch_spliced_bytes_total"); n != 0 {
		t.Errorf("%v bytes counted spliced from a TLS connection", n)
	}
}

// testutilCounter reads a counter of the server's registry, 0 if absent.
func testutilCounter(t *testing.T, s *Server, name string) float64 {
	reg, ok := s.cfg.reg.(*prometheus.Registry)
	if !ok {
		return 0
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// TestUpstreamWrongPassword: the password file changes to a wrong
// password while Ferry runs. New upstream connections (the old ones are
// replaced as their sessions end) fail to authenticate: a client's
// produce is answered with a retriable error in bounded time, and the log
// says authentication failed for the cluster, without the password. Put
// right again, the file is read at the next connection and traffic
// resumes.
func TestUpstreamWrongPassword(t *testing.T) {
	c, sec, pwFile, _ := secureKfake(t, 1500*time.Millisecond)
	core, logs := observer.New(zap.InfoLevel)
	_, addr := startFerry(t, c.ListenAddrs(), WithClusters(upstream.Config{Name: "a", Bootstrap: c.ListenAddrs(), Security: sec}), WithLogger(zap.New(core)))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prod := newClient(t, addr, kgo.DefaultProduceTopic("t"), kgo.RecordRetries(0), kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("before")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	os.WriteFile(pwFile, []byte("wrong-pw-7731\n"), 0o600)
	time.Sleep(1600 * time.Millisecond) // the pooled sessions end
	start := time.Now()
	err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("during")}).FirstErr()
	took := time.Since(start)
	if err == nil || !kerr.IsRetriable(err) || took > 30*time.Second {
		t.Fatalf("produce with the wrong password upstream: %v after %v, want a retriable Kafka error in bounded time", err, took)
	}
	t.Logf("client error after %v: %v", took, err)
	found := false
	for _, e := range logs.All() {
		line := e.Message + " " + fmt.Sprint(e.ContextMap())
		if strings.Contains(line, "wrong-pw-7731") || strings.Contains(line, "right-pw") {
			t.Fatalf("a log line shows the password: %s", line)
		}
		if e.Message == "upstream authentication failed" && strings.Contains(line, "cluster a") && strings.Contains(line, "SCRAM-SHA-512 as ferry") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no \"upstream authentication failed\" line for cluster a; logs: %v", logs.All())
	}
	var ae *clusterauth.Error
	if err := sec.Check(ctx, 5*time.Second, c.ListenAddrs()); !errors.As(err, &ae) || !clusterauth.AuthFailed(err) {
		t.Fatalf("Check: %v", err)
	}

	os.WriteFile(pwFile, []byte("right-pw\n"), 0o600)
	testwait.Eventually(t, 20*time.Second, "a produce after the password was put right", func() error {
		return prod.ProduceSync(ctx, &kgo.Record{Value: []byte("after")}).FirstErr()
	})
}

// TestUpstreamSessionsEndUnderPipelining: a producer that keeps requests
// in flight all the time, on sessions of 1.5 s. Its upstream connections
// are still replaced (the broker accepts new ones), no produce fails, and
// the records are in the order produced, each once: nothing overtook what
// was in flight on a connection being replaced.
func TestUpstreamSessionsEndUnderPipelining(t *testing.T) {
	c, sec, _, accepted := secureKfake(t, 1500*time.Millisecond)
	_, addr := startFerry(t, c.ListenAddrs(), WithClusters(upstream.Config{Name: "a", Bootstrap: c.ListenAddrs(), Security: sec}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prod := newClient(t, addr, kgo.DefaultProduceTopic("t"), kgo.ProducerLinger(0), kgo.MaxBufferedRecords(1000))
	before := accepted.Load()
	var failed atomic.Value
	n := 0
	for start := time.Now(); time.Since(start) < 4*time.Second; n++ {
		if n%50 == 0 {
			time.Sleep(time.Millisecond) // busy all the time, not flat out
		}
		prod.Produce(ctx, &kgo.Record{Value: []byte(fmt.Sprint(n))}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Store(err)
			}
		})
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("a produce failed: %v", err)
	}
	if got := accepted.Load() - before; got < 2 {
		t.Fatalf("%d connections accepted in 4 s of 1.5 s sessions under pipelining", got)
	}
	cons := newClient(t, addr, kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for got := 0; got < n; {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d", got, n)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Value) != fmt.Sprint(got) || r.Offset != int64(got) {
				t.Fatalf("offset %d holds %s, want record %d there", r.Offset, r.Value, got)
			}
			got++
		})
	}
	t.Logf("%d records pipelined across sessions of 1.5 s; %d connections accepted", n, accepted.Load()-before)
}
