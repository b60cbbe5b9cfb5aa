package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"gopkg.in/yaml.v3"
)

// envBase has every section, so that each variable changes exactly its key.
const envBase = `
cluster_id: vc
clusters:
  - name: primary
    bootstrap: ["k1:9092"]
    tls: {server_name: kafka}
    sasl: {mechanism: PLAIN, username: u, password_env: P}
  - name: standby-eu.2
    bootstrap: ["k2:9092"]
    tls: {server_name: kafka}
    sasl: {mechanism: PLAIN, username: u, password_env: P}
fleet: {}
tls: {cert_file: c.crt, key_file: c.key}
admin_tls: {cert_file: a.crt, key_file: a.key}
sasl: {mechanisms: [SCRAM-SHA-512], credentials_file: u.yaml}
`

// envSample is a value of a key's type that differs from its zero value.
func envSample(t *testing.T, typ reflect.Type) string {
	t.Helper()
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch {
	case typ == durationType:
		return "7s"
	case typ.Kind() == reflect.String:
		return "from-env"
	case typ.Kind() == reflect.Bool:
		return "true"
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Int64:
		return "7"
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.String:
		return "a:1, b:2"
	case typ.Kind() == reflect.Map:
		return "10.0.0.5=7, 10.0.0.6=0"
	}
	t.Fatalf("no sample for a %s key", typ)
	return ""
}

// TestEnvEveryKeyHasVariable: each key of the file, listed independently
// of envKeys (from the YAML Ferry prints), has its FERRY_ variable, named
// by the rule, and setting it changes that key and nothing else.
func TestEnvEveryKeyHasVariable(t *testing.T) {
	keys := envKeys()
	paths := map[string]bool{}
	vars := map[string]bool{}
	for _, k := range keys {
		want := "FERRY_" + strings.ToUpper(strings.ReplaceAll(strings.ReplaceAll(k.Path, ".<name>.", "_<NAME>_"), ".", "_"))
		if k.Var != want {
			t.Errorf("%s: variable %s, want %s", k.Path, k.Var, want)
		}
		if vars[k.Var] {
			t.Errorf("%s: two keys have it", k.Var)
		}
		vars[k.Var], paths[k.Path] = true, true
	}
	for _, v := range []string{adminTokenEnv, runMainEnv} {
		if vars[v] {
			t.Errorf("%s is a configuration key's variable too", v)
		}
	}

	// Every leaf of the YAML a full configuration marshals to.
	full, err := configFrom(envBase + "admin_open: true\n")
	if err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	var tree map[string]any
	if err := yaml.Unmarshal(b, &tree); err != nil {
		t.Fatal(err)
	}
	var leaves []string
	var flatten func(path string, v any)
	flatten = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if len(v) == 0 { // a key that is a map, empty by default
				leaves = append(leaves, path)
			}
			for k, sub := range v {
				flatten(joinPath(path, k), sub)
			}
		case []any:
			if len(v) > 0 {
				if m, ok := v[0].(map[string]any); ok {
					for k, sub := range m {
						if k == "name" {
							continue
						}
						if sm, ok := sub.(map[string]any); ok { // a section of the entry (tls, sasl)
							for sk := range sm {
								leaves = append(leaves, path+".<name>."+k+"."+sk)
							}
							continue
						}
						leaves = append(leaves, path+".<name>."+k)
					}
					return
				}
			}
			leaves = append(leaves, path)
		default:
			leaves = append(leaves, path)
		}
	}
	flatten("", tree)
	for _, l := range leaves {
		if !paths[l] {
			t.Errorf("key %s has no environment variable", l)
		}
	}
	if len(leaves) != len(keys) {
		t.Errorf("%d keys in the YAML, %d variables", len(leaves), len(keys))
	}

	for _, k := range keys {
		before, err := parseConfig(strings.NewReader(envBase))
		if err != nil {
			t.Fatal(err)
		}
		after, _ := parseConfig(strings.NewReader(envBase))
		v, path := k.Var, k.Path
		if strings.Contains(v, "<NAME>") {
			v, path = strings.Replace(v, "<NAME>", "STANDBY_EU_2", 1), strings.Replace(path, ".<name>.", "[1].", 1)
		}
		if err := after.applyEnv([]string{v + "=" + envSample(t, k.Type)}); err != nil {
			t.Errorf("%s: %v", v, err)
			continue
		}
		if got := configDiff(before, after); !slices.Equal(got, []string{path}) {
			t.Errorf("%s changed %v, want [%s]", v, got, path)
		}
	}
}

func serveEnv(t *testing.T, file string, environ []string, args ...string) (*Config, error) {
	t.Helper()
	path := writeConfig(t, file)
	f, err := parseServeFlags(append([]string{"--config", path}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return serveConfigEnv(f, environ)
}

// TestEnvPrecedence: flags over the environment, the environment over the
// file, the file over the defaults.
func TestEnvPrecedence(t *testing.T) {
	file := minimal + `
listen: 127.0.0.1:1111
log_level: warn
mirror:
  sync_interval: 3s
`
	env := []string{
		"FERRY_LISTEN=127.0.0.1:2222",
		"FERRY_LOG_LEVEL=error",
		"FERRY_MIRROR_SYNC_INTERVAL=9s",
		"FERRY_FLEET_SEEDS=ferry-0:7946,ferry-1:7946",
		"FERRY_CLUSTERS_A_BOOTSTRAP=k7:9092",
		"FERRY_SPLICE_FETCHES=false",
		"FERRY_UPSTREAM_IDLE_CONNECTIONS_PER_BROKER=0",
		"FERRY_NODE_ID=", // empty: unset
		"PATH=/bin",
	}
	c, err := serveEnv(t, file, env, "--listen", "127.0.0.1:3333")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []struct {
		key       string
		got, want any
	}{
		{"listen (flag over env)", c.Listen, "127.0.0.1:3333"},
		{"log_level (env over file)", c.LogLevel, "error"},
		{"mirror.sync_interval (env over file)", c.Mirror.SyncInterval, 9 * time.Second},
		{"fleet.seeds (env, section created)", c.Fleet.Seeds, []string{"ferry-0:7946", "ferry-1:7946"}},
		{"fleet.bind (default under env's section)", c.Fleet.Bind, defaultFleetBind},
		{"clusters[0].bootstrap", c.Clusters[0].Bootstrap, []string{"k7:9092"}},
		{"splice_fetches (false over the default true)", *c.SpliceFetches, false},
		{"upstream_idle_connections_per_broker (0 over the default)", *c.UpstreamIdleConnsPerBroker, 0},
		{"node_id (empty variable)", c.NodeID, int32(0)},
		{"admin_listen (default)", c.AdminListen, defaultAdminListen},
	} {
		if !reflect.DeepEqual(g.got, g.want) {
			t.Errorf("%s = %v, want %v", g.key, g.got, g.want)
		}
	}
	// Without the flag, the environment's.
	c, err = serveEnv(t, file, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:2222" {
		t.Errorf("listen = %s, want the environment's", c.Listen)
	}
	// Without either, the file's.
	c, err = serveEnv(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:1111" || c.LogLevel != "warn" || c.Fleet != nil {
		t.Errorf("listen %s, log_level %s, fleet %v: want the file's", c.Listen, c.LogLevel, c.Fleet)
	}
}

// TestEnvMalformed: a value that is not of its key's type is a
// configuration error (exit status 2) naming the variable, every one at
// once; a value of the right type that validate refuses names the key.
func TestEnvMalformed(t *testing.T) {
	env := []string{
		"FERRY_MIRROR_SYNC_INTERVAL=5",
		"FERRY_MIRROR_ENABLED=yes",
		"FERRY_LANES=three",
		"FERRY_NODE_ID=99999999999",
		"FERRY_CLUSTERS_B_BOOTSTRAP=k9:9092",
	}
	_, err := serveEnv(t, minimal, env)
	var ue usageError
	if !errors.As(err, &ue) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v, want a usage error wrapping ErrInvalidConfig", err)
	}
	for _, want := range []string{
		`FERRY_MIRROR_SYNC_INTERVAL="5" (mirror.sync_interval): not a duration`,
		`FERRY_MIRROR_ENABLED="yes" (mirror.enabled): not a boolean: want true or false`,
		`FERRY_LANES="three" (lanes): not a whole number`,
		`FERRY_NODE_ID="99999999999" (node_id): out of range`,
		`FERRY_CLUSTERS_B_BOOTSTRAP: names no key of an entry of clusters in the file`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if _, err := serveEnv(t, minimal, []string{"FERRY_MIRROR_SYNC_INTERVAL=10ms"}); err == nil || !strings.Contains(err.Error(), "mirror.sync_interval 10ms: must be at least 1s") {
		t.Errorf("a valid duration below the minimum: %v", err)
	}

	// The binary's exit status.
	t.Setenv("FERRY_CONNECTIONS_MAX_IDLE", "forever")
	var stderr strings.Builder
	if code := run(context.Background(), []string{"serve", "--config", writeConfig(t, minimal)}, io.Discard, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "FERRY_CONNECTIONS_MAX_IDLE") {
		t.Fatalf("exit %d, want 2 naming the variable:\n%s", code, stderr.String())
	}
}

// TestEnvAdminToken: FERRY_ADMIN_TOKEN still sets the token (not a key),
// FERRY_ADMIN_TOKEN_FILE the file's key; neither is printed.
func TestEnvAdminToken(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := "cluster_id: vc\nclusters: [{name: a, bootstrap: [\"k1:9092\"]}]\n"
	c, err := serveEnv(t, file, []string{"FERRY_ADMIN_TOKEN=s3cret-env"})
	if err != nil || c.adminToken != "s3cret-env" {
		t.Fatalf("FERRY_ADMIN_TOKEN: %v %q", err, c.adminToken)
	}
	c, err = serveEnv(t, file, []string{"FERRY_ADMIN_TOKEN_FILE=" + tokenFile})
	if err != nil || c.adminToken != "from-file" || c.AdminTokenFile != tokenFile {
		t.Fatalf("FERRY_ADMIN_TOKEN_FILE: %v %q", err, c.adminToken)
	}
	var out strings.Builder
	if err := printConfig(&out, c); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "from-file") || !strings.Contains(out.String(), "admin_token_file: "+tokenFile) {
		t.Fatalf("--print-config:\n%s", out.String())
	}
}

// TestServePrintConfig: --print-config prints the configuration in force,
// the environment's values included, and exits 0.
func TestServePrintConfig(t *testing.T) {
	t.Setenv("FERRY_MIRROR_SYNC_INTERVAL", "42s")
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"serve", "--config", writeConfig(t, minimal), "--print-config", "--log-level", "debug"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var c Config
	if err := yaml.Unmarshal([]byte(stdout.String()), &c); err != nil {
		t.Fatalf("%v:\n%s", err, stdout.String())
	}
	if c.Mirror.SyncInterval != 42*time.Second || c.LogLevel != "debug" || c.Listen != defaultListen {
		t.Fatalf("printed:\n%s", stdout.String())
	}
}

// TestReloadConfig: a reload applies log_level, reports the other changed
// keys as needing a restart (again at the next reload, since they still
// are), and a file that does not validate changes nothing.
func TestReloadConfig(t *testing.T) {
	path := writeConfig(t, minimal+"log_level: info\nlanes: 1\n")
	f := &serveFlags{config: path}
	cfg, err := serveConfigEnv(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	level := zap.NewAtomicLevelAt(zap.InfoLevel)
	r := newReloader(f, cfg, level, zap.New(core))

	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(minimal + "log_level: debug\nlanes: 2\nmirror: {sync_interval: 9s}\n")
	applied, restart := r.reload(nil)
	if !slices.Equal(applied, []string{"log_level"}) || !slices.Equal(restart, []string{"mirror.sync_interval", "lanes"}) {
		t.Fatalf("applied %v, restart %v", applied, restart)
	}
	if level.Level() != zap.DebugLevel {
		t.Fatalf("level %s after the reload", level.Level())
	}
	if n := logs.FilterMessage("configuration reloaded").Len(); n != 1 {
		t.Fatalf("%d reload lines", n)
	}
	if e := logs.FilterMessageSnippet("need a restart").All(); len(e) != 1 || !reflect.DeepEqual(e[0].ContextMap()["restart_needed"], []any{"mirror.sync_interval", "lanes"}) {
		t.Fatalf("restart lines: %+v", e)
	}

	// The same file again: nothing to apply, the restart still pending.
	applied, restart = r.reload(nil)
	if len(applied) != 0 || len(restart) != 2 {
		t.Fatalf("applied %v, restart %v", applied, restart)
	}
	// The environment is read again too; the flags still win.
	applied, _ = r.reload([]string{"FERRY_LOG_LEVEL=warn"})
	if !slices.Equal(applied, []string{"log_level"}) || level.Level() != zap.WarnLevel {
		t.Fatalf("applied %v, level %s", applied, level.Level())
	}
	r.flags = &serveFlags{config: path, logLevel: "error"}
	if r.reload([]string{"FERRY_LOG_LEVEL=debug"}); level.Level() != zap.ErrorLevel {
		t.Fatalf("level %s, want the flag's", level.Level())
	}

	// A bad file: an error, nothing changed.
	write(minimal + "lanes: -1\n")
	if applied, restart := r.reload(nil); applied != nil || restart != nil || level.Level() != zap.ErrorLevel {
		t.Fatalf("a bad file applied %v, restart %v, level %s", applied, restart, level.Level())
	}
	if e := logs.FilterMessageSnippet("not reloaded").All(); len(e) != 1 || e[0].Level != zap.ErrorLevel || !strings.Contains(e[0].ContextMap()["error"].(string), "lanes -1") {
		t.Fatalf("bad-file lines: %+v", e)
	}
}

// TestStopOnSignals: the first signal cancels (drain), the second exits at
// once with status 1.
func TestStopOnSignals(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	var stderr strings.Builder
	go stopOnSignals(sigs, cancel, &stderr, func(code int) { exited <- code })
	sigs <- os.Interrupt
	<-ctx.Done()
	select {
	case code := <-exited:
		t.Fatalf("exited (%d) at the first signal", code)
	case <-time.After(50 * time.Millisecond):
	}
	sigs <- os.Interrupt
	select {
	case code := <-exited:
		if code != 1 {
			t.Fatalf("exit status %d, want 1", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no exit at the second signal")
	}
	if !strings.Contains(stderr.String(), "second signal") {
		t.Fatalf("stderr: %q", stderr.String())
	}
}
