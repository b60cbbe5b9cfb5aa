package conformance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// streamsRefusedCommits is how many commits TestStreamsCommitRefused has
// Ferry refuse.
const streamsRefusedCommits = 3

// TestStreamsCommitRefused: the commit of a transaction a switch aborted
// (begun before the switch, its offsets sent then, its EndTxn after) is
// refused by Ferry; a Kafka Streams application takes the refusal as a
// task migration and goes on, its thread never dying, and counts every
// input record exactly once. No switch can be timed between a Streams
// transaction's offsets and its commit, so a member built with -tags
// faults refuses its first commits as it refuses such a commit
// (FERRY_FAULT_STREAMS_COMMITS, proxy/faults.go): a Streams producer gets
// INVALID_PRODUCER_EPOCH (proxy/txn_remap.go, streamsProducer). With
// UNKNOWN_PRODUCER_ID, the answer every other client gets, each refusal
// ended a stream thread (an uncaught "Error encountered trying to commit a
// transaction"; the application's handler replaces it, Streams' default
// stops the application).
func TestStreamsCommitRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("conformance: real Kafka and client programs are not run in -short mode")
	}
	var cp string
	var cpErr error
	compiled := make(chan struct{})
	kafkaJars := kafkatest.JarDir(t)
	go func() { defer close(compiled); cp, cpErr = streamsClassPath(kafkaJars) }()
	bin, primary, standby := startPair(t, "streams-refused-primary", "streams-refused-standby", "faults")
	<-compiled
	if cpErr != nil {
		t.Fatalf("building StreamsApp: %v", cpErr)
	}
	t.Setenv("FERRY_FAULT_STREAMS_COMMITS", fmt.Sprint(streamsRefusedCommits))
	f := startFerryWith(t, bin, primary, standby, nil, "policy: {allow: [records_delete]}\n")

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sfx := randomSuffix()
	app := "ferry-streams-refused-" + sfx
	input, output, changelog := "streams-in-"+sfx, "streams-out-"+sfx, app+"-counts-changelog"
	createStreamsTopics(ctx, t, f.addr, input, output)
	prod := newStreamsProducer(t, f.addr, input)
	defer prod.stop(t)
	a := startStreamsApp(ctx, t, cp, f.addr, app, input, output, "classic")
	defer func() {
		if t.Failed() {
			a.mu.Lock()
			t.Logf("StreamsApp: states %v, uncaught %q, stderr:\n%s", a.states, a.uncaught, tail(a.stderr.String(), 4000))
			keepLog(t, "streams-refused-app.stderr", a.stderr.String())
			a.mu.Unlock()
		}
	}()
	a.waitState(t, "RUNNING", 90*time.Second)
	prod.start()

	refused := func() int {
		b, _ := os.ReadFile(f.log)
		return bytes.Count(b, []byte("fault injected: a Kafka Streams commit refused"))
	}
	testwait.Eventually(t, 90*time.Second, "Ferry to refuse the application's first commits", func() error {
		if n := refused(); n < streamsRefusedCommits {
			time.Sleep(200 * time.Millisecond)
			return fmt.Errorf("%d commits refused, want %d; app states %v", n, streamsRefusedCommits, a.stateList())
		}
		return nil
	})
	outputs := func() int { return len(readCommitted(t, ctx, primary, []string{output})[output]) }
	want := outputs() + streamsProgress
	testwait.Eventually(t, 90*time.Second, "the application to process after the refusals", func() error {
		if n := outputs(); n < want {
			time.Sleep(400 * time.Millisecond)
			return fmt.Errorf("%d output records, want %d; app states %v", n, want, a.stateList())
		}
		return nil
	})
	prod.stop(t)
	testwait.Eventually(t, 90*time.Second, "every input record counted", func() error {
		got := readCommitted(t, ctx, primary, []string{input, output})
		if short := streamsShort(got[input], got[output]); len(short) > 0 {
			time.Sleep(400 * time.Millisecond)
			return fmt.Errorf("keys counted short of their input (key: counted/input): %v", short)
		}
		return nil
	})
	a.stop(t)

	a.mu.Lock()
	states, uncaught := slices.Clone(a.states), slices.Clone(a.uncaught)
	a.mu.Unlock()
	t.Logf("StreamsApp: states %v, uncaught exceptions %d %q; %d commits refused", states, len(uncaught), uncaught, refused())
	if len(uncaught) > 0 || slices.Contains(states, "ERROR") {
		t.Errorf("the refused commits ended stream threads (%d uncaught: %q) or the application (states %v); want task migrations only", len(uncaught), uncaught, states)
	}
	if n := refused(); n != streamsRefusedCommits {
		t.Errorf("%d commits refused, want %d", n, streamsRefusedCommits)
	}
	acked, perr := prod.result()
	if perr != nil {
		t.Errorf("input producer through Ferry: %v", perr)
	}
	got := readCommitted(t, ctx, primary, []string{input, output, changelog})
	checkStreamsCounts(t, "primary", acked, got[input], got[output], got[changelog])
}
