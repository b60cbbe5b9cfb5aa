package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// Raw frames a client could send, each refused for one reason.
var (
	oversizedFrame = []byte{0, 0x10, 0, 0, 0, 3, 0, 1}                             // claims 1 MiB
	unknownKey     = []byte{0, 0, 0, 10, 0x03, 0xe8, 0, 0, 0, 0, 0, 1, 0xff, 0xff} // key 1000
	interBroker    = []byte{0, 0, 0, 11, 0, 4, 0, 5, 0, 0, 0, 1, 0xff, 0xff, 0}    // LeaderAndIsr
	metadataV99    = []byte{0, 0, 0, 10, 0, 3, 0, 99, 0, 0, 0, 1, 0xff, 0xff}      // a version no one has
	garbageBody    = append([]byte{0, 0, 0, 17, 0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 0}, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)
	apiVersionsNew = []byte{0, 0, 0, 11, 0, 18, 0, 127, 0, 0, 0, 9, 0xff, 0xff, 0} // ApiVersions v127
)

// Every kind of refusal moves ferry_refusals_total for its API and reason,
// whether it closes the connection or is answered.
func TestEveryRefusalCounted(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithMaxRequestSize(64<<10))
	closes := []struct {
		send        []byte
		api, reason string
	}{
		{oversizedFrame, "unknown", reasonBadFrame},
		{unknownKey, "unknown", reasonUnknownKey},
		{interBroker, "LeaderAndISR", reasonUnknownKey},
		{metadataV99, "Metadata", reasonUnsupportedVersion},
		{garbageBody, "Metadata", reasonMalformedBody},
	}
	for _, tc := range closes {
		c := dialRaw(t, addr)
		if _, err := c.Write(tc.send); err != nil {
			t.Fatal(err)
		}
		expectClosed(t, c)
		if got := refusals(s, tc.api, tc.reason); got != 1 {
			t.Errorf("ferry_refusals_total{api=%q,reason=%q} = %v, want 1", tc.api, tc.reason, got)
		}
	}
	if got := testutil.ToFloat64(s.metrics.badFrames); got != 1 {
		t.Errorf("ferry_bad_frames_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.connMetrics.closes("refused")); got != 4 {
		t.Errorf("ferry_client_connections_closed_total{reason=refused} = %v, want 4", got)
	}

	// SaslAuthenticate with no handshake closes the connection.
	c := dialRaw(t, addr)
	auth := kmsg.NewPtrSASLAuthenticateRequest()
	auth.SASLAuthBytes = []byte("\x00user\x00pass")
	writeReq(t, c, auth, 1)
	expectClosed(t, c)
	if got := refusals(s, "SASLAuthenticate", reasonSASL); got != 1 {
		t.Errorf("SaslAuthenticate refusals = %v, want 1", got)
	}

	// Answered: ApiVersions at a version Ferry does not know.
	c = dialRaw(t, addr)
	c.Write(apiVersionsNew)
	readResp(t, c)
	if got := refusals(s, "ApiVersions", reasonUnsupportedVersion); got != 1 {
		t.Errorf("ApiVersions v127 refusals = %v, want 1", got)
	}

	// Answered in the broker's place: the cluster is gone.
	kf.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.SetVersion(4)
	topic := kmsg.NewCreateTopicsRequestTopic()
	topic.Topic, topic.NumPartitions, topic.ReplicationFactor = "gone", 1, 1
	req.Topics = append(req.Topics, topic)
	writeReq(t, c, req, 2)
	readResp(t, c)
	if got := refusals(s, "CreateTopics", reasonUpstream); got != 1 {
		t.Errorf("upstream refusals = %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.metrics.byKey[kmsg.CreateTopics].upFailed); got != 1 {
		t.Errorf("ferry_upstream_failures_total{api=CreateTopics} = %v, want 1", got)
	}
}

// A client configured for SASL is told the server offers no mechanism,
// and the connection stays usable.
func TestSASLHandshakeAnswered(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs())
	c := dialRaw(t, addr)
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.SetVersion(1)
	hs.Mechanism = "SCRAM-SHA-256"
	writeReq(t, c, hs, 3)
	b := readResp(t, c)
	resp := kmsg.NewPtrSASLHandshakeResponse()
	resp.SetVersion(1)
	if err := resp.ReadFrom(b[4:]); err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != kerr.UnsupportedSaslMechanism.Code || len(resp.SupportedMechanisms) != 0 {
		t.Fatalf("handshake answer: code %d, mechanisms %v; want UNSUPPORTED_SASL_MECHANISM and none", resp.ErrorCode, resp.SupportedMechanisms)
	}
	if got := refusals(s, "SASLHandshake", reasonSASL); got != 1 {
		t.Fatalf("SaslHandshake refusals = %v, want 1", got)
	}
	writeReq(t, c, kmsg.NewPtrApiVersionsRequest(), 4)
	av := kmsg.NewPtrApiVersionsResponse()
	if err := av.ReadFrom(readResp(t, c)[4:]); err != nil || av.ErrorCode != 0 {
		t.Fatalf("ApiVersions after the handshake: %v, code %d", err, av.ErrorCode)
	}

	// franz-go with SASL says why it cannot connect.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cl := newClient(t, addr, kgo.SASL(plain.Auth{User: "u", Pass: "p"}.AsMechanism()), kgo.RequestRetries(0))
	_, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	if !errors.Is(err, kerr.UnsupportedSaslMechanism) {
		t.Fatalf("franz-go with SASL: %v, want UNSUPPORTED_SASL_MECHANISM", err)
	}
}

// 3,000 bad connections write a few log lines, not thousands: one per
// reason per interval, and the connection's close only at debug.
func TestBadConnectionsLogBounded(t *testing.T) {
	kf := newKfake(t, 1)
	core, logs := observer.New(zapcore.InfoLevel)
	s, addr := startFerry(t, kf.ListenAddrs(), WithLogger(zap.New(core)), WithMaxRequestSize(64<<10))
	sends := [][]byte{oversizedFrame, unknownKey, garbageBody}
	const n = 3000
	start := time.Now()
	var wg sync.WaitGroup
	var leftOpen atomic.Bool // once one is, the rest are not waited for
	jobs := make(chan []byte)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for send := range jobs {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				c.SetDeadline(time.Now().Add(10 * time.Second))
				c.Write(send)
				if leftOpen.Load() {
					c.Close()
					continue
				}
				// Ferry closes it: EOF or a reset, not an answer and
				// not the deadline.
				var b [1]byte
				if n, err := c.Read(b[:]); n > 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
					if !leftOpen.Swap(true) {
						t.Errorf("frame % x: read %d bytes, %v; want the connection closed", send, n, err)
					}
				}
				c.Close()
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- sends[i%len(sends)]
	}
	close(jobs)
	wg.Wait()
	if leftOpen.Load() {
		t.FailNow()
	}
	elapsed := time.Since(start)

	total := refusals(s, "unknown", reasonBadFrame) + refusals(s, "unknown", reasonUnknownKey) + refusals(s, "Metadata", reasonMalformedBody)
	if total != n {
		t.Fatalf("refusals counted %v, want %d", total, n)
	}
	intervals := int(elapsed/s.cfg.refusalLogEvery) + 1
	if got, limit := logs.Len(), len(sends)*intervals; got > limit || got == 0 {
		for _, e := range logs.All() {
			t.Logf("%s %v", e.Message, e.ContextMap())
		}
		t.Fatalf("%d bad connections in %v wrote %d log lines; want 1 to %d (one per reason per interval)", n, elapsed, got, limit)
	}
	for _, reason := range []string{reasonBadFrame, reasonUnknownKey, reasonMalformedBody} {
		if logs.FilterField(zap.String("reason", reason)).Len() == 0 {
			t.Errorf("no log line for reason %s", reason)
		}
	}
}
