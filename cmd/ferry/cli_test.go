package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

const testAdminToken = "cli-s3cret"

// cliAdmin is a real admin API over a fake switch: the switch answers what
// the test sets, and records what it was asked.
type cliAdmin struct {
	url    string
	routes *routing.Table

	mu    sync.Mutex
	calls []routing.Request
	do    func(req routing.Request) (routing.State, error)
	// connz answers GET /connections; connzAsked records what it was
	// asked.
	connz      *connstats.Report
	connzAsked []connstats.Query
}

func newCLIAdmin(t *testing.T) *cliAdmin {
	t.Helper()
	a := &cliAdmin{routes: routing.NewTable(routing.State{Active: "primary"})}
	a.do = func(req routing.Request) (routing.State, error) {
		cur := a.routes.Current()
		start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
		sw := &routing.Switch{Mode: req.Mode, From: cur.Active, To: req.To, Started: start, Finished: start.Add(1234 * time.Millisecond), Duration: "1.234s", Outcome: "switched"}
		if req.Mode == routing.Forced {
			sw.Lost = []routing.LostRange{{Topic: "audit", Partition: 2, From: 7, To: 10}, {Topic: "orders", Partition: 0, From: 100, To: 120},
				{Topic: "orders", Partition: 1, From: 40, To: routing.UnknownEnd}}
		}
		next := routing.State{Generation: cur.Generation + 1, Active: req.To, Last: sw, History: cur.History}
		if l := cur.Last; l != nil { // as routing's Switcher keeps it
			h := *l
			h.LostRanges, h.Lost = len(h.Lost), nil
			next.History = append(next.History, h)
		}
		a.routes.Advance(next)
		return a.routes.Current(), nil
	}
	srv, err := admin.New(
		admin.WithVersion("v9.9.9"),
		admin.WithNode(admin.Node{ID: 3, ClusterID: "vc", Advertised: "ferry-3:9092"}),
		admin.WithRoutes(a.routes),
		admin.WithClusters(upstream.Config{Name: "primary", Bootstrap: []string{"p:9092"}}, upstream.Config{Name: "standby", Bootstrap: []string{"s:9092"}}),
		admin.WithBrokerSet(routing.NewStaticBrokerSet(routing.Broker{NodeID: 3, Host: "ferry-3", Port: 9092})),
		admin.WithGatherer(prometheus.NewRegistry()),
		admin.WithClusterCheck(func(_ context.Context, c upstream.Config) error {
			if c.Name == "standby" {
				return errors.New("connection refused")
			}
			return nil
		}),
		admin.WithMirror(func() admin.MirrorInfo {
			return admin.MirrorInfo{Enabled: true, Running: true, Source: "primary", Target: "standby", Partitions: []mirror.PartitionStatus{
				{Topic: "orders", Partition: 0, State: mirror.StateCaughtUp, Mirrored: 120, SourceEnd: 120},
				{Topic: "orders", Partition: 1, State: mirror.StateMirroring, Mirrored: 40, SourceEnd: 57, LagRecords: 17, LagTime: 2 * time.Second},
				{Topic: "audit", Partition: 0, State: mirror.StateHalted, Err: errors.New("offset mismatch at 12")},
			}}
		}),
		admin.WithSwitch(func(_ context.Context, req routing.Request) (routing.State, error) {
			a.mu.Lock()
			a.calls = append(a.calls, req)
			do := a.do
			a.mu.Unlock()
			return do(req)
		}),
		admin.WithToken(testAdminToken),
		admin.WithConnections(func(o connstats.Query) (*connstats.Report, error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.connzAsked = append(a.connzAsked, o)
			return a.connz, nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	a.url = hs.URL
	return a
}

func (a *cliAdmin) addr() string { return strings.TrimPrefix(a.url, "http://") }

func (a *cliAdmin) requests() []routing.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]routing.Request(nil), a.calls...)
}

// runCLI runs the ferry command line in-process.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb strings.Builder
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func tokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCLISwitchover(t *testing.T) {
	t.Setenv("FERRY_ADMIN_TOKEN", "")
	a := newCLIAdmin(t)
	code, out, errs := runCLI(t, "switchover", "--admin", a.addr(), "--to", "standby", "--timeout", "45s", "--token-file", tokenFile(t, testAdminToken))
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, w := range []string{"Switched from primary to standby (planned) in 1.234s.", "generation  1", "active      standby"} {
		if !strings.Contains(out, w) {
			t.Errorf("output does not say %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "lost") {
		t.Errorf("a planned switch reports losses:\n%s", out)
	}
	if r := a.requests(); len(r) != 1 || r[0] != (routing.Request{To: "standby", Mode: routing.Planned, Timeout: 45 * time.Second}) {
		t.Fatalf("the member was asked %+v", r)
	}

	// Forced, the token from the environment, the address as a URL: the
	// lost ranges are listed.
	t.Setenv("FERRY_ADMIN_TOKEN", testAdminToken)
	code, out, errs = runCLI(t, "switchover", "--admin", a.url+"/", "--to", "primary", "--forced")
	if code != 0 || errs != "" {
		t.Fatalf("forced: exit %d, stderr %q", code, errs)
	}
	for _, w := range []string{
		"Switched from standby to primary (forced) in 1.234s.",
		"generation  2",
		"lost        offsets standby acknowledged and primary never received, in 3 partitions:",
		"    audit[2]   offsets 7 to 9 (3)\n",
		"    orders[0]  offsets 100 to 119 (20)\n",
		"    orders[1]  offsets 40 on (the old cluster's end unknown)\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("forced output does not say %q:\n%s", w, out)
		}
	}
	if r := a.requests(); len(r) != 2 || r[1].Mode != routing.Forced || r[1].Timeout != routing.DefaultSwitchTimeout {
		t.Fatalf("the member was asked %+v", r)
	}
}

func TestCLISwitchoverRefused(t *testing.T) {
	t.Setenv("FERRY_ADMIN_TOKEN", testAdminToken)
	a := newCLIAdmin(t)
	a.do = func(routing.Request) (routing.State, error) {
		return routing.State{}, &routing.Error{Reason: routing.ReasonHalted, Msg: "mirror partitions are halted", Partitions: []string{"audit[0]: offset mismatch at 12", "orders[3]: fenced"}}
	}
	code, out, errs := runCLI(t, "switchover", "--admin", a.addr(), "--to", "standby")
	if code != 1 || out != "" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	want := "ferry: switchover to standby refused (409 mirror_halted): mirror partitions are halted\n  audit[0]: offset mismatch at 12\n  orders[3]: fenced\n"
	if errs != want {
		t.Fatalf("stderr\n%s\nwant\n%s", errs, want)
	}

	// An address that is no Ferry admin API (or an older one): the
	// answer as it came.
	other := httptest.NewServer(http.NotFoundHandler())
	defer other.Close()
	code, out, errs = runCLI(t, "switchover", "--admin", other.URL, "--to", "standby")
	if code != 1 || out != "" || !strings.Contains(errs, "switchover to standby: the admin API answered 404 Not Found: 404 page not found") {
		t.Fatalf("404: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestCLISwitchoverUnauthorized(t *testing.T) {
	a := newCLIAdmin(t)
	for name, args := range map[string][]string{
		"no token":    nil,
		"wrong token": {"--token-file", tokenFile(t, "wrong")},
	} {
		t.Setenv("FERRY_ADMIN_TOKEN", "")
		code, out, errs := runCLI(t, append([]string{"switchover", "--admin", a.addr(), "--to", "standby"}, args...)...)
		if code != 1 || out != "" || !strings.Contains(errs, "refused (401 unauthorized)") || !strings.Contains(errs, "--token-file") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", name, code, out, errs)
		}
	}
	if r := a.requests(); len(r) != 0 {
		t.Fatalf("the switch ran without the token: %+v", r)
	}
	// A flag given wins over the environment.
	t.Setenv("FERRY_ADMIN_TOKEN", testAdminToken)
	if code, _, errs := runCLI(t, "switchover", "--admin", a.addr(), "--to", "standby", "--token-file", tokenFile(t, "wrong")); code != 1 || !strings.Contains(errs, "401") {
		t.Fatalf("--token-file over the environment: exit %d %s", code, errs)
	}
}

func TestCLIUnreachable(t *testing.T) {
	dead := deadAddr(t)
	for _, cmd := range [][]string{{"switchover", "--to", "standby"}, {"status"}, {"status", "--json"}, {"connections"}, {"connections", "--json"}, {"connections", "--watch"}} {
		code, out, errs := runCLI(t, append(cmd, "--admin", dead)...)
		if code != 1 || out != "" || !strings.Contains(errs, "cannot reach the admin API at http://"+dead) || !strings.Contains(errs, "connection refused") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", cmd, code, out, errs)
		}
	}
}

func TestCLIUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"switchover"}, "--to NAME is required"},
		{[]string{"switchover", "--to", "b", "--timeout", "0s"}, "--timeout 0s: must be more than 0"},
		{[]string{"switchover", "--to", "b", "--timeout", "11m"}, "at most 10m0s"},
		{[]string{"switchover", "--to", "b", "--timeout", "soon"}, "invalid value"},
		{[]string{"switchover", "--to", "b", "extra"}, "unexpected arguments"},
		{[]string{"switchover", "--to", "b", "--token-file", "/nonexistent/token"}, "--token-file: open /nonexistent/token"},
		{[]string{"status", "extra"}, "unexpected arguments"},
		{[]string{"status", "--jsn"}, "flag provided but not defined"},
		{[]string{"connections", "extra"}, "unexpected arguments"},
		{[]string{"connections", "--limit", "many"}, "invalid value"},
		{[]string{"mirror"}, "want a subcommand: restart or halt"},
		{[]string{"mirror", "stop"}, "want a subcommand: restart or halt"},
		{[]string{"mirror", "halt"}, "say what to halt: --topic T"},
		{[]string{"mirror", "halt", "--topic", "t", "--partition", "-2"}, "--partition -2: must be 0 or more"},
		{[]string{"mirror", "halt", "--halted"}, "flag provided but not defined"},
		{[]string{"mirror", "restart"}, "say what to restart"},
		{[]string{"mirror", "restart", "--halted", "--topic", "t"}, "exclude each other"},
	} {
		code, out, errs := runCLI(t, tc.args...)
		if code != 2 || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, code, out, errs, tc.want)
		}
	}
}

func TestCLIStatus(t *testing.T) {
	t.Setenv("FERRY_ADMIN_TOKEN", testAdminToken)
	a := newCLIAdmin(t)
	code, out, errs := runCLI(t, "status", "--admin", a.addr())
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, w := range []string{
		"node       3 of virtual cluster vc, advertised ferry-3:9092, version v9.9.9",
		"routing    generation 0, active primary, serving\n",
		"last       no switch yet\n",
		"clusters   primary reachable (active)\n",
		"           standby unreachable: connection refused\n",
		"mirror     running primary -> standby: 3 partitions, 1 caught up, 1 halted, max lag 17 offsets / 2.0s\n",
		"           halted audit[0]: offset mismatch at 12\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("status does not say %q:\n%s", w, out)
		}
	}

	// After a forced switch: the last switch, with what it lost.
	if code, _, errs := runCLI(t, "switchover", "--admin", a.addr(), "--to", "standby", "--forced"); code != 0 {
		t.Fatalf("switchover: %d %s", code, errs)
	}
	_, out, _ = runCLI(t, "status", "--admin", a.addr())
	for _, w := range []string{
		"routing    generation 1, active standby, serving\n",
		"last       forced switch primary -> standby at 2025-01-02T03:04:05Z, took 1.234s: switched\n",
		"orders[0]  offsets 100 to 119 (20)\n",
		"standby unreachable: connection refused (active)\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("status after the switch does not say %q:\n%s", w, out)
		}
	}

	// --json: /status as it is.
	code, out, _ = runCLI(t, "status", "--admin", a.addr(), "--json")
	var st struct {
		Routing struct {
			Generation uint32          `json:"generation"`
			Phase      string          `json:"phase"`
			Last       json.RawMessage `json:"last_switch"`
		} `json:"routing"`
		Mirror struct {
			Summary struct{ Halted int } `json:"summary"`
		} `json:"mirror"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("--json: exit %d, %v in %q", code, err, out)
	}
	if st.Routing.Generation != 1 || st.Routing.Phase != "serving" || len(st.Routing.Last) < 10 || st.Mirror.Summary.Halted != 1 {
		t.Fatalf("--json: %s", out)
	}

	// A switch back: the forced one is listed before it, its loss counted.
	if code, _, errs := runCLI(t, "switchover", "--admin", a.addr(), "--to", "primary"); code != 0 {
		t.Fatalf("switchover back: %d %s", code, errs)
	}
	_, out, _ = runCLI(t, "status", "--admin", a.addr())
	for _, w := range []string{
		"last       planned switch standby -> primary at 2025-01-02T03:04:05Z, took 1.234s: switched\n",
		"earlier    forced switch primary -> standby at 2025-01-02T03:04:05Z, took 1.234s: switched, lost 3 ranges\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("status after the switch back does not say %q:\n%s", w, out)
		}
	}
}
