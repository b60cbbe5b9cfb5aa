package main

import (
	"fmt"
	"io"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"gopkg.in/yaml.v3"
)

// reloadable are the keys SIGHUP applies to a running member. Every other
// key is read once, when the member starts: the proxy, the mirror, the
// fleet and the admin API copy their settings when they are built and
// have no way to change them safely while they run, so a change there is
// logged as needing a restart and left alone.
var reloadable = map[string]bool{
	"log_level": true,
}

// reloader applies a configuration read again (SIGHUP) to a running member.
type reloader struct {
	flags *serveFlags
	level zap.AtomicLevel
	log   *zap.Logger

	mu sync.Mutex
	// inForce is the configuration the member runs with: the one it
	// started with, and the reloadable keys as last reloaded. A key that
	// needs a restart keeps its starting value here, so every reload says
	// again that it is pending.
	inForce Config
}

func newReloader(f *serveFlags, cfg *Config, level zap.AtomicLevel, log *zap.Logger) *reloader {
	return &reloader{flags: f, level: level, log: log, inForce: *cfg}
}

// reload reads the file and the environment again as serve did at start
// (the same flags still win), validates them, and applies what changed and
// can be applied: one line says what was applied, and one which changed
// keys need a restart. A configuration that does not validate changes
// nothing and is logged as an error.
func (r *reloader) reload(environ []string) (applied, restart []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next, err := serveConfigEnv(r.flags, environ)
	if err != nil {
		r.log.Error("configuration not reloaded: it is not valid, nothing changed", zap.String("config", r.flags.config), zap.Error(err))
		return nil, nil
	}
	var setLevel func()
	newLevel := r.level.Level()
	for _, key := range configDiff(&r.inForce, next) {
		if !reloadable[key] {
			restart = append(restart, key)
			continue
		}
		applied = append(applied, key)
		switch key {
		case "log_level":
			newLevel, _ = zapcore.ParseLevel(next.LogLevel) // validated
			r.inForce.LogLevel = next.LogLevel
			setLevel = func() { r.level.SetLevel(newLevel) }
		}
	}
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
	if len(restart) > 0 {
		r.log.Warn("configuration changes need a restart to take effect; the member runs on with the values it started with",
			zap.String("config", r.flags.config), zap.Strings("restart_needed", restart))
	}
	return applied, restart
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
