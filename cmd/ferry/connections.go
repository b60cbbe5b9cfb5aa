package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/connstats"
)

// connectionsTimeout bounds one GET /connections: the member answers from
// memory.
const connectionsTimeout = 10 * time.Second

// watchEvery is how often --watch redraws (a variable for the tests).
var watchEvery = 2 * time.Second

type connectionsFlags struct {
	adminConn
	sort, state                string
	limit                      int
	clientID, software, remote string
	principal                  string
	watch, json                bool
	tokenFile                  string
}

func parseConnectionsFlags(args []string, stderr io.Writer) (*connectionsFlags, error) {
	var f connectionsFlags
	fs := flag.NewFlagSet("ferry connections", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, "the member's admin API, `host:port` (or a URL)")
	fs.StringVar(&f.sort, "sort", "", "order by `FIELD`: "+strings.Join(connstats.Sorts(), ", ")+" (default id; counters largest first)")
	fs.IntVar(&f.limit, "limit", 0, "show at most `N` connections (default 100, at most 1000)")
	fs.StringVar(&f.state, "state", "", "open (default), closed (the last 5 minutes') or all")
	fs.StringVar(&f.clientID, "client-id", "", "only connections whose client.id contains `TEXT`")
	fs.StringVar(&f.software, "software", "", "only connections whose software name/version contains `TEXT`")
	fs.StringVar(&f.remote, "remote", "", "only connections whose remote address contains `TEXT`")
	fs.StringVar(&f.principal, "principal", "", "only connections whose principal (User:NAME) contains `TEXT`")
	fs.BoolVar(&f.watch, "watch", false, "redraw every 2 s until interrupted")
	fs.BoolVar(&f.json, "json", false, "print /connections as the member answers it (JSON)")
	fs.StringVar(&f.tokenFile, "token-file", "", "`file` holding the admin token, which remote addresses, principals and close errors need (default: $"+adminTokenEnv+")")
	setUsage(fs, stderr, "Usage: ferry connections [--admin HOST:PORT] [--sort FIELD] [--limit N] [--watch] [--json] [--token-file F]")
	if err := parseArgs(fs, "connections", args); err != nil {
		return nil, err
	}
	return &f, nil
}

// connectionsCmd prints a member's client connections: a table for a
// person, like top, redrawn with --watch; the JSON as it is with --json.
func connectionsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseConnectionsFlags(args, stderr)
	if err != nil {
		return flagsError(err)
	}
	q := url.Values{}
	for k, v := range map[string]string{"sort": f.sort, "state": f.state, "client_id": f.clientID, "software": f.software, "remote": f.remote, "principal": f.principal} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.limit != 0 {
		q.Set("limit", strconv.Itoa(f.limit))
	}
	endpoint := f.url("/connections")
	if len(q) > 0 {
		endpoint += "?" + q.Encode()
	}
	token, err := cliToken(f.tokenFile)
	if err != nil {
		return usageError{err}
	}
	for {
		if err := printConnectionsOnce(ctx, f, endpoint, token, stdout); err != nil {
			if f.watch && ctx.Err() != nil {
				return nil // interrupted mid-request
			}
			return err
		}
		if !f.watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(watchEvery):
		}
	}
}

func printConnectionsOnce(ctx context.Context, f *connectionsFlags, endpoint, token string, stdout io.Writer) error {
	var ans admin.ConnectionsAnswer
	hc, err := f.client(connectionsTimeout)
	if err != nil {
		return err
	}
	if printed, err := getAdmin(ctx, "connections", endpoint, token, hc, f.json, stdout, &ans); err != nil || printed {
		return err
	}
	if f.watch {
		fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home and clear, as top redraws
	}
	printConnections(stdout, &ans.Report)
	if len(ans.Redacted) > 0 {
		fmt.Fprintf(stdout, "\n%s hidden: give the admin token with --token-file FILE or $%s\n", strings.Join(ans.Redacted, ", "), adminTokenEnv)
	}
	return nil
}

// printConnections writes the connections as a table, one a line.
func printConnections(w io.Writer, cz *connstats.Report) {
	shown := ""
	if n := len(cz.Connections); n > 0 {
		shown = fmt.Sprintf(", showing %d-%d", cz.Offset+1, cz.Offset+n)
	}
	fmt.Fprintf(w, "%s  %d open, %d %s matched%s, by %s\n\n", cz.Now.Local().Format("15:04:05"), cz.Open, cz.Matched, cz.State, shown, cz.Sort)
	if len(cz.Connections) == 0 {
		fmt.Fprintln(w, "no connections")
		return
	}
	closed := cz.State != "open"
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "ID\tREMOTE\tLANE\tCLUSTER\tCLIENT ID\tSOFTWARE\tPRINCIPAL\tAGE\tIDLE\tIN\tOUT\tREQS\tERRS\tINFL\tP50\tP99"
	if closed {
		head += "\tCLOSED"
	}
	fmt.Fprintln(tw, head)
	for _, c := range cz.Connections {
		software := c.SoftwareName
		if c.SoftwareVersion != "" {
			software += "/" + c.SoftwareVersion
		}
		end := cz.Now
		if c.ClosedAt != nil {
			end = *c.ClosedAt
		}
		lane := "-"
		if c.Lane >= 0 {
			lane = strconv.Itoa(c.Lane)
		}
		line := fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s",
			c.ID, dash(c.Remote), lane, dash(c.Cluster), dash(c.ClientID), dash(software), dash(c.Principal),
			age(end.Sub(c.ConnectedAt)), age(time.Duration(c.IdleSeconds*float64(time.Second))),
			humanBytes(c.BytesIn), humanBytes(c.BytesOut), c.RequestsTotal, c.ErrorsTotal, c.InFlight,
			latency(c.LatencyP50Ms, c.LatencySamples), latency(c.LatencyP99Ms, c.LatencySamples))
		if closed {
			reason := "-"
			if c.ClosedAt != nil {
				reason = c.CloseReason + " " + age(cz.Now.Sub(*c.ClosedAt)) + " ago"
			}
			line += "\t" + reason
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// age is a duration to the second, as top shows it.
func age(d time.Duration) string {
	return max(d, 0).Truncate(time.Second).String()
}

func latency(ms float64, samples int) string {
	if samples == 0 {
		return "-"
	}
	switch {
	case ms < 1:
		return fmt.Sprintf("%.0fµs", ms*1000)
	case ms < 1000:
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.1fs", ms/1000)
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
