package proxy

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func writeReq(t *testing.T, c net.Conn, req kmsg.Request, corr int32) {
	t.Helper()
	if err := rawSend(c, req, corr); err != nil {
		t.Fatal(err)
	}
}

// rawSend writes req with correlation ID corr.
func rawSend(c net.Conn, req kmsg.Request, corr int32) error {
	b := protocol.AppendSize(nil)
	b = protocol.AppendRequestHeader(b, req, corr, "raw")
	b = req.AppendTo(b)
	protocol.FinishSize(b, 0)
	_, err := c.Write(b)
	return err
}

func readResp(t *testing.T, c net.Conn) []byte {
	t.Helper()
	b, err := rawFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rawFrame reads one answer frame (header included, size not).
func rawFrame(c net.Conn) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, err
	}
	return b, nil
}

// expectClosed asserts the server closed the connection.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	var b [1]byte
	if n, err := c.Read(b[:]); err == nil {
		t.Fatalf("read %d bytes; want the connection closed", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("connection left open; want it closed")
	}
}

func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	kf := newKfake(t, 1)
	reg := prometheus.NewRegistry()
	s, addr := startFerry(t, kf.ListenAddrs(), WithMaxRequestSize(64<<10), WithRegisterer(reg))
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"oversized frame", []byte{0, 0x10, 0, 0, 0, 3, 0, 1}}, // claims 1 MiB
		{"negative size", []byte{0xff, 0xff, 0xff, 0xfe}},      // -2
		{"malformed header", []byte{0, 0, 0, 4, 0, 3, 0, 1}},   // 4-byte header
		{"unknown API key", []byte{0, 0, 0, 10, 0x03, 0xe8, 0, 0, 0, 0, 0, 1, 0xff, 0xff}},
		{"inter-broker API", []byte{0, 0, 0, 11, 0, 4, 0, 5, 0, 0, 0, 1, 0xff, 0xff, 0}}, // LeaderAndIsr
		{"metadata version too new", []byte{0, 0, 0, 10, 0, 3, 0, 99, 0, 0, 0, 1, 0xff, 0xff}},
		{"garbage body", append([]byte{0, 0, 0, 17, 0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 0}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, addr)
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			expectClosed(t, c)
		})
	}
	if got := testutil.ToFloat64(s.metrics.badFrames); got != 3 {
		t.Fatalf("ferry_bad_frames_total = %v, want 3 (oversized, negative, malformed header)", got)
	}
	// Everyone else is still served.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(newClient(t, addr)).BrokerMetadata(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestApiVersionsTooNewAnsweredAtV0(t *testing.T) {
	kf := newKfake(t, 1)
	_, addr := startFerry(t, kf.ListenAddrs())
	c := dialRaw(t, addr)
	// ApiVersions v127, which nobody knows; header v2 as a flexible client
	// would send it.
	c.Write([]byte{0, 0, 0, 11, 0, 18, 0, 127, 0, 0, 0, 9, 0xff, 0xff, 0})
	b := readResp(t, c)
	if corr := int32(binary.BigEndian.Uint32(b)); corr != 9 {
		t.Fatalf("correlation ID %d", corr)
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(0)
	if err := resp.ReadFrom(b[4:]); err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != kerr.UnsupportedVersion.Code {
		t.Fatalf("error code %d, want UNSUPPORTED_VERSION", resp.ErrorCode)
	}
	if len(resp.ApiKeys) != 1 || resp.ApiKeys[0].ApiKey != 18 || resp.ApiKeys[0].MaxVersion < 3 {
		t.Fatalf("api keys %+v, want ApiVersions' range", resp.ApiKeys)
	}
}

func TestApiVersionsAdvertisesOnlyClientAPIs(t *testing.T) {
	kf := newKfake(t, 1)
	s, _ := startFerry(t, kf.ListenAddrs())
	vs := s.Versions()
	for _, k := range []kmsg.Key{kmsg.LeaderAndISR, kmsg.StopReplica, kmsg.UpdateMetadata, kmsg.WriteTxnMarkers, kmsg.BrokerRegistration, kmsg.AllocateProducerIDs, kmsg.SASLAuthenticate} {
		if _, ok := vs[int16(k)]; ok {
			t.Errorf("%s advertised to clients", kmsg.NameForKey(int16(k)))
		}
	}
	for _, k := range []kmsg.Key{kmsg.Produce, kmsg.Fetch, kmsg.Metadata, kmsg.JoinGroup, kmsg.InitProducerID, kmsg.CreateTopics, kmsg.SASLHandshake} {
		if _, ok := vs[int16(k)]; !ok {
			t.Errorf("%s not advertised", kmsg.NameForKey(int16(k)))
		}
	}
}

// Pipelined requests are answered in the order they were sent, whatever
// order their answers are ready in.
func TestPipelinedRequestsAnsweredInOrder(t *testing.T) {
	kf := newKfake(t, 3)
	_, addr := startFerry(t, kf.ListenAddrs())
	c := dialRaw(t, addr)
	for i := int32(0); i < 30; i++ {
		switch i % 3 {
		case 0:
			writeReq(t, c, &kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "x", ClientSoftwareVersion: "1"}, i)
		case 1:
			writeReq(t, c, &kmsg.MetadataRequest{Version: 12}, i)
		case 2:
			fr := kmsg.NewPtrFetchRequest()
			fr.Version, fr.MaxWaitMillis, fr.MinBytes = 11, 50, 1
			writeReq(t, c, fr, i)
		}
	}
	for i := int32(0); i < 30; i++ {
		b := readResp(t, c)
		if corr := int32(binary.BigEndian.Uint32(b)); corr != i {
			t.Fatalf("response %d has correlation ID %d", i, corr)
		}
	}
}

func TestAcksZeroProduce(t *testing.T) {
	kf := newKfake(t, 3)
	_, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(newClient(t, addr)).CreateTopic(ctx, 3, 1, nil, "noack"); err != nil {
		t.Fatal(err)
	}
	prod := newClient(t, addr, kgo.DefaultProduceTopic("noack"), kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
	for i := 0; i < 100; i++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// acks=0 gets no answer; the records still land.
	adm := kadm.NewClient(newClient(t, kf.ListenAddrs()[0]))
	for {
		ends, err := adm.ListEndOffsets(ctx, "noack")
		if err != nil {
			t.Fatal(err)
		}
		total := int64(0)
		ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
		if total == 100 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of 100 acks=0 records landed", total)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestUnreachableClusterIsAnErrorNotACrash(t *testing.T) {
	s, err := New(WithClusterID("x"), WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"127.0.0.1:1"}}), WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1})))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = s.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("Start: %v; want an unreachable-cluster error", err)
	}
}

func TestConfigErrors(t *testing.T) {
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "h", Port: 1})
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"no cluster ID", []Option{WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"x:1"}}), WithBrokerSet(fleet)}, "cluster ID"},
		{"no clusters", []Option{WithClusterID("c"), WithBrokerSet(fleet)}, "physical cluster"},
		{"no fleet", []Option{WithClusterID("c"), WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"x:1"}})}, "fleet"},
		{"duplicate cluster", []Option{WithClusterID("c"), WithBrokerSet(fleet), WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"x:1"}}, upstream.Config{Name: "a", Bootstrap: []string{"y:1"}})}, "named twice"},
		{"tiny max request", []Option{WithClusterID("c"), WithBrokerSet(fleet), WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"x:1"}}), WithMaxRequestSize(10)}, "max request size"},
		{"no idle timeout", []Option{WithClusterID("c"), WithBrokerSet(fleet), WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"x:1"}}), WithConnectionsMaxIdle(0)}, "connections max idle 0s must be positive"},
		{"negative request read timeout", []Option{WithClusterID("c"), WithBrokerSet(fleet), WithClusters(upstream.Config{Name: "a", Bootstrap: []string{"x:1"}}), WithRequestReadTimeout(-time.Second)}, "request read timeout -1s must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// closedAddr is a loopback address nothing listens on (a listener's,
// closed).
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestStandbyDownStillServes: a standby that cannot be reached at start
// does not keep clients from the active cluster: Ferry serves once the
// active one answers, and produce and consume work through it.
func TestStandbyDownStillServes(t *testing.T) {
	c := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	deadAddr := closedAddr(t)
	_, addr := startFerry(t, c.ListenAddrs(),
		WithClusters(upstream.Config{Name: "a", Bootstrap: c.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: []string{deadAddr}}),
		WithStandbyWait(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr, kgo.DefaultProduceTopic("t"), kgo.ConsumeTopics("t"))
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce with the standby down: %v", err)
	}
	fs := cl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil || fs.NumRecords() != 1 || string(fs.Records()[0].Value) != "v" {
		t.Fatalf("consume with the standby down: %v, %d records", err, fs.NumRecords())
	}
}
