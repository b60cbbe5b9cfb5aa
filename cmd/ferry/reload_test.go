package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/proxy"
)

// fakeTarget records what a reload applied.
type fakeTarget struct {
	settings   []proxy.Settings
	filters    [][2]Selection
	switching  bool
	refuseWith error
	retired    []string
}

func (f *fakeTarget) setProxySettings(st proxy.Settings) error {
	if f.refuseWith != nil {
		return f.refuseWith
	}
	f.settings = append(f.settings, st)
	return nil
}

func (f *fakeTarget) retireCluster(name string) error {
	if f.refuseWith != nil {
		return f.refuseWith
	}
	f.retired = append(f.retired, name)
	return nil
}

func (f *fakeTarget) setMirrorFilters(topics, groups Selection) (bool, error) {
	if f.switching {
		return false, nil
	}
	f.filters = append(f.filters, [2]Selection{topics, groups})
	return true, nil
}

// TestReloadLimitsAndFilters: a reload hands the connection limits and
// timeouts to the proxy and the filters to the mirror; filters changed
// during a switchover are not applied and are tried again at the next
// reload; the lame-duck and shutdown timeouts in force follow the file.
func TestReloadLimitsAndFilters(t *testing.T) {
	tg := &fakeTarget{switching: true}
	r, path, logs := testReloader(t, minimal, tg)
	write := func(text string) { t.Helper(); rewriteConfig(t, path, text) }

	write(minimal + `
max_connections: 500
max_connections_per_ip: 20
max_connections_per_ip_overrides: {"10.1.2.3": 200}
connections_max_idle: 2m
client_write_timeout: 20s
lame_duck_duration: 30s
shutdown_timeout: 5s
mirror:
  topics: {include: ["orders.*"]}
`)
	applied, restart := r.reload(nil)
	want := []string{"client_write_timeout", "connections_max_idle", "lame_duck_duration", "max_connections",
		"max_connections_per_ip", "max_connections_per_ip_overrides", "shutdown_timeout"}
	if !slices.Equal(applied, want) || len(restart) != 0 {
		t.Fatalf("applied %v, restart %v; want applied %v", applied, restart, want)
	}
	if len(tg.settings) != 1 {
		t.Fatalf("proxy settings set %d times", len(tg.settings))
	}
	st := tg.settings[0]
	if st.MaxConnections != 500 || st.MaxConnectionsPerIP != 20 || st.PerIPOverrides["10.1.2.3"] != 200 ||
		st.ConnectionsMaxIdle != 2*time.Minute || st.WriteTimeout != 20*time.Second || st.LameDuck != 30*time.Second ||
		st.RequestReadTimeout != defaultRequestReadTimeout {
		t.Errorf("proxy settings %+v", st)
	}
	if ld, to := r.shutdownTimeouts(); ld != 30*time.Second || to != 5*time.Second {
		t.Errorf("shutdown timeouts %s, %s", ld, to)
	}
	if len(tg.filters) != 0 {
		t.Errorf("mirror filters set during a switchover: %v", tg.filters)
	}
	if e := logs.FilterMessageSnippet("not applied now").All(); len(e) != 1 ||
		!slices.Equal(e[0].ContextMap()["not_applied"].([]any), []any{"mirror.topics.include"}) {
		t.Fatalf("not-applied lines: %+v", e)
	}

	// The switch is over: the same file applies the filters, and only them.
	tg.switching = false
	applied, _ = r.reload(nil)
	if !slices.Equal(applied, []string{"mirror.topics.include"}) || len(tg.filters) != 1 ||
		!slices.Equal(tg.filters[0][0].Include, []string{"orders.*"}) || len(tg.settings) != 1 {
		t.Fatalf("applied %v, filters %v, settings set %d times", applied, tg.filters, len(tg.settings))
	}

	// The proxy refusing its settings leaves them pending, in force as before.
	tg.refuseWith = errors.New("refused")
	write(minimal + "max_connections: 7\nmirror:\n  topics: {include: [\"orders.*\"]}\n")
	if applied, _ = r.reload(nil); slices.Contains(applied, "max_connections") {
		t.Fatalf("applied %v although the proxy refused", applied)
	}
	if r.inForce.MaxConnections != 500 {
		t.Errorf("max_connections in force %d after a refused reload, want 500", r.inForce.MaxConnections)
	}

	// A bad override is a configuration error: nothing changes.
	tg.refuseWith = nil
	write(minimal + "max_connections_per_ip_overrides: {\"db.example\": 5}\n")
	if applied, _ := r.reload(nil); applied != nil {
		t.Fatalf("a bad override applied %v", applied)
	}
	if e := logs.FilterMessageSnippet("configuration not reloaded").Len(); e != 1 {
		t.Fatalf("%d not-reloaded lines", e)
	}
}

// TestReloadRetiresCluster: taking one of two clusters out of `clusters`,
// the other as it was, retires it while the member runs (with the keys it
// implies: the mirror has nothing to do); refused, it stays pending and is
// tried again at the next reload. Any other change of `clusters` needs a
// restart and retires nothing.
func TestReloadRetiresCluster(t *testing.T) {
	const two = `
cluster_id: vc
admin_open: true
clusters:
  - {name: old, bootstrap: ["k1:9092"]}
  - {name: new, bootstrap: ["k2:9092"]}
active: new
mirror: {sync_interval: 1s}
`
	const one = `
cluster_id: vc
admin_open: true
clusters:
  - {name: new, bootstrap: ["k2:9092"]}
mirror: {sync_interval: 1s}
`
	tg := &fakeTarget{}
	r, path, logs := testReloader(t, two, tg)
	write := func(text string) { t.Helper(); rewriteConfig(t, path, text) }

	// The cluster left changed too: a restart, nothing retired.
	write(strings.Replace(one, "k2:9092", "k3:9092", 1))
	applied, restart := r.reload(nil)
	if len(tg.retired) != 0 || len(applied) != 0 || !slices.Contains(restart, "clusters") {
		t.Fatalf("retired %v, applied %v, restart %v; want clusters restart_needed, nothing retired", tg.retired, applied, restart)
	}

	// Refused (a switch runs): pending, in force as before.
	tg.refuseWith = errors.New("a switch is running")
	write(one)
	if applied, restart = r.reload(nil); len(applied) != 0 || len(restart) != 0 || len(r.inForce.Clusters) != 2 {
		t.Fatalf("refused retire: applied %v, restart %v, clusters in force %v", applied, restart, r.inForce.Clusters)
	}
	if e := logs.FilterMessage("cluster not retired").Len(); e != 1 {
		t.Fatalf("%d cluster-not-retired lines", e)
	}
	if e := logs.FilterMessageSnippet("not applied now").All(); len(e) != 1 ||
		!slices.Equal(e[0].ContextMap()["not_applied"].([]any), []any{"clusters", "mirror.enabled"}) {
		t.Fatalf("not-applied lines: %+v", e)
	}

	// Tried again: retired, and in force.
	tg.refuseWith = nil
	applied, restart = r.reload(nil)
	if !slices.Equal(tg.retired, []string{"old"}) || !slices.Equal(applied, []string{"clusters", "mirror.enabled"}) || len(restart) != 0 {
		t.Fatalf("retired %v, applied %v, restart %v", tg.retired, applied, restart)
	}
	if len(r.inForce.Clusters) != 1 || r.inForce.Clusters[0].Name != "new" || r.inForce.Mirror.enabled() {
		t.Fatalf("in force after the retire: clusters %v, mirror enabled %v", r.inForce.Clusters, r.inForce.Mirror.enabled())
	}
	// The same file again changes nothing.
	if applied, restart = r.reload(nil); len(applied) != 0 || len(restart) != 0 || len(tg.retired) != 1 {
		t.Fatalf("reloaded again: applied %v, restart %v, retired %v", applied, restart, tg.retired)
	}

	// Adding a cluster back is a restart.
	write(two)
	if applied, restart = r.reload(nil); len(applied) != 0 || !slices.Contains(restart, "clusters") || len(tg.retired) != 1 {
		t.Fatalf("a cluster added: applied %v, restart %v, retired %v", applied, restart, tg.retired)
	}
}

// rewriteConfig writes text to the configuration file at path, as an
// operator does before SIGHUP.
func rewriteConfig(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// testReloader is a reloader of a member started with the configuration
// text (written to path), applying to tg, logging to logs.
func testReloader(t *testing.T, text string, tg reloadTarget) (r *reloader, path string, logs *observer.ObservedLogs) {
	t.Helper()
	path = writeConfig(t, text)
	f := &serveFlags{config: path}
	cfg, err := serveConfigEnv(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	r = newReloader(f, cfg, zap.NewAtomicLevelAt(zap.InfoLevel), zap.New(core))
	r.attach(tg)
	return r, path, logs
}

// TestRetireStopsFailover: a member with automatic failover over two
// clusters (kfake) retires the standby; /failover then says automatic
// failover stopped, and why, rather than the last view of a runner that no
// longer runs, and /status lists one cluster.
func TestRetireStopsFailover(t *testing.T) {
	a, b := kfakeCluster(t), kfakeCluster(t)
	n, _ := startNode(t, fmt.Sprintf(`
cluster_id: vc
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
admin_open: true
clusters:
  - {name: a, bootstrap: [%s]}
  - {name: b, bootstrap: [%s]}
mirror: {sync_interval: 1s}
failover: {automatic: true, max_loss: {records: 10}}
`, strings.Join(a.ListenAddrs(), ","), strings.Join(b.ListenAddrs(), ",")))
	url := "http://" + n.adminLn.Addr().String()
	failoverStatus := func() failover.Status {
		t.Helper()
		code, body := httpGet(t, url+"/failover")
		var st failover.Status
		if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil {
			t.Fatalf("/failover: %d %s (%v)", code, body, err)
		}
		return st
	}
	if st := failoverStatus(); !st.Enabled || st.Stopped != "" {
		t.Fatalf("/failover before the retire: %+v", st)
	}
	if err := n.retireCluster("a"); err == nil {
		t.Fatal("the active cluster retired")
	}
	if err := n.retireCluster("b"); err != nil {
		t.Fatal(err)
	}
	if st := failoverStatus(); st.Enabled || !strings.Contains(st.Stopped, `"b" retired`) || st.Verdict != nil {
		t.Fatalf("/failover after the retire: %+v", st)
	}
	_, body := httpGet(t, url+"/status")
	var st admin.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Clusters) != 1 || st.Clusters[0].Name != "a" || st.Failover == nil || st.Failover.Enabled {
		t.Fatalf("/status after the retire: clusters %+v, failover %+v", st.Clusters, st.Failover)
	}
}
