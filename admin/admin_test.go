package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

var testClusters = []upstream.Config{
	{Name: "primary", Bootstrap: []string{"127.0.0.1:1"}},
	{Name: "standby", Bootstrap: []string{"127.0.0.1:2"}},
}

// fixture is an admin server over a fake world: which clusters are
// reachable and whether the proxy started are switches the test flips.
type fixture struct {
	srv     *Server
	routes  *routing.Table
	started atomic.Bool
	down    map[string]bool
	reg     *prometheus.Registry
}

func newFixture(t *testing.T, opts ...Option) *fixture {
	t.Helper()
	f := &fixture{routes: routing.NewTable(routing.State{Active: "primary"}), down: map[string]bool{}, reg: prometheus.NewRegistry()}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_test_total", Help: "A test counter."})
	f.reg.MustRegister(c)
	c.Add(3)
	srv, err := New(append([]Option{
		WithVersion("v1.2.3"),
		WithNode(Node{ID: 7, ClusterID: "vc", Advertised: "ferry-7:9092", Listen: "0.0.0.0:9092", Admin: "0.0.0.0:9644"}),
		WithRoutes(f.routes),
		WithClusters(testClusters...),
		WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 7, Host: "ferry-7", Port: 9092})),
		WithGatherer(f.reg),
		WithRegisterer(f.reg),
		WithStarted(f.started.Load),
		WithClusterCheck(func(_ context.Context, c upstream.Config) error {
			if f.down[c.Name] {
				return errors.New("connection refused")
			}
			return nil
		}),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv.cfg.probeTTL = 0 // no caching: each assertion sees the switches
	f.srv = srv
	return f
}

func (f *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestNewValidates(t *testing.T) {
	reg := prometheus.NewRegistry()
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "h", Port: 1})
	tbl := routing.NewTable(routing.State{Active: "primary"})
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"no routes", []Option{WithClusters(testClusters...), WithBrokerSet(fleet), WithGatherer(reg)}, "routing table"},
		{"no clusters", []Option{WithRoutes(tbl), WithBrokerSet(fleet), WithGatherer(reg)}, "cluster"},
		{"no fleet", []Option{WithRoutes(tbl), WithClusters(testClusters...), WithGatherer(reg)}, "fleet"},
		{"no gatherer", []Option{WithRoutes(tbl), WithClusters(testClusters...), WithBrokerSet(fleet)}, "gatherer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.opts...)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want ErrConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestHealthz(t *testing.T) {
	f := newFixture(t)
	if code, body := f.get(t, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
}

func TestReady(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()

	// Not started: not ready, whatever the clusters.
	if err := f.srv.Ready(ctx); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "not started") {
		t.Fatalf("before start: %v", err)
	}
	if code, body := f.get(t, "/readyz"); code != 503 || !strings.Contains(body, "not started") {
		t.Fatalf("/readyz before start = %d %q", code, body)
	}

	f.started.Store(true)
	if code, body := f.get(t, "/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz after start = %d %q", code, body)
	}

	// The standby going away does not make the member unready; the active
	// one does.
	f.down["standby"] = true
	if code, _ := f.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz with the standby down = %d, want 200", code)
	}
	f.down["primary"] = true
	code, body := f.get(t, "/readyz")
	if code != 503 || !strings.Contains(body, `active cluster "primary" unreachable: connection refused`) {
		t.Fatalf("/readyz with the active cluster down = %d %q", code, body)
	}

	// After a switch to the standby, the standby's reachability counts.
	f.routes.Advance(routing.State{Generation: 1, Active: "standby"})
	code, body = f.get(t, "/readyz")
	if code != 503 || !strings.Contains(body, `"standby"`) {
		t.Fatalf("/readyz after the switch = %d %q", code, body)
	}
	delete(f.down, "standby")
	if code, _ := f.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz with the new active cluster up = %d, want 200", code)
	}
}

func TestStatus(t *testing.T) {
	f := newFixture(t)
	f.started.Store(true)
	f.down["standby"] = true

	// The method.
	st := f.srv.Status(context.Background())
	if st.Version != "v1.2.3" || st.Node.ID != 7 || st.Node.ClusterID != "vc" || !st.Ready ||
		!reflect.DeepEqual(st.Routing, RoutingStatus{Active: "primary", Phase: routing.PhaseServing, History: []routing.Switch{}}) {
		t.Fatalf("status %+v", st)
	}

	// The handler, decoded as a client would.
	code, body := f.get(t, "/status")
	if code != 200 {
		t.Fatalf("/status = %d %s", code, body)
	}
	var got struct {
		Version string `json:"version"`
		Node    struct {
			ID         int32  `json:"id"`
			Advertised string `json:"advertised"`
		} `json:"node"`
		Ready   bool `json:"ready"`
		Routing struct {
			Generation uint32 `json:"generation"`
			Active     string `json:"active"`
		} `json:"routing"`
		Clusters []struct {
			Name      string   `json:"name"`
			Bootstrap []string `json:"bootstrap"`
			Active    bool     `json:"active"`
			Reachable bool     `json:"reachable"`
			Error     string   `json:"error"`
		} `json:"clusters"`
		Fleet []struct {
			NodeID int32  `json:"node_id"`
			Host   string `json:"host"`
			Port   int32  `json:"port"`
		} `json:"fleet"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("%v in %s", err, body)
	}
	if got.Version != "v1.2.3" || got.Node.ID != 7 || got.Node.Advertised != "ferry-7:9092" || !got.Ready {
		t.Fatalf("status %s", body)
	}
	if got.Routing.Generation != 0 || got.Routing.Active != "primary" {
		t.Fatalf("routing %+v", got.Routing)
	}
	if len(got.Clusters) != 2 ||
		got.Clusters[0].Name != "primary" || !got.Clusters[0].Active || !got.Clusters[0].Reachable || got.Clusters[0].Bootstrap[0] != "127.0.0.1:1" ||
		got.Clusters[1].Name != "standby" || got.Clusters[1].Active || got.Clusters[1].Reachable || got.Clusters[1].Error != "connection refused" {
		t.Fatalf("clusters %+v", got.Clusters)
	}
	if len(got.Fleet) != 1 || got.Fleet[0].NodeID != 7 || got.Fleet[0].Host != "ferry-7" || got.Fleet[0].Port != 9092 {
		t.Fatalf("fleet %+v", got.Fleet)
	}

	// A switch shows at once.
	f.routes.Advance(routing.State{Generation: 1, Active: "standby"})
	if st := f.srv.Status(context.Background()); st.Routing.Generation != 1 || st.Routing.Active != "standby" || st.Ready || !strings.Contains(st.NotReady, "standby") {
		t.Fatalf("after switch: %+v", st)
	}
}

// TestRouting: /status/routing answers the whole routing state, the fences
// of ended generations included, which /status leaves out.
func TestRouting(t *testing.T) {
	f := newFixture(t)
	lost := []routing.LostRange{{Topic: "orders", Partition: 1, From: 40, To: 45}}
	f.routes.Advance(routing.State{Generation: 1, Active: "standby",
		Last:   &routing.Switch{Mode: routing.Forced, From: "primary", To: "standby", Outcome: "switched", Lost: lost},
		Fences: []routing.Fence{{Generation: 0, Ends: map[string][]int64{"orders": {12, 40, 7}}}}})
	code, body := f.get(t, "/status/routing")
	var got routing.State
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil {
		t.Fatalf("/status/routing = %d %v: %s", code, err, body)
	}
	if got.Generation != 1 || got.Active != "standby" || got.Phase != routing.PhaseServing || got.Last == nil || fmt.Sprint(got.Last.Lost) != fmt.Sprint(lost) ||
		len(got.Fences) != 1 || got.Fences[0].Generation != 0 || fmt.Sprint(got.Fences[0].Ends) != "map[orders:[12 40 7]]" {
		t.Fatalf("/status/routing: %s", body)
	}
	if _, body := f.get(t, "/status"); strings.Contains(body, "fences") {
		t.Fatalf("/status carries the fences: %s", body)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t)
	code, body := f.get(t, "/metrics")
	if code != 200 || !strings.Contains(body, "ferry_test_total 3") || !strings.Contains(body, "# HELP ferry_test_total A test counter.") {
		t.Fatalf("/metrics = %d %q", code, body)
	}
}

func TestOnlyGet(t *testing.T) {
	f := newFixture(t)
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/status", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /status = %d", rec.Code)
	}
}

// TestServeClose runs the real listener: Serve answers, Close ends Serve
// with nil and is safe twice.
func TestServeClose(t *testing.T) {
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.srv.Serve(ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok\n" {
		t.Fatalf("/healthz over TCP = %d %q", resp.StatusCode, b)
	}
	if err := f.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
	if err := f.srv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestDialCheck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close()
	check := DialCheck(time.Second)
	if err := check(context.Background(), upstream.Config{Name: "a", Bootstrap: []string{deadAddr, ln.Addr().String()}}); err != nil {
		t.Fatalf("one live bootstrap server: %v", err)
	}
	if err := check(context.Background(), upstream.Config{Name: "b", Bootstrap: []string{deadAddr}}); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("no live bootstrap server: %v", err)
	}
}

// TestProbeCache: a burst of probes dials each cluster once per TTL.
func TestProbeCache(t *testing.T) {
	var dials atomic.Int32
	now := time.Unix(1000, 0)
	srv, err := New(
		WithRoutes(routing.NewTable(routing.State{Active: "primary"})),
		WithClusters(testClusters...),
		WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "h", Port: 1})),
		WithGatherer(prometheus.NewRegistry()),
		WithClusterCheck(func(context.Context, upstream.Config) error { dials.Add(1); return nil }),
	)
	if err != nil {
		t.Fatal(err)
	}
	srv.cfg.now = func() time.Time { return now }
	for i := 0; i < 10; i++ {
		if err := srv.Ready(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d checks for 10 probes within the TTL, want 1", n)
	}
	now = now.Add(3 * time.Second)
	srv.Ready(context.Background())
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d checks after the TTL, want 2", n)
	}
}
