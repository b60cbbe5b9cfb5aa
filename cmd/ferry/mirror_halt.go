package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/mirror"
)

// callMirrorHalt: each member halts the writers it runs (POST /mirror/halt
// on any member reaches every one).
const callMirrorHalt = "mirror.halt"

// Halt runs a POST /mirror/halt request against this member's running
// mirror (see admin.HaltLocal).
func (r *mirrorRunner) Halt(req admin.MirrorHaltRequest, node int32) admin.MirrorHaltResult {
	return runMirrorAction(r, req, node, admin.HaltLocal, (*mirror.Mirror).Halt)
}

// mirrorHalt is POST /mirror/halt: on its own the member halts its
// writers; in a fleet every live member halts those it runs, and the
// answers are merged.
func (n *node) mirrorHalt(ctx context.Context, req admin.MirrorHaltRequest) (admin.MirrorHaltResult, error) {
	return serveMirrorAction(ctx, n, req, callMirrorHalt, admin.MergeHalt, (*mirrorRunner).Halt)
}

// handleMirrorHalt answers another member's callMirrorHalt.
func (n *node) handleMirrorHalt(_ context.Context, _ int32, body []byte) ([]byte, error) {
	none := admin.MirrorHaltResult{Halted: []admin.HaltedPartition{}, Refused: []admin.RefusedPartition{}}
	return answerMirrorAction(n, body, "halt", none, (*mirrorRunner).Halt)
}

func parseMirrorHaltFlags(args []string, stderr io.Writer) (*mirrorFlags, error) {
	var f mirrorFlags
	fs := f.flagSet("halt", "halt every partition of this `topic` (with --partition: that one partition)", stderr)
	setUsage(fs, stderr, "Usage: ferry mirror halt [--admin HOST:PORT] --topic T [--partition N] [--json] [--token-file F]")
	if err := parseArgs(fs, "mirror halt", args); err != nil {
		return nil, err
	}
	switch {
	case f.topic == "":
		return nil, usageError{errors.New("mirror halt: say what to halt: --topic T [--partition N]")}
	case f.partition < -1:
		return nil, usageError{fmt.Errorf("mirror halt: --partition %d: must be 0 or more", f.partition)}
	}
	return &f, nil
}

// mirrorHaltCmd asks a member's admin API to halt mirror partitions and
// prints what was halted and what refused. It exits 1 when anything was
// refused.
func mirrorHaltCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseMirrorHaltFlags(args, stderr)
	if err != nil {
		return flagsError(err)
	}
	req := admin.MirrorHaltRequest{Topic: f.topic}
	if f.partition >= 0 {
		req = admin.MirrorHaltRequest{Partitions: []admin.TopicPartition{{Topic: f.topic, Partition: int32(f.partition)}}}
	}
	return mirrorCall(ctx, "mirror halt", "/mirror/halt", f.adminConn, f.tokenFile, f.json, req, stdout,
		func(w io.Writer, res admin.MirrorHaltResult) { printHalt(w, f.topic, res) },
		func(res admin.MirrorHaltResult) int { return len(res.Refused) })
}

func printHalt(w io.Writer, topic string, res admin.MirrorHaltResult) {
	if len(res.Halted) == 0 && len(res.Refused) == 0 {
		fmt.Fprintf(w, "No mirrored partition of %s to halt.\n", topic)
		return
	}
	if len(res.Halted) > 0 {
		fmt.Fprintf(w, "Halted %d partitions: their writers append nothing more until restarted (ferry mirror restart).\n", len(res.Halted))
		for _, p := range res.Halted {
			was := p.Was
			if p.HaltReason != "" {
				was += " (" + p.HaltReason + ")"
			}
			fmt.Fprintf(w, "  %s[%d]  member %d, was %s, standby end %d\n", p.Topic, p.Partition, p.Member, was, p.MirroredOffset)
		}
	}
	if len(res.Refused) > 0 {
		fmt.Fprintf(w, "Refused %d partitions:\n", len(res.Refused))
		for _, p := range res.Refused {
			fmt.Fprintf(w, "  %s[%d]  %s: %s\n", p.Topic, p.Partition, p.Reason, p.Message)
		}
	}
}
