package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/failover"
)

type failoverFlags struct {
	adminConn
	reason    string
	json      bool
	tokenFile string
}

func parseFailoverFlags(verb string, args []string, stderr io.Writer) (*failoverFlags, error) {
	var f failoverFlags
	fs := flag.NewFlagSet("ferry failover "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, "the member's admin API, `host:port` (or a URL); in a fleet any member")
	fs.BoolVar(&f.json, "json", false, "print the answer as the member gives it (JSON)")
	usage := "Usage: ferry failover " + verb + " [--admin HOST:PORT] [--json]"
	if verb != "status" {
		fs.StringVar(&f.tokenFile, "token-file", "", "`file` holding the admin token (default: $"+adminTokenEnv+")")
		usage += " [--token-file F]"
	}
	if verb == "pause" {
		fs.StringVar(&f.reason, "reason", "", "why, for whoever reads the status (a maintenance window, a ticket)")
		usage += " [--reason TEXT]"
	}
	setUsage(fs, stderr, usage)
	if err := parseArgs(fs, "failover "+verb, args); err != nil {
		return nil, err
	}
	return &f, nil
}

// failoverCmd runs `ferry failover pause|resume|status`.
func failoverCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("failover: want a subcommand: pause, resume or status")}
	}
	verb := args[0]
	switch verb {
	case "pause", "resume", "status":
	default:
		return usageError{fmt.Errorf("failover: unknown subcommand %q: want pause, resume or status", verb)}
	}
	f, err := parseFailoverFlags(verb, args[1:], stderr)
	if err != nil {
		return flagsError(err)
	}
	if verb == "status" {
		hc, err := f.client(statusTimeout)
		if err != nil {
			return err
		}
		var st failover.Status
		if printed, err := getAdmin(ctx, "failover status", f.url("/failover"), "", hc, f.json, stdout, &st); err != nil || printed {
			return err
		}
		printFailover(stdout, &st)
		return nil
	}
	var req any = struct{}{}
	if verb == "pause" {
		req = admin.FailoverPauseRequest{Reason: f.reason}
	}
	return mirrorCall(ctx, "failover "+verb, "/failover/"+verb, f.adminConn, f.tokenFile, f.json, req, stdout,
		func(w io.Writer, res admin.FailoverAnswer) {
			if p := res.Paused; p != nil {
				fmt.Fprintf(w, "Automatic failover is paused (since %s", p.At.Format(time.RFC3339))
				if p.Reason != "" {
					fmt.Fprintf(w, ": %s", p.Reason)
				}
				fmt.Fprintf(w, "), in generation %d, active %s.\n", res.Routing.Generation, res.Routing.Active)
				return
			}
			fmt.Fprintf(w, "Automatic failover is on, in generation %d, active %s.\n", res.Routing.Generation, res.Routing.Active)
		},
		func(admin.FailoverAnswer) int { return 0 })
}

// printFailover writes the detector's state for a person.
func printFailover(w io.Writer, st *failover.Status) {
	line := func(key, format string, args ...any) {
		fmt.Fprintf(w, "%-10s %s\n", key, fmt.Sprintf(format, args...))
	}
	var budget []string
	if st.MaxLossRecords >= 0 {
		budget = append(budget, fmt.Sprintf("%d records", st.MaxLossRecords))
	}
	if st.MaxLossSeconds >= 0 {
		budget = append(budget, fmt.Sprintf("%g s", st.MaxLossSeconds))
	}
	line("policy", "after %s, max loss %s, min interval %s", st.After, strings.Join(budget, " and "), st.MinInterval)
	v := st.View
	reach := "reached"
	if v.DownMillis > 0 {
		reach = fmt.Sprintf("unreachable for %s (%s)", (time.Duration(v.DownMillis) * time.Millisecond).Round(100*time.Millisecond), v.Error)
	}
	standby := "answers"
	if !v.StandbyUp {
		standby = "does not answer"
	}
	line("view", "member %d, generation %d: active %s %s; standby %s %s", v.Member, v.Generation, v.Active, reach, v.Standby, standby)
	if v.LagKnown {
		line("lag", "%d records, %.1f s (at the last read of the active cluster)", v.LagRecords, v.LagSeconds)
	} else {
		line("lag", "unknown")
	}
	if len(v.Known) > 0 {
		var ks []string
		for _, k := range v.Known {
			ks = append(ks, fmt.Sprintf("member %d %d records, %.1f s", k.Member, k.Records, k.Seconds))
		}
		line("readings", "%s (the members' last own readings, kept for one restarted after a failure)", strings.Join(ks, "; "))
	}
	line("actor", "member %d decides", st.Actor)
	if vd := st.Verdict; vd != nil {
		what := "waits"
		switch {
		case vd.Act:
			what = "switches"
		case vd.Blocked:
			what = "BLOCKED, a person must decide"
		}
		line("verdict", "%s: %s", what, vd.Reason)
		if st.ActInSeconds != nil {
			line("", "would act in %.0f s", *st.ActInSeconds)
		}
	}
	if a := st.LastAttempt; a != nil {
		line("attempt", "%s to %s: %s", a.At.Format(time.RFC3339), a.To, a.Outcome)
	}
}
