package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/protocol/clusterauth"
)

func fixedHostname() (string, error) { return "ferry-host", nil }

// configFrom parses, defaults and validates text as serve would.
func configFrom(text string) (*Config, error) {
	c, err := parseConfig(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	c.applyDefaults(fixedHostname)
	return c, c.validate()
}

const minimal = `
cluster_id: vc
admin_open: true
clusters:
  - name: a
    bootstrap: ["k1:9092"]
`

func TestExampleConfig(t *testing.T) {
	b, err := os.ReadFile("../../docs/ferry.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := configFrom(string(b))
	if err != nil {
		t.Fatalf("the example in docs/ does not validate: %v", err)
	}
	want := &Config{
		ClusterID:                "ferry-prod",
		NodeID:                   0,
		Listen:                   "0.0.0.0:9092",
		AdvertisedHost:           "ferry-0.example.internal",
		AdvertisedPort:           9092,
		Lanes:                    3,
		AdminListen:              "0.0.0.0:9644",
		AdminMaxConnections:      64,
		AdminMaxConnectionsPerIP: 16,
		AdminTokenFile:           "/etc/ferry/admin-token",
		Clusters: []ClusterConfig{
			{Name: "primary", Bootstrap: []string{"kafka-a-1:9093", "kafka-a-2:9093", "kafka-a-3:9093"},
				TLS:  &clusterauth.TLS{Enabled: true, CAFile: "/etc/ferry/tls/kafka-a-ca.crt", MinVersion: "1.2"},
				SASL: &clusterauth.SASL{Mechanism: "SCRAM-SHA-512", Username: "ferry", PasswordFile: "/run/secrets/kafka-a-password"}},
			{Name: "standby", Bootstrap: []string{"kafka-b-1:9092", "kafka-b-2:9092", "kafka-b-3:9092"}},
		},
		Active: "primary",
		Mirror: MirrorConfig{
			Enabled:      ptr(true),
			Topics:       Selection{Exclude: []string{`.*\.tmp`, "scratch-.*"}},
			Groups:       Selection{Exclude: []string{"console-consumer-.*"}},
			SyncInterval: 5 * time.Second,
			InFlight:     128,
			SyncGroups:   ptr(true),
			SyncACLs:     ptr(true),
			// The example sets it to its default, to show the key.
			RecompressCompacted: ptr(true),
		},
		MaxRequestSize:               100 << 20,
		BufferBudget:                 1 << 30,
		BufferBudgetPerConnection:    128 << 20,
		UpstreamMaxConnsPerBroker:    4096,
		UpstreamIdleConnsPerBroker:   ptr(16),
		MetadataRefreshInterval:      30 * time.Second,
		SpliceFetches:                ptr(true),
		SpliceProduces:               ptr(true),
		ConnectionsMaxIdle:           10 * time.Minute,
		RequestReadTimeout:           30 * time.Second,
		ConnectionStats:              ptr(true),
		ClientMetricsLimit:           ptr(100),
		ClientWriteTimeout:           time.Minute,
		MaxConnectionsPerIPOverrides: map[string]int{},
		LameDuckDuration:             ptr(5 * time.Second),
		ShutdownTimeout:              15 * time.Second,
		UpstreamDialTimeout:          10 * time.Second,
		Policy:                       PolicyConfig{Allow: []string{"records_delete"}, Deny: []string{}},
		Fleet: &FleetConfig{
			Bind:       "0.0.0.0:7946",
			Seeds:      []string{"ferry-0.example.internal:7946", "ferry-1.example.internal:7946", "ferry-2.example.internal:7946"},
			KeyFile:    "/etc/ferry/gossip.key",
			WriteLease: 1500 * time.Millisecond,
		},
		Failover: func() FailoverConfig {
			f := FailoverConfig{After: 30 * time.Second, MinInterval: 10 * time.Minute, Quorum: "majority"}
			f.MaxLoss.Records, f.MaxLoss.Seconds = ptr(int64(10000)), ptr(int64(5))
			return f
		}(),
		LogLevel:           "info",
		UnmappedPrincipals: "service",
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", c, want)
	}
}

func TestConfigDefaults(t *testing.T) {
	c, err := configFrom(minimal)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "0.0.0.0:9092" || c.AdminListen != "0.0.0.0:9644" || c.Active != "a" ||
		c.MaxRequestSize != 100<<20 || c.MetadataRefreshInterval != 30*time.Second || c.LogLevel != "info" ||
		c.AdvertisedHost != "ferry-host" || c.AdvertisedPort != 0 || c.NodeID != 0 || c.SpliceFetches == nil || !*c.SpliceFetches || c.SpliceProduces == nil || !*c.SpliceProduces ||
		c.UpstreamMaxConnsPerBroker != 4096 || *c.UpstreamIdleConnsPerBroker != 16 ||
		c.ConnectionsMaxIdle != 10*time.Minute || c.RequestReadTimeout != 30*time.Second ||
		!*c.ConnectionStats || *c.ClientMetricsLimit != 100 {
		t.Fatalf("defaults: %+v", c)
	}
	if c.AdminMaxConnections != 64 || c.AdminMaxConnectionsPerIP != 16 || c.AdminPublicRead {
		t.Fatalf("admin_max_connections %d, per IP %d, admin_public_read %v; want 64, 16 and false", c.AdminMaxConnections, c.AdminMaxConnectionsPerIP, c.AdminPublicRead)
	}
	if c.BufferBudget != 512<<20 || c.BufferBudgetPerConnection != 128<<20 {
		t.Fatalf("buffer budgets %d and %d per connection, want 512 MiB and 128 MiB", c.BufferBudget, c.BufferBudgetPerConnection)
	}
	if c, err := configFrom(minimal + "splice_fetches: false\n"); err != nil || *c.SpliceFetches {
		t.Fatalf("splice_fetches: false read as %v (%v)", c.SpliceFetches, err)
	}
	if c, err := configFrom(minimal + "splice_produces: false\n"); err != nil || *c.SpliceProduces {
		t.Fatalf("splice_produces: false read as %v (%v)", c.SpliceProduces, err)
	}
	// A listener on one address advertises that address.
	c, err = configFrom(minimal + "listen: 10.1.2.3:19092\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.AdvertisedHost != "10.1.2.3" {
		t.Fatalf("advertised host %q, want the listener's", c.AdvertisedHost)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string
		want []string // each must appear in the error
	}{
		{"empty file", "", []string{"the file is empty"}},
		{"unknown key", "cluster_id: vc\nclustr: []\n", []string{`line 2: unknown key "clustr"`}},
		{"unknown key in a cluster", "cluster_id: vc\nclusters:\n  - name: a\n    bootstrap: [\"k:1\"]\n    bootstrp: [\"k:2\"]\n", []string{`line 5: unknown key "bootstrp"`}},
		{"two documents", minimal + "---\ncluster_id: other\n", []string{"only one YAML document"}},
		{"not a duration", minimal + "metadata_refresh_interval: 30\n", []string{"line 7", "into a duration (e.g. 30s)"}},
		{"not a number", minimal + "node_id: one\n", []string{"line 7", "into a number"}},
		{"missing cluster ID", "clusters: [{name: a, bootstrap: [\"k:1\"]}]\n", []string{"cluster_id is required"}},
		{"missing cluster", "cluster_id: vc\n", []string{"clusters: at least one cluster is required"}},
		{"three clusters", "cluster_id: vc\nclusters: [{name: a, bootstrap: [\"k:1\"]}, {name: b, bootstrap: [\"k:1\"]}, {name: c, bootstrap: [\"k:1\"]}]\n", []string{"3 configured; Ferry fronts one or two"}},
		{"cluster without name", "cluster_id: vc\nclusters: [{bootstrap: [\"k:1\"]}]\n", []string{"clusters[0].name is required"}},
		{"bad cluster name", "cluster_id: vc\nclusters: [{name: 'a b', bootstrap: [\"k:1\"]}]\n", []string{`clusters[0].name "a b": use letters`}},
		{"cluster named twice", "cluster_id: vc\nclusters: [{name: a, bootstrap: [\"k:1\"]}, {name: a, bootstrap: [\"k:2\"]}]\n", []string{`clusters[1].name "a": named twice`}},
		{"no bootstrap", "cluster_id: vc\nclusters: [{name: a}]\n", []string{"clusters[0] (a): bootstrap needs at least one host:port"}},
		{"bootstrap without port", "cluster_id: vc\nclusters: [{name: a, bootstrap: [kafka]}]\n", []string{`clusters[0].bootstrap[0] "kafka": not host:port (missing port in address)`}},
		{"bootstrap port out of range", "cluster_id: vc\nclusters: [{name: a, bootstrap: [\"k:1\", \"k:99999\"]}]\n", []string{`clusters[0].bootstrap[1] "k:99999": port "99999" is not a number between 1 and 65535`}},
		{"bootstrap port 0", "cluster_id: vc\nclusters: [{name: a, bootstrap: [\"k:0\"]}]\n", []string{`bootstrap[0] "k:0": port "0"`}},
		{"bootstrap without host", "cluster_id: vc\nclusters: [{name: a, bootstrap: [\":9092\"]}]\n", []string{`bootstrap[0] ":9092": the host is missing`}},
		{"bad listen", minimal + "listen: localhost\n", []string{`listen "localhost": not host:port`}},
		{"bad admin listen", minimal + "admin_listen: \"0.0.0.0:http\"\n", []string{`admin_listen "0.0.0.0:http": port "http"`}},
		{"unspecified advertised host", minimal + "advertised_host: 0.0.0.0\n", []string{`advertised_host "0.0.0.0": clients cannot connect`}},
		{"bad advertised port", minimal + "advertised_port: 70000\n", []string{"advertised_port 70000"}},
		{"negative node ID", minimal + "node_id: -1\n", []string{"node_id -1: must be 0 or more"}},
		{"unknown active", minimal + "active: b\n", []string{`active "b": not one of the configured clusters`}},
		{"mirror topics as a list", minimal + "mirror:\n  topics: [\"*\"]\n", []string{"line 8", "cannot unmarshal !!seq"}},
		{"unknown mirror key", minimal + "mirror:\n  topic: {include: [a]}\n", []string{`line 8: unknown key "topic"`}},
		{"small max request", minimal + "max_request_size: 100\n", []string{"max_request_size 100"}},
		{"huge max request", minimal + "max_request_size: 4294967296\n", []string{"max_request_size 4294967296"}},
		{"tiny connection budget", minimal + "buffer_budget_per_connection: 1000\n", []string{"buffer_budget_per_connection 1000: must be at least 65536 bytes"}},
		{"process budget below a connection's", minimal + "buffer_budget: 67108864\n", []string{"buffer_budget 67108864: must be at least buffer_budget_per_connection (134217728)"}},
		{"budget not a number", minimal + "buffer_budget: 512MiB\n", []string{"line 7", "into a number"}},
		{"no upstream connections", minimal + "upstream_max_connections_per_broker: -1\n", []string{"upstream_max_connections_per_broker -1: must be 1 or more"}},
		{"no admin connections", minimal + "admin_max_connections: -1\n", []string{"admin_max_connections -1: must be 1 or more"}},
		{"no admin connections per IP", minimal + "admin_max_connections_per_ip: -2\n", []string{"admin_max_connections_per_ip -2: must be 1 or more"}},
		{"negative idle connections", minimal + "upstream_idle_connections_per_broker: -1\n", []string{"upstream_idle_connections_per_broker -1: must be 0 or more"}},
		{"negative client metrics limit", minimal + "client_metrics_limit: -1\n", []string{"client_metrics_limit -1: must be 0 or more"}},
		{"short refresh", minimal + "metadata_refresh_interval: 10ms\n", []string{"metadata_refresh_interval 10ms: must be at least 1s"}},
		{"bad fleet", minimal + "fleet:\n  bind: gossip\n  advertise: \":7946\"\n  seeds: [\"ferry-1\"]\n  write_lease: 10ms\n", []string{
			`fleet.bind "gossip": not host:port`, `fleet.advertise ":7946": the host is missing`, `fleet.seeds[0] "ferry-1": not host:port`, "fleet.write_lease 10ms: must be between 200ms and 1m"}},
		{"unknown fleet key", minimal + "fleet:\n  seed: [a:1]\n", []string{`line 8: unknown key "seed"`}},
		{"automatic failover with one cluster", minimal + "failover: {automatic: true, max_loss: {records: 10}}\n", []string{
			"failover.automatic: two clusters are needed"}},
		{"automatic failover with no budget, too soon, another quorum", minimal + "failover: {automatic: true, after: 1s, quorum: all, min_interval: -1m}\n", []string{
			"failover.max_loss: set records, seconds or both", "failover.after 1s: must be at least 5s", `failover.quorum "all": only majority`, "failover.min_interval -1m0s"}},
		{"negative loss budget", minimal + "failover: {automatic: true, max_loss: {records: -1}}\n", []string{"failover.max_loss.records -1: must be 0 or more"}},
		{"short idle", minimal + "connections_max_idle: 500ms\n", []string{"connections_max_idle 500ms: must be at least 1s"}},
		{"negative idle", minimal + "connections_max_idle: -10m\n", []string{"connections_max_idle -10m0s: must be at least 1s"}},
		{"idle in milliseconds", minimal + "connections_max_idle: 600000\n", []string{"line 7", "into a duration (e.g. 30s)"}},
		{"short request read timeout", minimal + "request_read_timeout: 0.5s\n", []string{"request_read_timeout 500ms: must be at least 1s"}},
		{"bad log level", minimal + "log_level: verbose\n", []string{`log_level "verbose": must be debug, info, warn or error`}},
		{"unknown policy class", minimal + "policy:\n  deny: [topic_delete, topic_delet]\n", []string{`policy.deny[1] "topic_delet": not a request class; the classes are topic_create, topic_delete`}},
		{"policy class allowed and denied", minimal + "policy:\n  allow: [acl_admin]\n  deny: [acl_admin]\n", []string{`policy: "acl_admin" is in both allow and deny`}},
		{"unknown policy key", minimal + "policy:\n  allowed: [acl_admin]\n", []string{`line 8: unknown key "allowed"`}},
		{"policy as a list", minimal + "policy: [acl_admin]\n", []string{"line 7", "cannot unmarshal !!seq"}},
		{"every problem at once", "cluster_id: vc\nnode_id: -2\nlog_level: loud\nclusters: [{name: a, bootstrap: [nope]}]\n",
			[]string{"node_id -2", `log_level "loud"`, `bootstrap[0] "nope"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := configFrom(tc.text)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("%v does not wrap ErrInvalidConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error\n%v\ndoes not say %q", err, w)
				}
			}
		})
	}
}

const twoClusters = `
cluster_id: vc
admin_open: true
clusters:
  - name: a
    bootstrap: ["k1:9092"]
  - name: b
    bootstrap: ["k2:9092"]
`

func TestMirrorConfig(t *testing.T) {
	defaults := MirrorConfig{Enabled: ptr(true), SyncInterval: 5 * time.Second, InFlight: 128, SyncGroups: ptr(true), SyncACLs: ptr(true),
		RecompressCompacted: ptr(true)}
	with := func(f func(*MirrorConfig)) MirrorConfig {
		m := defaults
		f(&m)
		return m
	}
	for _, tc := range []struct {
		name string
		text string
		want MirrorConfig
	}{
		{"two clusters: on by default", twoClusters, defaults},
		{"one cluster: off by default", minimal, with(func(m *MirrorConfig) { m.Enabled = ptr(false) })},
		{"disabled with two clusters", twoClusters + "mirror: {enabled: false}\n", with(func(m *MirrorConfig) { m.Enabled = ptr(false) })},
		{"disabled with one cluster", minimal + "mirror:\n  enabled: false\n", with(func(m *MirrorConfig) { m.Enabled = ptr(false) })},
		{"every key", twoClusters + `
mirror:
  enabled: true
  topics:
    include: ["orders\\..*", "payments"]
    exclude: [".*\\.tmp"]
  groups:
    include: ["svc-.*"]
    exclude: ["svc-test"]
  sync_interval: 2s
  inflight: 3
  sync_groups: false
  sync_acls: false
  recompress_compacted: false
`, MirrorConfig{
			Enabled:             ptr(true),
			Topics:              Selection{Include: []string{`orders\..*`, "payments"}, Exclude: []string{`.*\.tmp`}},
			Groups:              Selection{Include: []string{"svc-.*"}, Exclude: []string{"svc-test"}},
			SyncInterval:        2 * time.Second,
			InFlight:            3,
			SyncGroups:          ptr(false),
			SyncACLs:            ptr(false),
			RecompressCompacted: ptr(false),
		}},
		{"empty section", twoClusters + "mirror:\n", defaults},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := configFrom(tc.text)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Mirror, tc.want) {
				t.Fatalf("mirror %s\nwant   %s", showMirror(c.Mirror), showMirror(tc.want))
			}
		})
	}
}

func showMirror(m MirrorConfig) string {
	b := func(p *bool) string {
		if p == nil {
			return "nil"
		}
		return strconv.FormatBool(*p)
	}
	return fmt.Sprintf("{enabled %s topics %+v groups %+v sync %s inflight %d groups %s acls %s recompress %s}",
		b(m.Enabled), m.Topics, m.Groups, m.SyncInterval, m.InFlight, b(m.SyncGroups), b(m.SyncACLs), b(m.RecompressCompacted))
}

func TestMirrorConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string
		want []string
	}{
		{"enabled with one cluster", minimal + "mirror: {enabled: true}\n",
			[]string{"mirror.enabled: the mirror copies the active cluster to the standby, so it needs two clusters (1 configured)"}},
		{"bad topic regex", twoClusters + "mirror: {topics: {include: [\"orders(\"]}}\n",
			[]string{"mirror.topics.include[0] \"orders(\": missing closing ): `orders(`"}},
		{"bad exclude regex", twoClusters + "mirror: {topics: {exclude: [ok, \"*.tmp\"]}}\n",
			[]string{"mirror.topics.exclude[1] \"*.tmp\": missing argument to repetition operator: `*`"}},
		{"bad group regex", twoClusters + "mirror: {groups: {include: [\"[a-\"], exclude: [\"(?z)\"]}}\n",
			[]string{"mirror.groups.include[0] \"[a-\"", "mirror.groups.exclude[0] \"(?z)\": invalid or unsupported Perl syntax"}},
		{"internal topics", twoClusters + "mirror: {topics: {include: [\"__consumer_offsets\", \"__.*\", \"orders\"]}}\n",
			[]string{`mirror.topics.include[0] "__consumer_offsets": topics whose name starts with "__" are internal and never mirrored`,
				`mirror.topics.include[1] "__.*": topics whose name starts with "__"`}},
		{"short sync interval", twoClusters + "mirror: {sync_interval: 100ms}\n", []string{"mirror.sync_interval 100ms: must be at least 1s"}},
		{"negative sync interval", twoClusters + "mirror: {sync_interval: -5s}\n", []string{"mirror.sync_interval -5s"}},
		{"too many in flight", twoClusters + "mirror: {inflight: 257}\n", []string{"mirror.inflight 257: must be between 1 and 256"}},
		{"negative in flight", twoClusters + "mirror: {inflight: -1}\n", []string{"mirror.inflight -1"}},
		{"negative mirror connections", twoClusters + "mirror: {max_connections: -1}\n", []string{"mirror.max_connections -1: must be 0"}},
		{"checked while disabled", minimal + "mirror: {enabled: false, topics: {include: [\"(\"]}}\n", []string{"mirror.topics.include[0]"}},
		{"not a boolean", twoClusters + "mirror: {sync_acls: sometimes}\n", []string{"line 9", "cannot unmarshal"}},
		{"every problem at once", minimal + "mirror: {enabled: true, inflight: 300, groups: {exclude: [\")\"]}}\n",
			[]string{"needs two clusters", "mirror.inflight 300", "mirror.groups.exclude[0]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := configFrom(tc.text)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("%v does not wrap ErrInvalidConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error\n%v\ndoes not say %q", err, w)
				}
			}
		})
	}
}

// TestMirrorSelectionMatchesMirror: a pattern selects the same topics here
// as in the mirror (both anchor it to the whole name).
func TestMirrorSelectionAnchored(t *testing.T) {
	re, err := compilePattern("orders|pay.*")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"orders": true, "payments": true, "my-orders": false, "orders-eu": false, "repay": false} {
		if re.MatchString(name) != want {
			t.Errorf("%q matched %v, want %v", name, !want, want)
		}
	}
}

func TestServeMirrorFlag(t *testing.T) {
	var stderr strings.Builder
	path := filepath.Join(t.TempDir(), "ferry.yaml")
	if err := os.WriteFile(path, []byte(twoClusters), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true}, // the default with two clusters
		{[]string{"--mirror=false"}, false},
		{[]string{"--mirror"}, true},
		{[]string{"--mirror=true"}, true},
	} {
		f, err := parseServeFlags(append([]string{"--config", path}, tc.args...), &stderr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := serveConfig(f)
		if err != nil {
			t.Fatal(err)
		}
		if c.Mirror.enabled() != tc.want {
			t.Errorf("%q: mirror enabled %v, want %v", tc.args, c.Mirror.enabled(), tc.want)
		}
	}
	// The flag wins over the file, and is validated like the file.
	one := filepath.Join(t.TempDir(), "one.yaml")
	if err := os.WriteFile(one, []byte(minimal+"mirror: {enabled: false}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := parseServeFlags([]string{"--config", one, "--mirror"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serveConfig(f); err == nil || !strings.Contains(err.Error(), "needs two clusters") {
		t.Fatalf("--mirror with one cluster: %v", err)
	}
	if _, err := parseServeFlags([]string{"--config", one, "--mirror=maybe"}, &stderr); err == nil {
		t.Fatal("--mirror=maybe accepted")
	}
}

func TestServeFlagsOverrideFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.yaml")
	text := minimal + "listen: 127.0.0.1:1111\nadmin_listen: 127.0.0.1:2222\nlog_level: error\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder

	// No flags: the file's values.
	f, err := parseServeFlags([]string{"--config", path}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := serveConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:1111" || c.AdminListen != "127.0.0.1:2222" || c.LogLevel != "error" {
		t.Fatalf("from the file: %+v", c)
	}

	// Flags win; the advertised host follows the overriding listener.
	f, err = parseServeFlags([]string{"--config", path, "--listen", "127.0.0.2:3333", "--admin", "127.0.0.1:4444", "--log-level", "debug"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	c, err = serveConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.2:3333" || c.AdminListen != "127.0.0.1:4444" || c.LogLevel != "debug" || c.AdvertisedHost != "127.0.0.2" {
		t.Fatalf("with flags: %+v", c)
	}

	// A bad flag value is validated like the file's.
	f, _ = parseServeFlags([]string{"--config", path, "--log-level", "loud"}, &stderr)
	if _, err := serveConfig(f); err == nil || !strings.Contains(err.Error(), `log_level "loud"`) {
		t.Fatalf("bad --log-level: %v", err)
	}
}

func TestServeFlagErrors(t *testing.T) {
	var stderr strings.Builder
	if _, err := parseServeFlags(nil, &stderr); err == nil || !strings.Contains(err.Error(), "--config FILE is required") {
		t.Fatalf("no --config: %v", err)
	}
	if _, err := parseServeFlags([]string{"--config", "x", "extra"}, &stderr); err == nil || !strings.Contains(err.Error(), "unexpected arguments") {
		t.Fatalf("extra argument: %v", err)
	}
	f, err := parseServeFlags([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serveConfig(f); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// An admin API other machines reach needs a token, or admin_open: true;
// loopback needs neither.
func TestAdminListenNeedsToken(t *testing.T) {
	const base = "cluster_id: vc\nclusters: [{name: a, bootstrap: [\"k1:9092\"]}]\n"
	for _, addr := range []string{"0.0.0.0:9644", ":9644", "[::]:9644", "10.1.2.3:9644", "ferry-0.example.internal:9644"} {
		_, err := configFrom(base + fmt.Sprintf("admin_listen: %q\n", addr))
		if err == nil {
			t.Errorf("admin_listen %s with no token accepted", addr)
			continue
		}
		for _, w := range []string{fmt.Sprintf("admin_listen %q", addr), "no admin token", "admin_token_file", "FERRY_ADMIN_TOKEN", "127.0.0.1", "admin_open: true"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("admin_listen %s: error %q does not say %q", addr, err, w)
			}
		}
	}
	// The default is 0.0.0.0:9644: a file that says nothing is refused.
	if _, err := configFrom(base); err == nil || !strings.Contains(err.Error(), `admin_listen "0.0.0.0:9644"`) {
		t.Errorf("default admin_listen with no token: %v", err)
	}
	for _, extra := range []string{
		"admin_listen: 127.0.0.1:9644\n",
		"admin_listen: 127.0.0.1:0\n",
		"admin_listen: \"[::1]:9644\"\n",
		"admin_listen: localhost:9644\n",
		"admin_open: true\n",
		"admin_listen: 10.1.2.3:9644\nadmin_open: true\n",
		"admin_token_file: /etc/ferry/admin-token\n",
	} {
		if _, err := configFrom(base + extra); err != nil {
			t.Errorf("%q: %v", extra, err)
		}
	}
}

func TestResolveAdminToken(t *testing.T) {
	files := map[string]string{"/tok": "  s3cret\n", "/empty": " \n"}
	read := func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, fmt.Errorf("open %s: %w", p, os.ErrNotExist)
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "FERRY_ADMIN_TOKEN" {
				return v
			}
			return ""
		}
	}
	for _, tc := range []struct {
		file, env, want, err string
	}{
		{file: "", env: "", want: ""},
		{file: "/tok", env: "", want: "s3cret"},
		{file: "/tok", env: " from-env ", want: "from-env"},   // the environment wins
		{file: "/missing", env: "from-env", want: "from-env"}, // and the file is not read
		{file: "", env: "from-env", want: "from-env"},
		{file: "/missing", env: "", err: "admin_token_file: open /missing: file does not exist"},
		{file: "/empty", env: "", err: "admin_token_file /empty is empty"},
	} {
		c := &Config{AdminTokenFile: tc.file}
		err := c.resolveAdminToken(env(tc.env), read)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("file %q env %q: error %v, want %q", tc.file, tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || c.adminToken != tc.want {
			t.Errorf("file %q env %q: token %q (%v), want %q", tc.file, tc.env, c.adminToken, err, tc.want)
		}
	}
}

// Through `ferry serve`: the token file is read, FERRY_ADMIN_TOKEN alone is
// enough for a non-loopback admin API, and neither is a usage error (exit 2)
// that says how to fix it.
func TestServeAdminToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(text string) string {
		p := filepath.Join(dir, "ferry.yaml")
		if err := os.WriteFile(p, []byte("cluster_id: vc\nclusters: [{name: a, bootstrap: [\"k1:9092\"]}]\n"+text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	load := func(path string) (*Config, error) {
		f, err := parseServeFlags([]string{"--config", path}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		return serveConfig(f)
	}
	t.Setenv("FERRY_ADMIN_TOKEN", "")
	c, err := load(write("admin_token_file: " + tokenFile + "\n"))
	if err != nil || c.adminToken != "from-file" {
		t.Fatalf("token file: %q %v", c.adminToken, err)
	}
	if _, err := load(write("admin_token_file: " + filepath.Join(dir, "nope") + "\n")); err == nil || !errors.As(err, new(usageError)) {
		t.Fatalf("missing token file: %v", err)
	}

	var stderr strings.Builder
	if code := run(context.Background(), []string{"serve", "--config", write("")}, io.Discard, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "no admin token is set") {
		t.Fatalf("no token: exit %d, %s", code, stderr.String())
	}

	t.Setenv("FERRY_ADMIN_TOKEN", "from-env")
	c, err = load(write("admin_token_file: " + tokenFile + "\n"))
	if err != nil || c.adminToken != "from-env" {
		t.Fatalf("env over file: %q %v", c.adminToken, err)
	}
	c, err = load(write(""))
	if err != nil || c.adminToken != "from-env" {
		t.Fatalf("env alone: %q %v", c.adminToken, err)
	}
}

// TestMirrorConnBudget: mirror.max_connections when set, else a quarter of
// the descriptor limit, else (the limit unknown) no budget.
func TestMirrorConnBudget(t *testing.T) {
	for _, c := range []struct {
		configured int
		fds        uint64
		want       int
	}{
		{0, 20000, 5000},
		{0, 1 << 20, 1 << 18},
		{300, 20000, 300},
		{0, 0, 0},
		{0, 1<<63 - 1, 1 << 30}, // RLIM_INFINITY
	} {
		if got := mirrorConnBudget(c.configured, c.fds); got != c.want {
			t.Errorf("mirrorConnBudget(%d, %d) = %d, want %d", c.configured, c.fds, got, c.want)
		}
	}
}
