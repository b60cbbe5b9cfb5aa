package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// startProxy runs a Ferry in front of an in-process cluster and returns it
// and its address.
func startProxy(t *testing.T) (*proxy.Server, string) {
	t.Helper()
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	p, err := proxy.New(
		proxy.WithClusterID("vc"),
		proxy.WithClusters(upstream.Config{Name: "primary", Bootstrap: kf.ListenAddrs()}),
		proxy.WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: port})),
		proxy.WithLogger(zaptest.NewLogger(t)),
		proxy.WithRegisterer(prometheus.NewRegistry()),
		proxy.WithLanes(1),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	go p.ServeLane(ln, 0)
	return p, ln.Addr().String()
}

// connectClient connects a client with opts through the proxy at addr,
// closed at the test's end, and waits for its first answer, so that the
// proxy lists it.
func connectClient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).BrokerMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	return cl
}

// GET /connections lists the clients connected through the proxy, as
// Connections returns them, with the query's filters and sort.
func TestConnections(t *testing.T) {
	p, addr := startProxy(t)
	f := newFixture(t, WithConnections(p.Connz))
	cl := connectClient(t, addr, kgo.ClientID("http-client"), kgo.SoftwareNameAndVersion("admin-test", "0.1"))

	code, body := f.get(t, "/connections?client_id=http-client&sort=bytes_out&limit=10")
	if code != http.StatusOK {
		t.Fatalf("GET /connections: %d %s", code, body)
	}
	var cz connstats.Report
	if err := json.Unmarshal([]byte(body), &cz); err != nil {
		t.Fatal(err)
	}
	if cz.State != "open" || cz.Sort != "bytes_out" || cz.Limit != 10 || cz.Matched == 0 || len(cz.Connections) != cz.Matched {
		t.Fatalf("GET /connections: %s", body)
	}
	c := cz.Connections[0]
	if c.ClientID != "http-client" || c.SoftwareName != "admin-test" || c.SoftwareVersion != "0.1" || c.Cluster != "primary" || c.Requests["ApiVersions"] == 0 || c.BytesOut == 0 {
		t.Fatalf("connection %s", body)
	}
	for _, w := range []string{`"client_id": "http-client"`, `"bytes_in": `, `"requests": {`, `"latency_p99_ms": `, `"in_flight": `, `"lane": 0`} {
		if !strings.Contains(body, w) {
			t.Errorf("/connections does not say %s:\n%s", w, body)
		}
	}
	direct, err := f.srv.Connections(connstats.Query{ClientID: "http-client"})
	if err != nil || direct.Matched != cz.Matched {
		t.Fatalf("Connections: %+v, %v; HTTP matched %d", direct, err, cz.Matched)
	}

	cl.Close()
	testwait.Eventually(t, 10*time.Second, "closed connection reported", func() error {
		_, body = f.get(t, "/connections?state=closed&client_id=http-client")
		if !strings.Contains(body, `"close_reason": "client_closed"`) {
			return fmt.Errorf("/connections?state=closed: %s", body)
		}
		return nil
	})

	for _, q := range []string{"sort=size", "limit=many", "offset=-1", "state=later"} {
		if code, body := f.get(t, "/connections?"+q); code != http.StatusBadRequest {
			t.Errorf("GET /connections?%s: %d %s, want 400", q, code, body)
		}
	}
}

func TestConnectionsNotConfigured(t *testing.T) {
	f := newFixture(t)
	if code, _ := f.get(t, "/connections"); code != http.StatusNotFound {
		t.Fatalf("GET /connections without WithConnections: %d, want 404", code)
	}
}

// getAs sends GET path from remote with the Authorization header auth
// (none when empty).
func (f *fixture) getAs(t *testing.T, path, auth string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	return rec
}

// A closed connection's record as the proxy keeps it after a failed login.
func closedLogin() *connstats.Report {
	closed := time.Now()
	return &connstats.Report{State: "closed", Sort: "id", Matched: 1, Limit: 100, Connections: []connstats.Info{{
		ID: 4, Remote: "10.1.2.3:50000", ClientID: "app", Principal: "User:alice", ClosedAt: &closed,
		CloseReason: "auth_failed", CloseError: "SCRAM-SHA-512: unknown user mallory", Requests: map[string]uint64{},
	}}}
}

// With a token configured, GET /connections without it answers the
// records with the principal, client address and close error emptied,
// and says so; the remote and principal filters, which would tell them as
// well, need the token. With the token, or admin_public_read, or no token
// configured at all, they are shown.
func TestConnectionsRedactedWithoutToken(t *testing.T) {
	connz := func(o connstats.Query) (*connstats.Report, error) {
		cz := closedLogin()
		if !strings.Contains(cz.Connections[0].Principal, o.Principal) || !strings.Contains(cz.Connections[0].Remote, o.Remote) {
			cz.Connections, cz.Matched = []connstats.Info{}, 0
		}
		return cz, nil
	}
	personal := []string{"10.1.2.3", "alice", "mallory"}
	shows := func(t *testing.T, what string, rec *httptest.ResponseRecorder, want bool) {
		t.Helper()
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", what, rec.Code, rec.Body)
		}
		var ans ConnectionsAnswer
		if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil || len(ans.Connections) != 1 {
			t.Fatalf("%s: %v %s", what, err, rec.Body)
		}
		c := ans.Connections[0]
		if c.ClientID != "app" || c.CloseReason != "auth_failed" {
			t.Errorf("%s: the fields that are no personal data are gone: %s", what, rec.Body)
		}
		for _, p := range personal {
			if got := strings.Contains(rec.Body.String(), p); got != want {
				t.Errorf("%s: shows %q: %v, want %v:\n%s", what, p, got, want, rec.Body)
			}
		}
		if redacted := strings.Join(ans.Redacted, ","); (redacted == "remote,principal,close_error") != !want {
			t.Errorf("%s: redacted %q", what, redacted)
		}
	}

	f := newFixture(t, WithConnections(connz), WithToken(testToken))
	shows(t, "no token", f.getAs(t, "/connections?state=closed", ""), false)
	shows(t, "the token", f.getAs(t, "/connections?state=closed", "Bearer "+testToken), true)
	shows(t, "the token, filtered", f.getAs(t, "/connections?state=closed&principal=alice", "Bearer "+testToken), true)
	for _, q := range []string{"principal=alice", "remote=10.1.2.3", "principal=User:"} {
		if rec := f.getAs(t, "/connections?state=closed&"+q, ""); rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), "10.1.2.3:") {
			t.Errorf("filter %s without the token: %d %s, want 401", q, rec.Code, rec.Body)
		}
	}
	if rec := f.getAs(t, "/connections?state=closed", "Bearer wrong"); rec.Code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d %s, want 401", rec.Code, rec.Body)
	}

	pub := newFixture(t, WithConnections(connz), WithToken(testToken), WithPublicRead(true))
	shows(t, "admin_public_read", pub.getAs(t, "/connections?state=closed", ""), true)
	open := newFixture(t, WithConnections(connz))
	shows(t, "no token configured", open.getAs(t, "/connections?state=closed&principal=alice", ""), true)
}
