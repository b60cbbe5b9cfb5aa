package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

const usage = `Usage: ferry <command> [flags]

Commands:
  serve --config FILE   run Ferry in front of the clusters in FILE
  demo                  run Ferry in front of two in-process Kafka clusters
  switchover --to NAME  make NAME the active cluster of a running member
                        (--admin HOST:PORT, --forced, --timeout D, --token-file F)
  status                print a running member's status (--admin HOST:PORT, --json)
  connections           list a running member's client connections, like top
                        (--admin HOST:PORT, --sort FIELD, --limit N, --watch, --json,
                        --token-file F)
  mirror restart        restart halted mirror partitions of a running member
  mirror halt           halt mirror partitions of a topic, to copy it again (RUNBOOK 5.4)
                        (--admin HOST:PORT, --halted | --topic T [--partition N],
                        --json, --token-file F)
  failover pause|resume hold automatic failover off for the whole fleet, or let
                        it act again (--admin HOST:PORT, --reason TEXT, --token-file F)
  failover status       print automatic failover as a member sees it (--admin, --json)
  users add|list|delete manage the SASL/SCRAM credential store
                        (--store FILE, --user NAME; the password on stdin)
  version               print the version

Run 'ferry <command> -h' for a command's flags.
`

// usageError is a mistake in the command line or configuration: exit code 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// flagsError is what a command returns when parsing its flags failed with
// err: nothing after -h (the flag set printed the usage), else a usage
// error.
func flagsError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return usageError{err}
}

// setUsage makes fs's usage (-h, or a flag it cannot parse) the lines
// given, then the flags' defaults, on stderr.
func setUsage(fs *flag.FlagSet, stderr io.Writer, lines ...string) {
	fs.Usage = func() {
		for _, l := range lines {
			fmt.Fprintln(stderr, l)
		}
		fs.PrintDefaults()
	}
}

// parseArgs parses a command's flags; the commands take no other
// arguments. Errors are fs.Parse's (flag.ErrHelp for -h) or a usageError.
func parseArgs(fs *flag.FlagSet, name string, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected arguments %q", name, fs.Args())}
	}
	return nil
}
