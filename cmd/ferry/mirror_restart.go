package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/membership"
	"github.com/ferry-gw/ferry/mirror"
)

// Restart runs a POST /mirror/restart request against this member's
// running mirror (see admin.RestartLocal). node is this member's node ID.
// With no mirror running, explicitly named partitions are refused as
// mirror_not_running and a selection finds nothing.
func (r *mirrorRunner) Restart(req admin.MirrorRestartRequest, node int32) admin.MirrorRestartResult {
	return runMirrorAction(r, req, node, admin.RestartLocal, (*mirror.Mirror).Restart)
}

// mirrorRestart is POST /mirror/restart. On its own, the member restarts
// its writers. In a fleet the request goes to every live member (this one
// included) over the fleet's calls, each restarts the halted writers it
// runs (a member runs only the writers of the partitions it owns), and the
// answers are merged: a partition is restarted by whichever member writes
// it, so the operator may ask any member.
func (n *node) mirrorRestart(ctx context.Context, req admin.MirrorRestartRequest) (admin.MirrorRestartResult, error) {
	return serveMirrorAction(ctx, n, req, callMirrorRestart, admin.MergeRestart, (*mirrorRunner).Restart)
}

// handleMirrorRestart answers another member's callMirrorRestart.
func (n *node) handleMirrorRestart(_ context.Context, _ int32, body []byte) ([]byte, error) {
	none := admin.MirrorRestartResult{Restarted: []admin.RestartedPartition{}, Refused: []admin.RefusedPartition{}}
	return answerMirrorAction(n, body, "restart", none, (*mirrorRunner).Restart)
}

// callMerged sends req to every live member's handler of kind (this
// member's included) and merges the answers that decode.
func callMerged[T any](ctx context.Context, f *fleetRole, kind string, req any, merge func(...T) T) (T, error) {
	var zero T
	body, err := json.Marshal(req)
	if err != nil {
		return zero, err
	}
	answers, failed, unreached := f.callLive(ctx, kind, body)
	for id, err := range failed {
		f.log.Warn("a member did not answer", zap.String("call", kind), zap.Int32("member", id), zap.Error(err))
	}
	if len(answers) == 0 {
		if err := membership.FirstErr(failed); err != nil {
			return zero, err
		}
		return zero, fmt.Errorf("no member answered (unreached: %v)", unreached)
	}
	var rs []T
	for id, b := range answers {
		var r T
		if err := json.Unmarshal(b, &r); err != nil {
			f.log.Warn("a member's answer", zap.String("call", kind), zap.Int32("member", id), zap.Error(err))
			continue
		}
		rs = append(rs, r)
	}
	return merge(rs...), nil
}

// mirrorFlags are the flags `ferry mirror restart` and `ferry mirror
// halt` share.
type mirrorFlags struct {
	adminConn
	topic     string
	partition int
	json      bool
	tokenFile string
}

// flagSet is the flag set of `ferry mirror verb`, with the shared flags;
// topicUse says what --topic selects.
func (f *mirrorFlags) flagSet(verb, topicUse string, stderr io.Writer) *flag.FlagSet {
	f.partition = -1
	fs := flag.NewFlagSet("ferry mirror "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs, "the member's admin API, `host:port` (or a URL); in a fleet any member")
	fs.StringVar(&f.topic, "topic", "", topicUse)
	fs.IntVar(&f.partition, "partition", -1, "with --topic, the partition `N` to "+verb)
	fs.BoolVar(&f.json, "json", false, "print the answer as the member gives it (JSON)")
	fs.StringVar(&f.tokenFile, "token-file", "", "`file` holding the admin token (default: $"+adminTokenEnv+")")
	return fs
}

type mirrorRestartFlags struct {
	mirrorFlags
	halted bool
}

func parseMirrorRestartFlags(args []string, stderr io.Writer) (*mirrorRestartFlags, error) {
	var f mirrorRestartFlags
	fs := f.flagSet("restart", "restart the halted partitions of this `topic` (with --partition: that one partition)", stderr)
	fs.BoolVar(&f.halted, "halted", false, "restart every halted partition")
	setUsage(fs, stderr, "Usage: ferry mirror restart [--admin HOST:PORT] (--halted | --topic T [--partition N]) [--json] [--token-file F]")
	if err := parseArgs(fs, "mirror restart", args); err != nil {
		return nil, err
	}
	switch {
	case f.halted && f.topic != "":
		return nil, usageError{errors.New("mirror restart: --halted and --topic exclude each other")}
	case !f.halted && f.topic == "":
		return nil, usageError{errors.New("mirror restart: say what to restart: --halted, or --topic T [--partition N]")}
	case f.partition >= 0 && f.topic == "":
		return nil, usageError{errors.New("mirror restart: --partition needs --topic")}
	case f.partition < -1:
		return nil, usageError{fmt.Errorf("mirror restart: --partition %d: must be 0 or more", f.partition)}
	}
	return &f, nil
}

// mirrorCmd runs `ferry mirror SUBCOMMAND`.
func mirrorCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "restart":
			return mirrorRestartCmd(ctx, args[1:], stdout, stderr)
		case "halt":
			return mirrorHaltCmd(ctx, args[1:], stdout, stderr)
		}
	}
	return usageError{errors.New("mirror: want a subcommand: restart or halt")}
}

// mirrorRestartCmd asks a member's admin API to restart halted mirror
// partitions and prints what was restarted and what refused. It exits 1 when
// anything was refused.
func mirrorRestartCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseMirrorRestartFlags(args, stderr)
	if err != nil {
		return flagsError(err)
	}
	var req admin.MirrorRestartRequest
	switch {
	case f.halted:
		req.Halted = true
	case f.partition >= 0:
		req.Partitions = []admin.TopicPartition{{Topic: f.topic, Partition: int32(f.partition)}}
	default:
		req.Topic = f.topic
	}
	return mirrorCall(ctx, "mirror restart", "/mirror/restart", f.adminConn, f.tokenFile, f.json, req, stdout,
		func(w io.Writer, res admin.MirrorRestartResult) { printRestart(w, req, res) },
		func(res admin.MirrorRestartResult) int { return len(res.Refused) })
}

// mirrorCall posts req to the member's admin API at path for `ferry what`,
// prints a 200's answer (as given with asJSON, else with print), and fails
// when the answer refused anything.
func mirrorCall[Res any](ctx context.Context, what, path string, c adminConn, tokenFile string, asJSON bool, req any, stdout io.Writer,
	print func(io.Writer, Res), refused func(Res) int) error {
	token, err := cliToken(tokenFile)
	if err != nil {
		return usageError{err}
	}
	body, _ := json.Marshal(req)
	endpoint := c.url(path)
	hc, err := c.client(45 * time.Second)
	if err != nil {
		return err
	}
	resp, raw, err := callAdmin(ctx, what, http.MethodPost, endpoint, body, token, hc)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return refusal(what, resp, raw)
	}
	var res Res
	if err := json.Unmarshal(raw, &res); err != nil {
		return fmt.Errorf("%s: %s answered 200 with %q: %w", what, endpoint, truncate(raw), err)
	}
	if asJSON {
		if _, err := stdout.Write(raw); err != nil {
			return err
		}
	} else {
		print(stdout, res)
	}
	if n := refused(res); n > 0 {
		return fmt.Errorf("%s: %d partitions refused", what, n)
	}
	return nil
}

func printRestart(w io.Writer, req admin.MirrorRestartRequest, res admin.MirrorRestartResult) {
	if len(res.Restarted) == 0 && len(res.Refused) == 0 {
		if req.Topic != "" {
			fmt.Fprintf(w, "No halted partition of %s to restart.\n", req.Topic)
		} else {
			fmt.Fprintln(w, "No halted partition to restart.")
		}
		return
	}
	if len(res.Restarted) > 0 {
		fmt.Fprintf(w, "Restarted %d partitions: each has a new writer, which checks the standby again and halts again if the cause is still there (see ferry status).\n", len(res.Restarted))
		for _, p := range res.Restarted {
			fmt.Fprintf(w, "  %s[%d]  member %d, was %s: %s\n", p.Topic, p.Partition, p.Member, p.HaltReason, p.Error)
		}
	}
	if len(res.Refused) > 0 {
		fmt.Fprintf(w, "Refused %d partitions:\n", len(res.Refused))
		for _, p := range res.Refused {
			fmt.Fprintf(w, "  %s[%d]  %s: %s\n", p.Topic, p.Partition, p.Reason, p.Message)
		}
	}
}
