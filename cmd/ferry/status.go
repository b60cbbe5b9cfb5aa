package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/routing"
)

// statusTimeout bounds GET /status: the member probes each cluster (1 s
// each, cached briefly) before it answers.
const statusTimeout = 15 * time.Second

type statusFlags struct {
	adminConn
	json bool
}

func parseStatusFlags(args []string, stderr io.Writer) (*statusFlags, error) {
	var f statusFlags
	fs := flag.NewFlagSet("ferry status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, "the member's admin API, `host:port` (or a URL)")
	fs.BoolVar(&f.json, "json", false, "print /status as the member answers it (JSON)")
	setUsage(fs, stderr, "Usage: ferry status [--admin HOST:PORT] [--json]")
	if err := parseArgs(fs, "status", args); err != nil {
		return nil, err
	}
	return &f, nil
}

// statusCmd prints a member's /status: a summary for a person, or the JSON
// as it is with --json.
func statusCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseStatusFlags(args, stderr)
	if err != nil {
		return flagsError(err)
	}
	var st admin.Status
	hc, err := f.client(statusTimeout)
	if err != nil {
		return err
	}
	if printed, err := getAdmin(ctx, "status", f.url("/status"), "", hc, f.json, stdout, &st); err != nil || printed {
		return err
	}
	printStatus(stdout, &st)
	return nil
}

// printStatus writes the summary of a member's status, one topic a line.
// statusHistoryLines is how many earlier switches `ferry status` prints.
const statusHistoryLines = 5

func printStatus(w io.Writer, st *admin.Status) {
	line := func(key, format string, args ...any) {
		fmt.Fprintf(w, "%-10s %s\n", key, fmt.Sprintf(format, args...))
	}
	n := st.Node
	line("node", "%d of virtual cluster %s, advertised %s, version %s, up %s",
		n.ID, n.ClusterID, n.Advertised, st.Version, (time.Duration(st.UptimeSeconds) * time.Second).String())
	if st.Ready {
		line("ready", "yes")
	} else {
		line("ready", "no: %s", st.NotReady)
	}
	r := st.Routing
	line("routing", "generation %d, active %s, %s", r.Generation, r.Active, r.Phase)
	if l := r.LastSwitch; l != nil {
		outcome := l.Outcome
		if outcome == "" {
			outcome = "running"
		}
		took := ""
		if l.Duration != "" {
			took = ", took " + l.Duration
		}
		line("last", "%s switch %s -> %s at %s%s: %s", switchMode(l), l.From, l.To, l.Started.Format(time.RFC3339), took, outcome)
		if len(l.Lost) > 0 {
			fmt.Fprintf(w, "%-10s lost %d ranges:\n", "", len(l.Lost))
			printLost(w, "             ", l.Lost)
		}
	} else {
		line("last", "no switch yet")
	}
	// The switches before it, newest first: a few, the rest in --json.
	for i, h := range r.History[:min(len(r.History), statusHistoryLines)] {
		key := ""
		if i == 0 {
			key = "earlier"
		}
		lost := ""
		if h.LostRanges > 0 {
			lost = fmt.Sprintf(", lost %d ranges", h.LostRanges)
		}
		line(key, "%s switch %s -> %s at %s, took %s: %s%s", switchMode(&h), h.From, h.To, h.Started.Format(time.RFC3339), h.Duration, h.Outcome, lost)
	}
	if n := len(r.History) - statusHistoryLines; n > 0 {
		line("", "and %d more (--json)", n)
	}
	for i, c := range st.Clusters {
		key := ""
		if i == 0 {
			key = "clusters"
		}
		state := "reachable"
		if !c.Reachable {
			state = "unreachable: " + c.Error
		}
		if c.Active {
			state += " (active)"
		}
		line(key, "%s %s", c.Name, state)
	}
	m := st.Mirror
	switch {
	case !m.Enabled:
		line("mirror", "disabled")
	case !m.Running:
		line("mirror", "enabled, not running (starting, or stopped for a switchover)")
	default:
		s := m.Summary
		line("mirror", "running %s -> %s: %d partitions, %d caught up, %d halted, max lag %d offsets / %.1fs",
			m.Source, m.Target, s.Partitions, s.CaughtUp, s.Halted, s.MaxLagRecords, s.MaxLagSeconds)
		for _, p := range m.Partitions {
			if p.State == "halted" {
				fmt.Fprintf(w, "%-10s halted %s[%d]: %s\n", "", p.Topic, p.Partition, p.Error)
			}
		}
	}
	if f := st.Failover; f != nil {
		state := "automatic, after " + f.After
		if p := r.FailoverPaused; p != nil {
			state += ", PAUSED since " + p.At.Format(time.RFC3339)
			if p.Reason != "" {
				state += ": " + p.Reason
			}
		}
		if v := f.Verdict; v != nil && (v.Blocked || v.Act) {
			state += "; " + v.Reason
		}
		line("failover", "%s (ferry failover status)", state)
	}
}

// switchMode is a switch's mode as `ferry status` names it: "automatic
// forced" for one the fleet decided on itself.
func switchMode(sw *routing.Switch) string {
	if sw.Automatic {
		return "automatic " + string(sw.Mode)
	}
	return string(sw.Mode)
}
