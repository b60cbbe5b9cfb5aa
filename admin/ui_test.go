package admin

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// GET / is the status page and /ui/ its files, from the binary, loading
// nothing from elsewhere; other paths stay 404.
func TestUIServed(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct{ path, ctype, has string }{
		{"/", "text/html", `<script src="ui/app.js">`},
		{"/ui/app.js", "javascript", "function refresh()"},
		{"/ui/style.css", "text/css", ".halted"},
	} {
		rec := f.do(t, tc.path)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("Content-Type"), tc.ctype) || !strings.Contains(rec.Body.String(), tc.has) {
			t.Errorf("GET %s: %d %q, want 200 %s containing %q", tc.path, rec.Code, rec.Header().Get("Content-Type"), tc.ctype, tc.has)
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tc.path, csp)
		}
	}
	for _, p := range []string{"/nothing", "/ui/missing.js", "/ui/admin.go"} {
		if code, _ := f.get(t, p); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, code)
		}
	}
	// No external assets: nothing in the page's files names another host.
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|url\(`)
	err := fs.WalkDir(uiFiles, "ui", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := uiFiles.ReadFile(path)
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to %q: the page must load nothing from elsewhere", path, m)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The status page, loaded in headless Chromium against an admin server
// with a real proxy's connections, shows the active cluster, a halted
// partition with its reason and a client with its software, and escapes
// what it shows. The screenshot is kept (FERRY_TEST_ARTIFACTS, else the
// test's temporary directory).
func TestUIChromium(t *testing.T) {
	chromium := chromiumPath(t)

	// A client through a real proxy, named by its client ID (with markup,
	// which must show as text) and its software.
	p, kafkaAddr := startProxy(t)
	connectClient(t, kafkaAddr, kgo.ClientID("<b>orders-svc</b>"), kgo.SoftwareNameAndVersion("ui-test-client", "4.5.6"))

	// A mirror with a halted partition, a fleet of two, a switch back to
	// primary, and the standby unreachable.
	fm := &fakeMirror{info: MirrorInfo{Enabled: true, Running: true, Source: "primary", Target: "standby", Partitions: statuses()}}
	for i := range int32(12) {
		fm.info.Partitions = append(fm.info.Partitions, mirror.PartitionStatus{Topic: "payments", Partition: i, State: mirror.StateMirroring,
			Mirrored: 1000, SourceEnd: 1000 + int64(i*i*40), LagRecords: int64(i * i * 40), LagTime: time.Duration(i) * time.Second})
	}
	members := func(context.Context) []Member {
		return []Member{
			{NodeID: 7, State: "alive", Self: true, Host: "ferry-7", Ports: []int32{9092, 9093}, Gossip: "ferry-7:7946", Admin: "ferry-7:9644", Version: "v1.2.3", Generation: 2, GossipGeneration: 2, Connections: 1, MirrorPartitions: 17},
			{NodeID: 8, State: "suspect", Host: "ferry-8", Ports: []int32{9092, 9093}, Gossip: "ferry-8:7946", Admin: "ferry-8:9644", Version: "v1.2.3", Generation: 1, GossipGeneration: 1, Connections: -1, MirrorPartitions: -1},
		}
	}
	// Automatic failover, blocked by the loss budget.
	fo := func() failover.Status {
		return failover.Status{Enabled: true, After: "30s", Actor: 7,
			View:    failover.View{Member: 7, Generation: 2, Active: "primary", DownMillis: 45000, Standby: "standby", StandbyUp: true},
			Verdict: &failover.Verdict{Blocked: true, Reason: "the mirror's lag at the failure, 900 records and 2.0 s, exceeds max_loss (100 records)"}}
	}
	f := newFixture(t, WithMirror(fm.get), WithConnections(p.Connz), WithMembers(members), WithFailover(fo))
	f.started.Store(true)
	f.down["standby"] = true
	started := time.Now().Add(-time.Minute).UTC()
	f.routes.Advance(routing.State{Generation: 2, Active: "primary", Last: &routing.Switch{
		Mode: routing.Planned, From: "standby", To: "primary", Started: started, Finished: started.Add(1234 * time.Millisecond),
		Duration: "1.234s", Outcome: "switched", Steps: []routing.Step{{Step: "hold", Took: "2ms"}, {Step: "drain", Took: "1.1s"}, {Step: "save", Took: "40ms"}},
	}, History: []routing.Switch{{
		Mode: routing.Forced, From: "primary", To: "standby", Started: started.Add(-time.Hour), Finished: started.Add(-time.Hour + 80*time.Millisecond),
		Duration: "80ms", Outcome: "switched", LostRanges: 3,
	}}})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go f.srv.Serve(ln)
	t.Cleanup(func() { f.srv.Close() })
	url := "http://" + ln.Addr().String() + "/"

	dir := os.Getenv("FERRY_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "status-page.png")

	dom := runChromium(t, chromium, url, "--dump-dom")
	for _, want := range []string{
		`id="active-cluster">primary<`,
		`orders[2]</td><td class="num">7</td><td class="bad">offset_mismatch</td>`,
		`standby assigned 40`,
		`data-topic="orders" data-partition="2" data-state="halted"`,
		`ui-test-client 4.5.6`,
		`&lt;b&gt;orders-svc&lt;/b&gt;`, // the client ID as text
		`standby → primary`,
		`switched`,
		`primary → standby`, // the history before the last switch
		`3 ranges`,
		`suspect`,
		`unreachable`,
		`id="failover">automatic, after 30s · the mirror's lag at the failure, 900 records`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	if strings.Contains(dom, "<b>orders-svc") {
		t.Error("the client ID was rendered as markup")
	}
	if t.Failed() {
		t.Fatalf("DOM:\n%s", dom)
	}

	runChromium(t, chromium, url, "--screenshot="+shot, "--window-size=1280,1600")
	if fi, err := os.Stat(shot); err != nil || fi.Size() == 0 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s", shot)

	// A member that is not serving (a switch holding writes) is
	// highlighted.
	cur := f.routes.Current()
	cur.Phase = routing.PhaseDraining
	if !f.routes.Update(cur) {
		t.Fatal("could not set the phase")
	}
	dom = runChromium(t, chromium, url, "--dump-dom")
	if !strings.Contains(dom, `id="routing" class="not-serving"`) || !strings.Contains(dom, `id="phase">draining<`) {
		t.Fatalf("a draining member is not highlighted:\n%s", dom)
	}
}

func (f *fixture) do(t *testing.T, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

// chromiumPath is the chromium the page is loaded in. Without one the
// test is skipped, or fails with CI=true.
func chromiumPath(t *testing.T) string {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium is not installed (conformance/clients/install.sh installs Debian's chromium): %v", err)
		}
		t.Skipf("chromium is not installed (conformance/clients/install.sh installs Debian's chromium; with CI=true this fails): %v", err)
	}
	return chromium
}

// runChromium loads url in headless Chromium with the page's fetches
// given time to complete, and returns what it prints.
func runChromium(t *testing.T, chromium, url string, flags ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
		"--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000"}
	if os.Geteuid() == 0 {
		args = append(args, "--no-sandbox") // Chromium refuses to run as root with its sandbox
	}
	args = append(append(args, flags...), url)
	cmd := exec.CommandContext(ctx, chromium, args...)
	cmd.Dir = t.TempDir() // --screenshot without a path writes here
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// With a token set, the status page loaded without it shows the busiest
// connections without their remote addresses and says why; with
// admin_public_read it shows them.
func TestUIChromiumRedacted(t *testing.T) {
	chromium := chromiumPath(t)
	p, kafkaAddr := startProxy(t)
	connectClient(t, kafkaAddr, kgo.ClientID("redact-svc"))
	connections := regexp.MustCompile(`(?s)<table id="connections">.*?</table>`)
	for _, tc := range []struct {
		name   string
		public bool
	}{{"a token set", false}, {"admin_public_read", true}} {
		f := newFixture(t, WithConnections(p.Connz), WithToken(testToken), WithPublicRead(tc.public))
		f.started.Store(true)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go f.srv.Serve(ln)
		t.Cleanup(func() { f.srv.Close() })
		dom := runChromium(t, chromium, "http://"+ln.Addr().String()+"/", "--dump-dom")
		table := connections.FindString(dom)
		if !strings.Contains(table, "redact-svc") || !strings.Contains(dom, `id="token"`) {
			t.Fatalf("%s: the page shows no connection of redact-svc, or no token field:\n%s", tc.name, dom)
		}
		hidden := strings.Contains(dom, "remote addresses hidden: enter the admin token above")
		shown := strings.Contains(table, "<td>127.0.0.1:")
		if hidden == tc.public || shown != tc.public {
			t.Errorf("%s: hidden said %v, remote shown %v:\n%s", tc.name, hidden, shown, dom)
		}
	}
}
