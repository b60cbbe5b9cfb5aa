package benchutil

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// Run runs f, the benchmark called name, and exits 1 if f fails. The first
// SIGINT or SIGTERM cancels f's context, so that f's deferred steps stop
// what it started (what they stop is named by stopping, e.g. "Ferry and
// Kafka"). If that hangs, a second signal or 30 seconds exits at once: the
// child processes and JVMs die with this process (parent-death signal), and
// kafkatest reaps their directories later.
func Run(name, stopping string, f func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigc
		fmt.Fprintf(os.Stderr, "\n%s: %v: stopping %s\n", name, s, stopping)
		cancel()
		select {
		case <-sigc:
		case <-time.After(30 * time.Second):
		}
		os.Exit(130)
	}()
	err := f(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Main parses the command line with parse and runs the benchmark called
// name, in directory dir (e.g. "./conformance/bench"), with Run: run gets
// the parsed options and the Command that reproduces the run. -h has
// printed the usage and exits 0; a bad command line exits 2.
func Main[O any](name, dir, stopping string, parse func(args []string) (O, error), run func(ctx context.Context, o O, command string) error) {
	opts, err := parse(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(2)
	}
	Run(name, stopping, func(ctx context.Context) error {
		return run(ctx, opts, Command(dir, os.Args[1:]))
	})
}

// Command is how to reproduce a run of the benchmark in dir (e.g.
// "./conformance/bench") with args.
func Command(dir string, args []string) string {
	return strings.Join(append([]string{"go run " + dir}, args...), " ")
}
