package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// metricValue is the value of the series named exactly series (name and
// labels) in a /metrics text, -1 when it is not there.
func metricValue(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// TestServePreAuthBoundsKafka: `ferry serve` with SASL/SCRAM on its
// listener, in front of real Kafka, under the attack of unauthenticated
// clients: six connections at a time each announce a 100 MiB request
// (max_request_size) and send one byte, reconnecting as soon as they are
// closed. Meanwhile a franz-go client logs in with SCRAM-SHA-512, creates
// a topic, produces a record and reads it back. The attackers' connections
// are closed (unauthenticated_frame_too_large), and ferry_buffered_bytes
// holds nothing of theirs.
func TestServePreAuthBoundsKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka")
	}
	k := kafkatest.Start(t, 1, kafkatest.WithName("preauth"))
	store := usersStore(t, t.TempDir(), map[string]string{"svc": "svc-password"})
	p := startFerry(t, "serve", "--config", writeConfig(t, fmt.Sprintf(`
cluster_id: ferry-preauth-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
admin_open: true
clusters: [{name: main, bootstrap: [%s]}]
sasl: {mechanisms: [SCRAM-SHA-512], credentials_file: %s}
`, k.Bootstrap(), store)))
	adminAddr := p.waitFor(t, adminLog, 30*time.Second)[1]
	addr := p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 90*time.Second)[1]

	// The attack, until the client is done.
	stop := make(chan struct{})
	var attackers sync.WaitGroup
	var closedSeen atomic.Int64
	for range 6 {
		attackers.Add(1)
		go func() {
			defer attackers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					continue
				}
				nc.SetDeadline(time.Now().Add(5 * time.Second))
				nc.Write(append(binary.BigEndian.AppendUint32(nil, 100<<20), 0))
				var b [1]byte
				if _, err := nc.Read(b[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					closedSeen.Add(1) // closed by Ferry, not left waiting
				}
				nc.Close()
			}
		}()
	}
	defer func() {
		close(stop)
		attackers.Wait()
	}()
	testwait.Until(t, 60*time.Second, "the attackers' first connections closed", func() bool { return closedSeen.Load() >= 6 })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	opts := []kgo.Opt{kgo.SeedBrokers(addr), kgo.SASL(scram.Auth{User: "svc", Pass: "svc-password"}.AsSha512Mechanism())}
	if _, err := kadm.NewClient(newClient(t, opts...)).CreateTopic(ctx, 1, -1, nil, "preauth"); err != nil {
		t.Fatalf("create topic through Ferry under attack: %v", err)
	}
	prod := newClient(t, append(opts, kgo.DefaultProduceTopic("preauth"))...)
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("legit")}).FirstErr(); err != nil {
		t.Fatalf("produce through Ferry under attack: %v", err)
	}
	cons := newClient(t, append(opts, kgo.ConsumeTopics("preauth"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	fs := cons.PollFetches(ctx)
	if err := fs.Err0(); err != nil {
		t.Fatalf("fetch through Ferry under attack: %v", err)
	}
	if fs.NumRecords() != 1 || string(fs.Records()[0].Value) != "legit" {
		t.Fatalf("read %d records back, want the one produced", fs.NumRecords())
	}
	t.Logf("under attack, the client logged in, created a topic, produced and read back in %v; %d attacking connections closed by then",
		time.Since(start).Round(time.Millisecond), closedSeen.Load())

	_, metrics := httpGet(t, "http://"+adminAddr+"/metrics")
	if n := metricValue(metrics, `ferry_client_connections_closed_total{reason="unauthenticated_frame_too_large"}`); n < 6 {
		t.Errorf("ferry_client_connections_closed_total{reason=unauthenticated_frame_too_large} %v, want at least 6", n)
	}
	if n := metricValue(metrics, "ferry_buffered_bytes"); n < 0 || n >= clientauth.DefaultSASLMaxReceiveSize {
		t.Errorf("ferry_buffered_bytes %v under attack, want less than one unauthenticated frame may hold (%d)", n, clientauth.DefaultSASLMaxReceiveSize)
	}
}
