package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/routing"
)

// defaultAdminAddr is where the CLI finds a member's admin API when
// --admin is not given: the member on this machine.
const defaultAdminAddr = "127.0.0.1:9644"

type switchoverFlags struct {
	adminConn
	to                   string
	forced               bool
	forceUnauthenticated bool
	timeout              time.Duration
	tokenFile            string
}

func parseSwitchoverFlags(args []string, stderr io.Writer) (*switchoverFlags, error) {
	var f switchoverFlags
	fs := flag.NewFlagSet("ferry switchover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, "the member's admin API, `host:port` (or a URL)")
	fs.StringVar(&f.to, "to", "", "the cluster to make active (required)")
	fs.BoolVar(&f.forced, "forced", false, "switch at once without draining the mirror, the old cluster being unreachable; what the mirror had not copied is lost and listed")
	fs.BoolVar(&f.forceUnauthenticated, "force-unauthenticated", false, "with --forced: switch even when mapped client principals cannot authenticate on the target (they lose their access until they can)")
	fs.DurationVar(&f.timeout, "timeout", routing.DefaultSwitchTimeout, "how long a planned switch may hold writes while the mirror drains; past it the switch rolls back")
	fs.StringVar(&f.tokenFile, "token-file", "", "`file` holding the admin token (default: $"+adminTokenEnv+")")
	setUsage(fs, stderr, "Usage: ferry switchover --to NAME [--admin HOST:PORT] [--forced [--force-unauthenticated]] [--timeout D] [--token-file F]")
	if err := parseArgs(fs, "switchover", args); err != nil {
		return nil, err
	}
	switch {
	case f.to == "":
		return nil, usageError{errors.New("switchover: --to NAME is required: the cluster to make active")}
	case f.forceUnauthenticated && !f.forced:
		return nil, usageError{errors.New("switchover: --force-unauthenticated goes with --forced: a planned switch always checks the mapped principals")}
	case f.timeout <= 0 || f.timeout > admin.MaxSwitchTimeout:
		return nil, usageError{fmt.Errorf("switchover: --timeout %s: must be more than 0 and at most %s", f.timeout, admin.MaxSwitchTimeout)}
	}
	return &f, nil
}

// switchoverCmd asks a member's admin API for a switch and prints the
// outcome: the new routing state (and, forced, what was lost), or why it
// was refused.
func switchoverCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseSwitchoverFlags(args, stderr)
	if err != nil {
		return flagsError(err)
	}
	token, err := cliToken(f.tokenFile)
	if err != nil {
		return usageError{err}
	}
	mode := routing.Planned
	if f.forced {
		mode = routing.Forced
	}
	body, _ := json.Marshal(admin.SwitchRequest{To: f.to, Mode: mode, Timeout: f.timeout.String(), ForceUnauthenticated: f.forceUnauthenticated})
	endpoint := f.url("/switchover")
	// The member answers once the switch is done: at most the drain
	// timeout plus what saving and installing may take.
	hc, err := f.client(f.timeout + admin.SwitchMargin + 15*time.Second)
	if err != nil {
		return err
	}
	resp, raw, err := callAdmin(ctx, "switchover", http.MethodPost, endpoint, body, token, hc)
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("switchover: interrupted; a switch the member had started continues there: see `ferry status`")
		}
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return refusal("switchover to "+f.to, resp, raw)
	}
	var st admin.RoutingStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("switchover: %s answered 200 with %q: %w", endpoint, truncate(raw), err)
	}
	printSwitch(stdout, st)
	return nil
}

// callAdmin sends one request to a member's admin API (body, when not
// nil, as JSON; the token, when not empty, as a bearer token) and returns
// the answer and up to 1 MiB of its body. Its errors start with cmd.
func callAdmin(ctx context.Context, cmd, method, endpoint string, body []byte, token string, hc *http.Client) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, endpoint, rd)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("--admin: %w", err)}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: cannot reach the admin API at %s: %w", cmd, endpoint, unwrapURLErr(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: reading the answer from %s: %w", cmd, endpoint, err)
	}
	return resp, raw, nil
}

// getAdmin GETs a read-only admin endpoint for command cmd, with the token
// when not empty. With asJSON the answer goes to stdout as the member gave
// it and printed is true; otherwise it is decoded into v.
func getAdmin(ctx context.Context, cmd, endpoint, token string, hc *http.Client, asJSON bool, stdout io.Writer, v any) (printed bool, err error) {
	resp, raw, err := callAdmin(ctx, cmd, http.MethodGet, endpoint, nil, token, hc)
	if err != nil {
		return false, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusTooManyRequests:
		return false, refusal(cmd, resp, raw)
	default:
		return false, fmt.Errorf("%s: %s answered %s: %s", cmd, endpoint, resp.Status, truncate(raw))
	}
	if asJSON {
		_, err := stdout.Write(raw)
		return true, err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("%s: %s answered %q: %w", cmd, endpoint, truncate(raw), err)
	}
	return false, nil
}

// printSwitch writes the routing state a switch answered, for a person.
func printSwitch(w io.Writer, st admin.RoutingStatus) {
	l := st.LastSwitch
	if l == nil { // cannot happen after a switch; print what is known
		fmt.Fprintf(w, "Routing: generation %d, active %s.\n", st.Generation, st.Active)
		return
	}
	fmt.Fprintf(w, "Switched from %s to %s (%s) in %s.\n", l.From, l.To, l.Mode, l.Duration)
	fmt.Fprintf(w, "  generation  %d\n", st.Generation)
	fmt.Fprintf(w, "  active      %s\n", st.Active)
	if l.Mode != routing.Forced {
		return
	}
	if len(l.Lost) == 0 {
		fmt.Fprintf(w, "  lost        nothing: %s held every offset %s had\n", l.To, l.From)
		return
	}
	fmt.Fprintf(w, "  lost        offsets %s acknowledged and %s never received, in %d partitions:\n", l.From, l.To, len(l.Lost))
	printLost(w, "    ", l.Lost)
}

func printLost(w io.Writer, indent string, lost []routing.LostRange) {
	width := 0
	for _, r := range lost {
		width = max(width, len(fmt.Sprintf("%s[%d]", r.Topic, r.Partition)))
	}
	for _, r := range lost {
		name := fmt.Sprintf("%s[%d]", r.Topic, r.Partition)
		if r.To == routing.UnknownEnd {
			fmt.Fprintf(w, "%s%-*s  offsets %d on (the old cluster's end unknown)\n", indent, width, name, r.From)
			continue
		}
		fmt.Fprintf(w, "%s%-*s  offsets %d to %d (%d)\n", indent, width, name, r.From, r.To-1, r.To-r.From)
	}
}

// refusal turns an admin API's error answer into the CLI's error: the
// reason, the message and the partitions concerned.
func refusal(what string, resp *http.Response, raw []byte) error {
	var e admin.ErrorBody
	if json.Unmarshal(raw, &e) != nil || e.Error == "" {
		return fmt.Errorf("%s: the admin API answered %s: %s", what, resp.Status, truncate(raw))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s refused (%d %s): %s", what, resp.StatusCode, e.Error, e.Message)
	for _, p := range e.Partitions {
		b.WriteString("\n  " + p)
	}
	for _, p := range e.Principals {
		b.WriteString("\n  " + p)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		fmt.Fprintf(&b, "\n  give the admin token with --token-file FILE or $%s", adminTokenEnv)
	}
	return errors.New(b.String())
}

// cliToken is the admin token the CLI sends: the --token-file's, else
// $FERRY_ADMIN_TOKEN's (a flag given on the command line wins over the
// environment), else none.
func cliToken(file string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(adminTokenEnv)), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("--token-file %s is empty", file)
	}
	return t, nil
}

// adminURL is the base URL of an admin API given as host:port or as a URL.
func adminURL(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimSuffix(addr, "/")
	}
	return "http://" + addr
}

// unwrapURLErr drops net/http's `Post "http://…":` prefix, which repeats
// the address the message already names.
func unwrapURLErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func truncate(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
