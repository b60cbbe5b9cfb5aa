package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/testwait"
)

func testConnz() *connstats.Report {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	closed := now.Add(-30 * time.Second)
	return &connstats.Report{Now: now, State: "all", Sort: "bytes_out", Open: 1, Matched: 2, Limit: 10, Connections: []connstats.Info{
		{ID: 7, Remote: "10.0.0.7:51234", Lane: 1, Cluster: "primary", ClientID: "orders-svc", SoftwareName: "kgo", SoftwareVersion: "v1.22.3", Principal: "User:orders",
			ConnectedAt: now.Add(-90 * time.Second), IdleSeconds: 0, InFlight: 2, BytesIn: 2048, BytesOut: 5 << 20,
			Requests: map[string]uint64{"Produce": 40, "Metadata": 2}, RequestsTotal: 42, ErrorsTotal: 1, Errors: map[string]uint64{"NOT_LEADER_OR_FOLLOWER": 1},
			LatencyP50Ms: 0.5, LatencyP99Ms: 12.25, LatencySamples: 42},
		{ID: 3, Remote: "10.0.0.3:40000", Lane: 0, ClientID: "", ConnectedAt: now.Add(-time.Hour), ClosedAt: &closed, CloseReason: "idle",
			IdleSeconds: 600, BytesIn: 100, BytesOut: 200, RequestsTotal: 2, Requests: map[string]uint64{"ApiVersions": 2}},
	}}
}

// ferry connections prints a member's connections as a table, passing the
// sort, limit and filters on; --json prints what the member answered.
func TestCLIConnections(t *testing.T) {
	t.Setenv(adminTokenEnv, testAdminToken) // the member has a token: principals and addresses need it
	a := newCLIAdmin(t)
	a.connz = testConnz()
	code, out, errs := runCLI(t, "connections", "--admin", a.addr(), "--sort", "bytes_out", "--limit", "10", "--state", "all", "--client-id", "svc")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	lines := strings.Split(out, "\n")
	if !strings.Contains(lines[0], "1 open, 2 all matched, showing 1-2, by bytes_out") {
		t.Errorf("summary line %q", lines[0])
	}
	for _, w := range [][]string{
		{"ID", "REMOTE", "LANE", "CLUSTER", "CLIENT ID", "SOFTWARE", "PRINCIPAL", "AGE", "IDLE", "IN", "OUT", "REQS", "ERRS", "INFL", "P50", "P99", "CLOSED"},
		{"7", "10.0.0.7:51234", "1", "primary", "orders-svc", "kgo/v1.22.3", "User:orders", "1m30s", "0s", "2.0KiB", "5.0MiB", "42", "1", "2", "500µs", "12.2ms", "-"},
		{"3", "10.0.0.3:40000", "0", "-", "-", "-", "-", "59m30s", "10m0s", "100B", "200B", "2", "0", "0", "-", "-", "idle 30s ago"},
	} {
		if !containsRow(out, w) {
			t.Errorf("table has no row %q:\n%s", w, out)
		}
	}
	a.mu.Lock()
	asked := a.connzAsked[len(a.connzAsked)-1]
	a.mu.Unlock()
	if want := (connstats.Query{Sort: "bytes_out", Limit: 10, State: "all", ClientID: "svc"}); asked != want {
		t.Errorf("asked %+v, want %+v", asked, want)
	}

	code, out, _ = runCLI(t, "connections", "--admin", a.addr(), "--json")
	var cz connstats.Report
	if err := json.Unmarshal([]byte(out), &cz); code != 0 || err != nil || len(cz.Connections) != 2 || cz.Connections[0].Requests["Produce"] != 40 {
		t.Fatalf("--json: exit %d, %v: %s", code, err, out)
	}

	a.mu.Lock()
	a.connz = &connstats.Report{State: "open", Sort: "id", Connections: []connstats.Info{}}
	a.mu.Unlock()
	if code, out, _ = runCLI(t, "connections", "--admin", a.addr()); code != 0 || !strings.Contains(out, "no connections") {
		t.Errorf("no connections: exit %d, %q", code, out)
	}
}

// Without the admin token of a member that has one, ferry connections
// shows the connections without their addresses and principals, and says
// how to see them; with --token-file it shows them; filtering on them
// without the token is refused with the same hint.
func TestCLIConnectionsWithoutToken(t *testing.T) {
	t.Setenv(adminTokenEnv, "")
	a := newCLIAdmin(t)
	a.connz = testConnz()
	code, out, errs := runCLI(t, "connections", "--admin", a.addr(), "--state", "all")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if !containsRow(out, []string{"7", "-", "1", "primary", "orders-svc", "kgo/v1.22.3", "-", "1m30s", "0s", "2.0KiB", "5.0MiB", "42", "1", "2", "500µs", "12.2ms", "-"}) ||
		strings.Contains(out, "10.0.0.7") || strings.Contains(out, "User:orders") ||
		!strings.Contains(out, "remote, principal, close_error hidden: give the admin token with --token-file FILE or $FERRY_ADMIN_TOKEN") {
		t.Fatalf("without the token:\n%s", out)
	}
	code, out, _ = runCLI(t, "connections", "--admin", a.addr(), "--state", "all", "--token-file", tokenFile(t, testAdminToken))
	if code != 0 || !strings.Contains(out, "10.0.0.7:51234") || !strings.Contains(out, "User:orders") || strings.Contains(out, "hidden") {
		t.Fatalf("with --token-file: exit %d:\n%s", code, out)
	}
	code, _, errs = runCLI(t, "connections", "--admin", a.addr(), "--principal", "orders")
	if code != 1 || !strings.Contains(errs, "401 unauthorized") || !strings.Contains(errs, "--token-file FILE or $FERRY_ADMIN_TOKEN") {
		t.Fatalf("--principal without the token: exit %d, stderr %q", code, errs)
	}
}

// --watch redraws until interrupted, then exits 0.
func TestCLIConnectionsWatch(t *testing.T) {
	a := newCLIAdmin(t)
	a.connz = testConnz()
	defer func(d time.Duration) { watchEvery = d }(watchEvery)
	watchEvery = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuilder
	var errb strings.Builder
	done := make(chan int)
	go func() { done <- run(ctx, []string{"connections", "--admin", a.addr(), "--watch"}, &out, &errb) }()
	testwait.Eventually(t, 10*time.Second, "redrawn three times", func() error {
		if s := out.String(); strings.Count(s, "\x1b[H\x1b[2J") < 3 {
			return fmt.Errorf("%q", s)
		}
		return nil
	})
	cancel()
	if code := <-done; code != 0 || errb.String() != "" {
		t.Fatalf("interrupted --watch: exit %d, stderr %q", code, errb.String())
	}
}

// containsRow reports whether out has a line with the fields in order,
// separated by spaces.
func containsRow(out string, fields []string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(l), " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}

type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
