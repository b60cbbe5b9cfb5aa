package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"gopkg.in/yaml.v3"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/membership"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/proxy"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

const (
	dashboardFile = "grafana/ferry-dashboard.json"
	rulesFile     = "prometheus/ferry-alerts.yml"
	rulesTestFile = "prometheus/ferry-alerts_test.yml"
)

// metricRef matches the metric names a PromQL expression uses: Ferry's own
// and the Go runtime and process collectors Ferry registers.
var metricRef = regexp.MustCompile(`\b(?:ferry|process|go)_[a-zA-Z0-9_]+\b`)

// usedMetrics returns the metric names used in exprs, with the series
// suffixes of histograms (_bucket, _sum, _count) kept: known strips them.
func usedMetrics(exprs []string) []string {
	seen := map[string]bool{}
	for _, e := range exprs {
		// Label values and legends in quotes are not metric names.
		e = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`).ReplaceAllString(e, `""`)
		for _, m := range metricRef.FindAllString(e, -1) {
			seen[m] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// dashboardExprs returns the PromQL of every panel target and query
// variable of the dashboard, checking its frame on the way.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr string `json:"expr"`
	}
	type panel struct {
		Type    string   `json:"type"`
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var d struct {
		Title         string  `json:"title"`
		UID           string  `json:"uid"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 36 {
		t.Errorf("%s: title %q, uid %q, schemaVersion %d", dashboardFile, d.Title, d.UID, d.SchemaVersion)
	}
	var exprs []string
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		switch q := v.Query.(type) {
		case map[string]any:
			if s, ok := q["query"].(string); ok {
				exprs = append(exprs, s)
			}
		case string:
			if v.Type == "query" {
				exprs = append(exprs, q)
			}
		}
	}
	if vars["datasource"] != "datasource" || vars["instance"] != "query" {
		t.Errorf("%s: want a datasource variable and an instance query variable, have %v", dashboardFile, vars)
	}
	var rows []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				rows = append(rows, p.Title)
			} else if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					t.Errorf("%s: panel %q has a target without expr", dashboardFile, p.Title)
				}
				if !strings.Contains(tg.Expr, `instance=~"$instance"`) {
					t.Errorf("%s: panel %q: %s does not select $instance", dashboardFile, p.Title, tg.Expr)
				}
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, want := range []string{"Overview", "Client traffic", "Upstream", "Mirror", "Switchover", "Fleet", "Process"} {
		if !slices.Contains(rows, want) {
			t.Errorf("%s: no %q row (rows: %q)", dashboardFile, want, rows)
		}
	}
	return exprs
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// rules returns the alerting rules of the rules file.
func rules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rs []rule
	for _, g := range f.Groups {
		rs = append(rs, g.Rules...)
	}
	if len(rs) == 0 {
		t.Fatalf("%s: no rules", rulesFile)
	}
	return rs
}

// describingRegisterer registers on a registry and remembers the collectors,
// so that their metrics can be named through Describe even while a vector
// has no children (and Gather shows nothing of it).
type describingRegisterer struct {
	reg *prometheus.Registry
	mu  sync.Mutex
	cs  []prometheus.Collector
}

func (d *describingRegisterer) Register(c prometheus.Collector) error {
	if err := d.reg.Register(c); err != nil {
		return err
	}
	d.mu.Lock()
	d.cs = append(d.cs, c)
	d.mu.Unlock()
	return nil
}

func (d *describingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

func (d *describingRegisterer) Unregister(c prometheus.Collector) bool { return d.reg.Unregister(c) }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// names returns the metric names described by every collector registered
// and gathered from the registry.
func (d *describingRegisterer) names(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	d.mu.Lock()
	cs := slices.Clone(d.cs)
	d.mu.Unlock()
	for _, c := range cs {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for desc := range ch {
			if m := fqName.FindStringSubmatch(desc.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

// inProcessMetrics builds Ferry's components as a member wires them — the
// proxy in front of a kfake cluster, the mirror, a gossip fleet, the admin
// API with its switchover metrics — on one registry, and names every
// metric they register.
func inProcessMetrics(t *testing.T) map[string]bool {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	rec := &describingRegisterer{reg: prometheus.NewRegistry()}
	routes := routing.NewTable(routing.State{Active: "a"})
	clusters := []upstream.Config{{Name: "a", Bootstrap: kc.ListenAddrs()}}
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 9092})

	srv, err := proxy.New(
		proxy.WithClusterID("deploy-test"),
		proxy.WithClusters(clusters...),
		proxy.WithBrokerSet(fleet),
		proxy.WithRoutingTable(routes),
		proxy.WithRegisterer(rec),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatalf("proxy start: %v", err)
	}

	m, err := mirror.New(mirror.Source(kc.ListenAddrs()...), mirror.Target(kc.ListenAddrs()...), mirror.Registerer(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	fl, err := membership.New(membership.Config{Bind: "127.0.0.1:0", Profile: "local"},
		membership.Meta{NodeID: 0, Host: "127.0.0.1", Ports: []int32{9092}}, nil, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()

	failover.New(failover.Config{Routes: routes.Current, Standby: func(string) string { return "" }, Registerer: rec})

	adm, err := admin.New(
		admin.WithRoutes(routes),
		admin.WithClusters(clusters...),
		admin.WithBrokerSet(fleet),
		admin.WithGatherer(rec.reg),
		admin.WithRegisterer(rec),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	return rec.names(t)
}

// binaryMetrics builds the ferry binary, runs `ferry demo` (a member in front
// of two in-process clusters, mirroring) and names the metrics its /metrics
// serves: what the binary itself registers (ferry_build_info, the Go and
// process collectors) besides its components.
func binaryMetrics(t *testing.T) map[string]bool {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ferry")
	build := exec.Command("go", "build", "-o", bin, "../cmd/ferry")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/ferry: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	adminRe := regexp.MustCompile(`Admin API:\s+http://(\S+)/status`)
	var adminAddr string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if m := adminRe.FindStringSubmatch(sc.Text()); m != nil {
			adminAddr = m[1]
			break
		}
	}
	if adminAddr == "" {
		t.Fatalf("ferry demo printed no admin address (%v)", sc.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	typeRe := regexp.MustCompile(`(?m)^# TYPE (\S+) \S+$`)
	for _, m := range typeRe.FindAllStringSubmatch(string(body), -1) {
		names[m[1]] = true
	}
	if !names["ferry_build_info"] || !names["ferry_requests_total"] {
		t.Fatalf("/metrics of ferry demo lacks ferry_build_info or ferry_requests_total:\n%.2000s", body)
	}
	return names
}

// known reports whether name, or the histogram or summary it is a series
// of, is among the exported names.
func known(exported map[string]bool, name string) bool {
	if exported[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
			return true
		}
	}
	return false
}

// TestMetricsExist: every metric the dashboard and the alerting rules use
// is one Ferry really exports, as its components register them in-process
// and as the binary serves them on /metrics. Renaming a metric in the code
// fails this test until the dashboard and the rules follow.
func TestMetricsExist(t *testing.T) {
	dash := usedMetrics(dashboardExprs(t))
	var ruleExprs []string
	for _, r := range rules(t) {
		ruleExprs = append(ruleExprs, r.Expr)
	}
	alerts := usedMetrics(ruleExprs)
	if len(dash) < 30 || len(alerts) < 10 {
		t.Fatalf("found only %d metrics in the dashboard, %d in the rules: is the extraction broken?", len(dash), len(alerts))
	}

	exported := inProcessMetrics(t)
	for n := range binaryMetrics(t) {
		exported[n] = true
	}
	// The comparison must see metrics a vector with no children yet hides
	// from Gather (a halted partition, a lost offset): Describe names them.
	for _, must := range []string{"ferry_mirror_partition_halted", "ferry_switchover_lost_offsets", "ferry_request_duration_seconds", "ferry_fleet_members", "process_open_fds"} {
		if !exported[must] {
			t.Fatalf("the registry does not name %s: the collection of exported names is broken (have %d names)", must, len(exported))
		}
	}
	for _, n := range dash {
		if !known(exported, n) {
			t.Errorf("%s uses %s, which Ferry does not export", dashboardFile, n)
		}
	}
	for _, n := range alerts {
		if !known(exported, n) {
			t.Errorf("%s uses %s, which Ferry does not export", rulesFile, n)
		}
	}
}

// TestRulesShape: every alert has a severity, a summary and a description,
// a unit test in the rules' test file, and a line in the README.
func TestRulesShape(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules(t) {
		if r.Alert == "" {
			continue
		}
		switch r.Labels["severity"] {
		case "warning", "critical":
		default:
			t.Errorf("%s: severity %q, want warning or critical", r.Alert, r.Labels["severity"])
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: no summary or description", r.Alert)
		}
		if !regexp.MustCompile(`alertname: ` + r.Alert + `\n(?:.*\n){0,2}\s*exp_alerts:\n\s*- exp_labels`).Match(tests) {
			t.Errorf("%s: no test in %s that expects it to fire", r.Alert, rulesTestFile)
		}
		if !strings.Contains(string(readme), "`"+r.Alert+"`") {
			t.Errorf("%s: not described in README.md's \"Dashboards and alerts\"", r.Alert)
		}
	}
}

// promtool returns promtool's path (tool: CI fails without it).
func promtool(t *testing.T) string {
	t.Helper()
	return tool(t, "promtool", "apt-get install --no-install-recommends prometheus")
}

// TestPromtoolCheckRules: the rules file is valid (promtool check rules).
func TestPromtoolCheckRules(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", rulesFile, err, out)
	}
	if !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool check rules %s:\n%s", rulesFile, out)
	}
}

// TestPromtoolTestRules: each alert fires on the series of its unit test
// and not on the near misses (promtool test rules).
func TestPromtoolTestRules(t *testing.T) {
	cmd := exec.Command(promtool(t), "test", "rules", filepath.Base(rulesTestFile))
	cmd.Dir = filepath.Dir(rulesTestFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", rulesTestFile, err, out)
	}
}
