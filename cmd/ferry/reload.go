package main

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"gopkg.in/yaml.v3"

	"github.com/ferry-gw/ferry/proxy"
)

// reloadable are the keys SIGHUP applies to a running member: the log
// level, the client connection limits and timeouts (proxy.Settings), the
// lame-duck and shutdown timeouts, and the mirror's topic and group
// filters; and `clusters` when one of two is retired (retiring). Every
// other key is read once, when the member starts: the proxy,
// the mirror, the fleet and the admin API copy those settings when they are
// built and have no way to change them safely while they run, so a change
// there is logged as needing a restart and left alone.
var reloadable = map[string]bool{
	"log_level":        true,
	"shutdown_timeout": true,
}

// proxyKeys are the reloadable keys of proxy.Settings.
var proxyKeys = []string{"connections_max_idle", "request_read_timeout", "client_write_timeout",
	"max_connections", "max_connections_per_ip", "max_connections_per_ip_overrides", "lame_duck_duration"}

// mirrorKeys are the reloadable keys of the mirror's filters.
var mirrorKeys = []string{"mirror.topics.include", "mirror.topics.exclude", "mirror.groups.include", "mirror.groups.exclude"}

func init() {
	for _, k := range slices.Concat(proxyKeys, mirrorKeys) {
		reloadable[k] = true
	}
}

// reloadTarget is what a reload changes in a running member (the node).
type reloadTarget interface {
	setProxySettings(proxy.Settings) error
	// setMirrorFilters reports false, changing nothing, while a
	// switchover is in progress: the switch drains the running mirror.
	setMirrorFilters(topics, groups Selection) (bool, error)
	// retireCluster stops serving a cluster (node.retireCluster).
	retireCluster(name string) error
}

// retiring reports the cluster next takes out of cur's when that is all it
// changes of them: two clusters become one, the one left as it was. Such a
// reload retires the cluster while the member runs (the migration's last
// step); any other change of `clusters` needs a restart.
func retiring(cur, next *Config) (string, bool) {
	if len(cur.Clusters) != 2 || len(next.Clusters) != 1 {
		return "", false
	}
	for i, c := range cur.Clusters {
		if reflect.DeepEqual(c, next.Clusters[0]) {
			return cur.Clusters[1-i].Name, true
		}
	}
	return "", false
}

// retireKey reports whether key is one a retire applies: the clusters, the
// active one (the one left), and the mirror and automatic failover, which
// have nothing to do with one cluster and stop.
func retireKey(key string) bool {
	return key == "clusters" || key == "active" || strings.HasPrefix(key, "mirror.") || strings.HasPrefix(key, "failover.")
}

// reloader applies a configuration read again (SIGHUP) to a running member.
type reloader struct {
	flags *serveFlags
	level zap.AtomicLevel
	log   *zap.Logger

	mu sync.Mutex
	// target is nil until the member is built: a reload before then
	// applies only the log level.
	target reloadTarget
	// inForce is the configuration the member runs with: the one it
	// started with, and the reloadable keys as last reloaded. A key that
	// needs a restart, or could not be applied, keeps its value here, so
	// every reload says again that it is pending.
	inForce Config
}

func newReloader(f *serveFlags, cfg *Config, level zap.AtomicLevel, log *zap.Logger) *reloader {
	return &reloader{flags: f, level: level, log: log, inForce: *cfg}
}

// attach makes later reloads apply to the member t.
func (r *reloader) attach(t reloadTarget) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = t
}

// shutdownTimeouts are the lame-duck period and the shutdown timeout in
// force.
func (r *reloader) shutdownTimeouts() (lameDuck, timeout time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return *r.inForce.LameDuckDuration, r.inForce.ShutdownTimeout
}

// reload reads the file and the environment again as serve did at start
// (the same flags still win), validates them, and applies what changed and
// can be applied: one line says what was applied, one which changed keys
// need a restart, one which could not be applied now (and are tried again
// at the next reload). A configuration that does not validate changes
// nothing and is logged as an error.
func (r *reloader) reload(environ []string) (applied, restart []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next, err := serveConfigEnv(r.flags, environ)
	if err != nil {
		r.log.Error("configuration not reloaded: it is not valid, nothing changed", zap.String("config", r.flags.config), zap.Error(err))
		return nil, nil
	}
	changed := map[string]bool{}
	var pending []string // reloadable, changed, not applied now
	retire, retires := retiring(&r.inForce, next)
	var retireKeys []string
	for _, key := range configDiff(&r.inForce, next) {
		if retires && retireKey(key) {
			retireKeys = append(retireKeys, key)
			continue
		}
		if reloadable[key] {
			changed[key] = true
		} else {
			restart = append(restart, key)
		}
	}
	take := func(keys []string, ok bool) {
		for _, k := range keys {
			if !changed[k] {
				continue
			}
			if ok {
				applied = append(applied, k)
			} else {
				pending = append(pending, k)
			}
		}
	}
	if retires {
		ok := r.target != nil
		if ok {
			if err := r.target.retireCluster(retire); err != nil {
				r.log.Error("cluster not retired", zap.String("cluster", retire), zap.Error(err))
				ok = false
			}
		}
		if ok {
			r.inForce.Clusters, r.inForce.Active = next.Clusters, next.Active
			r.inForce.Mirror, r.inForce.Failover = next.Mirror, next.Failover
			applied = append(applied, retireKeys...)
		} else {
			pending = append(pending, retireKeys...)
		}
	}
	if anyOf(changed, proxyKeys) {
		ok := r.target != nil
		if ok {
			if err := r.target.setProxySettings(proxySettings(next)); err != nil {
				r.log.Error("client connection settings not reloaded", zap.Error(err))
				ok = false
			}
		}
		if ok {
			copyProxyKeys(&r.inForce, next)
		}
		take(proxyKeys, ok)
	}
	if anyOf(changed, mirrorKeys) {
		ok := r.target != nil
		if ok {
			done, err := r.target.setMirrorFilters(next.Mirror.Topics, next.Mirror.Groups)
			if err != nil {
				r.log.Error("mirror filters not reloaded", zap.Error(err))
			}
			ok = done && err == nil
		}
		if ok {
			r.inForce.Mirror.Topics, r.inForce.Mirror.Groups = next.Mirror.Topics, next.Mirror.Groups
		}
		take(mirrorKeys, ok)
	}
	if changed["shutdown_timeout"] {
		r.inForce.ShutdownTimeout = next.ShutdownTimeout
		applied = append(applied, "shutdown_timeout")
	}
	var setLevel func()
	newLevel := r.level.Level()
	if changed["log_level"] {
		newLevel, _ = zapcore.ParseLevel(next.LogLevel) // validated
		r.inForce.LogLevel = next.LogLevel
		setLevel = func() { r.level.SetLevel(newLevel) }
		applied = append(applied, "log_level")
	}
	slices.Sort(applied)
	// Said at the level in force before, or after when that is the more
	// verbose: the line is seen whichever way the level went.
	line := func() {
		r.log.Info("configuration reloaded", zap.String("config", r.flags.config),
			zap.Strings("applied", nonNil(applied)), zap.String("log_level", r.inForce.LogLevel))
	}
	if setLevel != nil && newLevel > r.level.Level() {
		line()
		setLevel()
	} else {
		if setLevel != nil {
			setLevel()
		}
		line()
	}
	if len(pending) > 0 {
		r.log.Warn("configuration changes not applied now (the member is starting, a switchover is in progress, or they were refused); send SIGHUP again to retry",
			zap.String("config", r.flags.config), zap.Strings("not_applied", pending))
	}
	if len(restart) > 0 {
		r.log.Warn("configuration changes need a restart to take effect; the member runs on with the values it started with",
			zap.String("config", r.flags.config), zap.Strings("restart_needed", restart))
	}
	return applied, restart
}

func anyOf(set map[string]bool, keys []string) bool {
	return slices.ContainsFunc(keys, func(k string) bool { return set[k] })
}

// proxySettings are the proxy's reloadable settings in cfg.
func proxySettings(cfg *Config) proxy.Settings {
	return proxy.Settings{
		ConnectionsMaxIdle:  cfg.ConnectionsMaxIdle,
		RequestReadTimeout:  cfg.RequestReadTimeout,
		WriteTimeout:        cfg.ClientWriteTimeout,
		MaxConnections:      cfg.MaxConnections,
		MaxConnectionsPerIP: cfg.MaxConnectionsPerIP,
		PerIPOverrides:      cfg.MaxConnectionsPerIPOverrides,
		LameDuck:            *cfg.LameDuckDuration,
	}
}

// copyProxyKeys sets the keys of proxySettings in dst from src.
func copyProxyKeys(dst, src *Config) {
	dst.ConnectionsMaxIdle, dst.RequestReadTimeout, dst.ClientWriteTimeout = src.ConnectionsMaxIdle, src.RequestReadTimeout, src.ClientWriteTimeout
	dst.MaxConnections, dst.MaxConnectionsPerIP, dst.MaxConnectionsPerIPOverrides = src.MaxConnections, src.MaxConnectionsPerIP, src.MaxConnectionsPerIPOverrides
	dst.LameDuckDuration = src.LameDuckDuration
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// printConfig writes cfg as YAML: every key, defaults filled in. The admin
// token itself is never printed (only admin_token_file, a path).
func printConfig(w io.Writer, cfg *Config) error {
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "# ferry %s: the configuration in force (file, FERRY_* environment, flags, defaults)\n%s", version(), b)
	return err
}
