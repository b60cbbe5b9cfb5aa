package proxy

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A client that starts a request and stops sending is closed once the
// request read timeout passes, and only that client.
func TestStalledRequestClosed(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithRequestReadTimeout(300*time.Millisecond))
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"half a size", []byte{0, 0}},
		{"half a request", []byte{0, 0, 0, 100, 0, 18, 0, 3, 0, 0, 0, 1}}, // 100 bytes claimed, 8 sent
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, addr)
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			expectClosed(t, c)
		})
	}
	if got := testutil.ToFloat64(s.connMetrics.closes("request_read_timeout")); got != 2 {
		t.Fatalf(`ferry_client_connections_closed_total{reason="request_read_timeout"} = %v, want 2`, got)
	}
	if got := testutil.ToFloat64(s.connMetrics.closes("idle")); got != 0 {
		t.Fatalf(`ferry_client_connections_closed_total{reason="idle"} = %v, want 0`, got)
	}
	// Everyone else is still served.
	c := dialRaw(t, addr)
	writeReq(t, c, &kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "x", ClientSoftwareVersion: "1"}, 7)
	if corr := int32(binary.BigEndian.Uint32(readResp(t, c))); corr != 7 {
		t.Fatalf("correlation ID %d, want 7", corr)
	}
}

// A client with nothing to say is closed after connections.max.idle,
// counted as idle. (TestParkedFetchIsNotIdle shows the idle time counts
// from the last answer.)
func TestIdleClientClosed(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithConnectionsMaxIdle(300*time.Millisecond))
	c := dialRaw(t, addr)
	expectClosed(t, c)
	if got := testutil.ToFloat64(s.connMetrics.closes("idle")); got != 1 {
		t.Fatalf(`ferry_client_connections_closed_total{reason="idle"} = %v, want 1`, got)
	}
}

// A connection waiting for a long-poll Fetch parked upstream is busy, not
// idle, however long the broker holds the fetch; once answered, its idle
// time starts.
func TestParkedFetchIsNotIdle(t *testing.T) {
	// The topic exists before Ferry starts, so this test's connection is
	// Ferry's only one and the close metric counts it alone.
	kf := newKfake(t, 1, kfake.SeedTopics(1, "parked"))
	// The idle timeout is long enough for the fetch to be sent after the
	// dial on a busy machine; the broker holds the fetch five times as long.
	s, addr := startFerry(t, kf.ListenAddrs(), WithConnectionsMaxIdle(time.Second))

	c := dialRaw(t, addr)
	const maxWait = 5 * time.Second
	fr := longPollFetch("parked", 12, maxWait)
	sent := time.Now()
	writeReq(t, c, fr, 42)
	b := readResp(t, c) // fails if Ferry closed the connection meanwhile
	if waited := time.Since(sent); waited < maxWait-100*time.Millisecond {
		t.Fatalf("the fetch was answered after %s; the broker should have held it for %s, so this test proves nothing", waited, maxWait)
	}
	if corr := int32(binary.BigEndian.Uint32(b)); corr != 42 {
		t.Fatalf("correlation ID %d, want 42", corr)
	}
	resp := kmsg.NewPtrFetchResponse()
	resp.SetVersion(12)
	if err := resp.ReadFrom(b[5:]); err != nil { // correlation ID, empty tags
		t.Fatal(err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 || resp.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("fetch answer %+v, want partition 0 without error", resp)
	}
	if got := testutil.ToFloat64(s.connMetrics.closes("idle")); got != 0 {
		t.Fatalf("%v connections closed as idle while a fetch was parked", got)
	}

	// Answered, the connection is idle now, and closed as such.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	expectClosed(t, c)
	if got := testutil.ToFloat64(s.connMetrics.closes("idle")); got != 1 {
		t.Fatalf(`ferry_client_connections_closed_total{reason="idle"} = %v, want 1`, got)
	}
}
