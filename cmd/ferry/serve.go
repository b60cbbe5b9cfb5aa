package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap"
)

// serveFlags are the flags of `ferry serve`; a flag that is set overrides the
// file's value.
type serveFlags struct {
	config   string
	listen   string
	admin    string
	logLevel string
	mirror   optionalBool
	// printConfig prints the configuration in force and exits.
	printConfig bool
}

// optionalBool is a boolean flag that remembers whether it was set, so an
// unset flag leaves the file's value alone.
type optionalBool struct{ v *bool }

func (b *optionalBool) String() string {
	if b == nil || b.v == nil {
		return ""
	}
	return strconv.FormatBool(*b.v)
}

func (b *optionalBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true or false")
	}
	b.v = &v
	return nil
}

func (b *optionalBool) IsBoolFlag() bool { return true }

func parseServeFlags(args []string, stderr io.Writer) (*serveFlags, error) {
	var f serveFlags
	fs := flag.NewFlagSet("ferry serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "configuration `file` (YAML; see README.md)")
	fs.StringVar(&f.listen, "listen", "", "Kafka listener `host:port` (overrides listen)")
	fs.StringVar(&f.admin, "admin", "", "admin API `host:port` (overrides admin_listen)")
	fs.StringVar(&f.logLevel, "log-level", "", "debug, info, warn or error (overrides log_level)")
	fs.Var(&f.mirror, "mirror", "run the mirror: --mirror or --mirror=false (overrides mirror.enabled)")
	fs.BoolVar(&f.printConfig, "print-config", false, "print the configuration in force (file, FERRY_* environment, flags, defaults) as YAML, and exit")
	setUsage(fs, stderr,
		"Usage: ferry serve --config FILE [--listen HOST:PORT] [--admin HOST:PORT] [--log-level LEVEL] [--mirror=BOOL] [--print-config]",
		"Every key of the file can be set by FERRY_<KEY> (README.md); flags win over the environment, the environment over the file.",
	)
	if err := parseArgs(fs, "serve", args); err != nil {
		return nil, err
	}
	if f.config == "" {
		return nil, usageError{errors.New("serve: --config FILE is required")}
	}
	return &f, nil
}

// serveConfig loads the file, applies the FERRY_* environment over it, the
// flags over that, then the defaults, and validates the result.
func serveConfig(f *serveFlags) (*Config, error) {
	return serveConfigEnv(f, os.Environ())
}

// serveConfigEnv is serveConfig with the environment environ (KEY=VALUE).
func serveConfigEnv(f *serveFlags, environ []string) (*Config, error) {
	cfg, err := loadConfig(f.config)
	if err != nil {
		return nil, usageError{err}
	}
	if err := cfg.applyEnv(environ); err != nil {
		return nil, usageError{err}
	}
	if f.listen != "" {
		cfg.Listen = f.listen
	}
	if f.admin != "" {
		cfg.AdminListen = f.admin
	}
	if f.logLevel != "" {
		cfg.LogLevel = f.logLevel
	}
	if f.mirror.v != nil {
		cfg.Mirror.Enabled = f.mirror.v
	}
	cfg.applyDefaults(os.Hostname)
	if err := cfg.resolveAdminToken(envLookup(environ), os.ReadFile); err != nil {
		return nil, usageError{fmt.Errorf("%s: %w", f.config, err)}
	}
	if err := cfg.validate(); err != nil {
		return nil, usageError{fmt.Errorf("%s: %w", f.config, err)}
	}
	return cfg, nil
}

// envLookup is os.Getenv over environ.
func envLookup(environ []string) func(string) string {
	return func(key string) string {
		for i := len(environ) - 1; i >= 0; i-- {
			if k, v, ok := strings.Cut(environ[i], "="); ok && k == key {
				return v
			}
		}
		return ""
	}
}

// serveCmd runs Ferry against the configured clusters until ctx ends
// (SIGINT or SIGTERM). An unreachable cluster is logged and retried, not
// fatal.
func serveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseServeFlags(args, stderr)
	if err != nil {
		return flagsError(err)
	}
	cfg, err := serveConfig(f)
	if err != nil {
		return err
	}
	if f.printConfig {
		return printConfig(stdout, cfg)
	}
	log, level, err := newLeveledLogger(cfg.LogLevel)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr cannot always sync
	// SIGHUP reloads the configuration from here on.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	rl := newReloader(f, cfg, level, log)
	hupCtx, hupDone := context.WithCancel(ctx)
	defer hupDone()
	go func() {
		for {
			select {
			case <-hupCtx.Done():
				return
			case <-hup:
				rl.reload(os.Environ())
			}
		}
	}()
	log.Info("starting ferry", zap.String("version", version()), zap.String("config", f.config),
		zap.String("cluster_id", cfg.ClusterID), zap.Int32("node_id", cfg.NodeID))
	if err := checkAdminConnections(cfg.AdminMaxConnections, raiseFDLimit(log)); err != nil {
		return usageError{fmt.Errorf("%s: %w", f.config, err)}
	}

	n, err := newNode(cfg, log)
	if err != nil {
		return err
	}
	defer n.Close()
	rl.attach(n)
	if err := n.start(ctx); err != nil {
		if ctx.Err() != nil {
			log.Info("stopped before the clusters could be reached", zap.Error(err))
			return nil
		}
		return err
	}
	err = n.wait(ctx)
	log.Info("shutting down", zap.Bool("signal", ctx.Err() != nil))
	lameDuck, timeout := rl.shutdownTimeouts()
	sctx, cancel := context.WithTimeout(context.Background(), lameDuck+timeout)
	n.shutdown(sctx)
	cancel()
	log.Info("stopped")
	return err
}
