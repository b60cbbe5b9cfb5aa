// Command ferry runs Ferry, a Kafka-protocol gateway: one virtual Kafka
// cluster in front of two physical ones.
//
//	ferry serve --config FILE   run against real clusters
//	ferry demo                  run in front of two in-process clusters
//	ferry switchover --to NAME  switch a running member's active cluster (its admin API)
//	ferry status                print a running member's status (its admin API)
//	ferry connections           list a running member's client connections, like top
//	ferry mirror restart        restart halted mirror partitions (its admin API)
//	ferry mirror halt           halt mirror partitions of a topic (its admin API)
//	ferry users add|list|delete manage the SASL credential store
//	ferry version               print the version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go stopOnSignals(sigs, cancel, os.Stderr, os.Exit)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	signal.Stop(sigs)
	cancel()
	os.Exit(code)
}

// exitForced is the exit status after a second SIGINT or SIGTERM cut a
// graceful stop short: 1, failed while running, since requests in flight
// may have gone unanswered.
const exitForced = 1

// stopOnSignals cancels the command at the first signal (SIGINT or
// SIGTERM: stop gracefully, draining), and exits at once at the second,
// for an operator who will not wait for the drain.
func stopOnSignals(sigs <-chan os.Signal, cancel context.CancelFunc, stderr io.Writer, exit func(int)) {
	<-sigs
	cancel()
	s := <-sigs
	fmt.Fprintf(stderr, "ferry: second signal (%v) while stopping: exiting now, without waiting for requests in flight\n", s)
	exit(exitForced)
}

// run executes one command and returns the process exit code: 0 done,
// 1 failed while running, 2 bad usage or configuration.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serveCmd(ctx, args[1:], stdout, stderr)
	case "demo":
		err = demoCmd(ctx, args[1:], stdout, stderr)
	case "switchover":
		err = switchoverCmd(ctx, args[1:], stdout, stderr)
	case "status":
		err = statusCmd(ctx, args[1:], stdout, stderr)
	case "connections":
		err = connectionsCmd(ctx, args[1:], stdout, stderr)
	case "mirror":
		err = mirrorCmd(ctx, args[1:], stdout, stderr)
	case "failover":
		err = failoverCmd(ctx, args[1:], stdout, stderr)
	case "users":
		err = usersCmd(args[1:], os.Stdin, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "ferry", version())
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "ferry: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "ferry:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "ferry:", err)
		return 1
	}
}
