package membership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// handlers installs the test kinds: echo answers "<member> got <body>
// from <caller>", fail refuses, hang answers only when its context ends.
func handlers(m *member) {
	m.Handle("echo", func(ctx context.Context, from int32, body []byte) ([]byte, error) {
		return fmt.Appendf(nil, "%d got %s from %d", m.id, body, from), nil
	})
	m.Handle("fail", func(ctx context.Context, from int32, body []byte) ([]byte, error) {
		return nil, fmt.Errorf("member %d says no", m.id)
	})
	m.Handle("hang", func(ctx context.Context, from int32, body []byte) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	m.Handle("panic", func(ctx context.Context, from int32, body []byte) ([]byte, error) {
		panic("boom")
	})
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

func TestCallRoundTrip(t *testing.T) {
	a, b, c := threeMembers(t)
	for _, m := range []*member{a, b, c} {
		handlers(m)
	}
	ctx := callCtx(t)

	got, err := a.Call(ctx, 2, "echo", []byte("hold"))
	if err != nil || string(got) != "2 got hold from 1" {
		t.Errorf("Call(2, echo) = %q, %v", got, err)
	}
	got, err = a.Call(ctx, 1, "echo", []byte("self"))
	if err != nil || string(got) != "1 got self from 1" {
		t.Errorf("Call(self, echo) = %q, %v", got, err)
	}
	big := bytes.Repeat([]byte("x"), 200_000) // well past a UDP packet
	got, err = b.Call(ctx, 3, "echo", big)
	if err != nil || !bytes.HasSuffix(got, []byte("x from 2")) || len(got) != len(big)+len("3 got  from 2") {
		t.Errorf("Call(3, echo, 200 kB) = %d bytes, %v", len(got), err)
	}

	_, err = a.Call(ctx, 3, "fail", nil)
	var re *RemoteError
	if !errors.As(err, &re) || re.NodeID != 3 || re.Kind != "fail" || re.Message != "member 3 says no" {
		t.Errorf("Call(3, fail) error = %v", err)
	} else if !strings.Contains(err.Error(), "member 3") {
		t.Errorf("error does not name the member: %v", err)
	}
	if _, err := a.Call(ctx, 2, "nosuch", nil); !errors.As(err, &re) || !strings.Contains(re.Message, "no handler") {
		t.Errorf("Call(2, nosuch) error = %v", err)
	}
	if _, err := a.Call(ctx, 2, "panic", nil); !errors.As(err, &re) || !strings.Contains(re.Message, "panicked") {
		t.Errorf("Call(2, panic) error = %v", err)
	}
	if _, err := a.Call(ctx, 2, "echo", nil); err != nil {
		t.Errorf("member 2 no longer answers after a handler panicked: %v", err)
	}
	if _, err := a.Call(ctx, 9, "echo", nil); err == nil || !strings.Contains(err.Error(), "not a live member") {
		t.Errorf("Call(9) error = %v", err)
	}

	replies := a.CallAll(ctx, "echo", []byte("all"))
	if len(replies) != 3 {
		t.Fatalf("CallAll: %d replies", len(replies))
	}
	for i, r := range replies {
		want := fmt.Sprintf("%d got all from 1", i+1)
		if r.NodeID != int32(i+1) || r.Err != nil || string(r.Body) != want {
			t.Errorf("CallAll reply %d = {%d %q %v}, want %q", i, r.NodeID, r.Body, r.Err, want)
		}
	}
	replies = c.CallAll(ctx, "fail", nil)
	for _, r := range replies {
		if !errors.As(r.Err, &re) || re.NodeID != r.NodeID {
			t.Errorf("CallAll(fail) reply from %d: %v", r.NodeID, r.Err)
		}
	}

	if n := testutil.ToFloat64(a.metrics.calls.WithLabelValues("echo", outcomeOK)); n != 6 {
		t.Errorf("ferry_fleet_calls_total{kind=echo,outcome=ok} = %v, want 6", n)
	}
	if n := testutil.ToFloat64(a.metrics.calls.WithLabelValues("fail", outcomeRefused)); n != 1 {
		t.Errorf("ferry_fleet_calls_total{kind=fail,outcome=refused} = %v, want 1", n)
	}
	if n := testutil.CollectAndCount(a.metrics.duration); n == 0 {
		t.Error("no call latency observed")
	}
}

func TestCallTimeouts(t *testing.T) {
	a, b, c := threeMembers(t)
	for _, m := range []*member{a, b, c} {
		handlers(m)
	}

	// A member that does not answer: the call ends with its context, and
	// the handler's context ends with the caller's deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := a.Call(ctx, 2, "hang", nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "member 2") {
		t.Errorf("Call(2, hang) error = %v", err)
	}
	if d := time.Since(began); d > patience/2 {
		t.Errorf("Call(2, hang) took %v", d)
	}
	if n := testutil.ToFloat64(a.metrics.calls.WithLabelValues("hang", outcomeTimeout)); n != 1 {
		t.Errorf("ferry_fleet_calls_total{kind=hang,outcome=timeout} = %v", n)
	}
	testwait.Eventually(t, patience, "member 2's handler ends with the caller's deadline", func() error {
		if len(b.sem) != 0 {
			return fmt.Errorf("%d handlers running", len(b.sem))
		}
		return nil
	})

	// A member that dies during a call: the call ends when it is found
	// dead, before its context.
	ctx2, cancel2 := context.WithTimeout(context.Background(), patience)
	defer cancel2()
	hung := make(chan error, 1)
	go func() {
		_, err := a.Call(ctx2, 3, "hang", nil)
		hung <- err
	}()
	testwait.Eventually(t, patience, "member 3 serving the call", func() error {
		if len(c.sem) != 1 {
			return fmt.Errorf("%d handlers running", len(c.sem))
		}
		return nil
	})
	c.kill()
	select {
	case err := <-hung:
		if err == nil || !strings.Contains(err.Error(), "member 3 died or left") || ctx2.Err() != nil {
			t.Errorf("call to a member that died: %v (context: %v)", err, ctx2.Err())
		}
	case <-ctx2.Done():
		t.Fatal("the call to a dead member lasted until its context ended")
	}
	if x, _ := a.stateOf(3); x.State != Dead {
		t.Errorf("member 3 is %s", x.State)
	}

	// Calls to a dead member fail at once; CallAll answers for the others.
	if _, err := a.Call(callCtx(t), 3, "echo", nil); err == nil || !strings.Contains(err.Error(), "not a live member") {
		t.Errorf("Call to a dead member: %v", err)
	}
	if n := testutil.ToFloat64(a.metrics.calls.WithLabelValues("echo", outcomeUnreachable)); n != 1 {
		t.Errorf("ferry_fleet_calls_total{kind=echo,outcome=unreachable} = %v", n)
	}
	replies := a.CallAll(callCtx(t), "echo", nil)
	if len(replies) != 2 || replies[0].Err != nil || replies[1].Err != nil {
		t.Errorf("CallAll without member 3: %+v", replies)
	}

	// A call after Close.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Call(callCtx(t), 1, "echo", nil); err == nil {
		t.Error("Call after Close succeeded")
	}
}

// TestControlCallsNotStarvedByAFlood: with every handler slot of the other
// kinds taken by calls that do not end (transactional forwarding waiting
// on a broker), a call of a control kind (a switch's hold) is still served,
// and one more call of the flooded kind is answered busy at once, nothing
// run, rather than dropped for its caller to wait out its deadline. Both
// are counted, on the caller (outcome busy) and on the member called.
func TestControlCallsNotStarvedByAFlood(t *testing.T) {
	a := start(t, testConfig(), testMeta(1))
	b := start(t, testConfig(a.selfAddr), testMeta(2))
	a.sees(1, 2)
	b.sees(1, 2)
	release := make(chan struct{})
	var ran atomic.Int32
	b.Handle("txn", func(ctx context.Context, _ int32, _ []byte) ([]byte, error) {
		ran.Add(1)
		select {
		case <-release:
			return []byte("forwarded"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	b.HandleControl("hold", func(context.Context, int32, []byte) ([]byte, error) {
		return []byte("held"), nil
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	flood := make(chan error, maxHandlers)
	for range maxHandlers {
		go func() {
			_, err := a.Call(callCtx(t), 2, "txn", nil)
			flood <- err
		}()
	}
	testwait.Eventually(t, patience, "member 2 running a full lane of forwarding calls", func() error {
		if n := ran.Load(); n != maxHandlers {
			return fmt.Errorf("%d handlers running", n)
		}
		return nil
	})

	// Generous deadlines: a dropped call would fail only at its end.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := a.Call(ctx, 2, "hold", nil)
	if err != nil || string(got) != "held" {
		t.Fatalf("a hold during the flood: %q, %v", got, err)
	}
	_, err = a.Call(ctx, 2, "txn", nil)
	if !errors.Is(err, ErrBusy) || ctx.Err() != nil || !strings.Contains(err.Error(), "member 2") {
		t.Fatalf("a call past the lane's slots: %v (context: %v); want ErrBusy naming member 2 before the deadline", err, ctx.Err())
	}
	if n := ran.Load(); n != maxHandlers {
		t.Fatalf("the call answered busy ran anyway: %d handlers ran", n)
	}
	if n := testutil.ToFloat64(a.metrics.calls.WithLabelValues("txn", outcomeBusy)); n != 1 {
		t.Errorf("ferry_fleet_calls_total{kind=txn,outcome=busy} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(b.metrics.busy.WithLabelValues("txn")); n != 1 {
		t.Errorf("ferry_fleet_calls_busy_total{kind=txn} on member 2 = %v, want 1", n)
	}
	if n := testutil.ToFloat64(a.metrics.calls.WithLabelValues("hold", outcomeOK)); n != 1 {
		t.Errorf("ferry_fleet_calls_total{kind=hold,outcome=ok} = %v, want 1", n)
	}

	close(release)
	for range maxHandlers {
		if err := <-flood; err != nil {
			t.Errorf("a forwarding call of the flood: %v", err)
		}
	}
	// The slots are free again: the kind is served.
	if got, err := a.Call(ctx, 2, "txn", nil); err != nil || string(got) != "forwarded" {
		t.Errorf("after the flood: %q, %v", got, err)
	}
}

// TestControlCallRetriedWhenBusy: a switch-control call refused busy (its
// lane full) is sent again until there is room, within its deadline,
// rather than failing the switch's step at once; each refusal is counted.
func TestControlCallRetriedWhenBusy(t *testing.T) {
	a := start(t, testConfig(), testMeta(1))
	b := start(t, testConfig(a.selfAddr), testMeta(2))
	a.sees(1, 2)
	b.sees(1, 2)
	release := make(chan struct{})
	var ran atomic.Int32
	for _, m := range []*member{a, b} {
		m.HandleControl("install", func(ctx context.Context, _ int32, _ []byte) ([]byte, error) {
			ran.Add(1)
			select {
			case <-release:
				return []byte("installed"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	done := make(chan error, maxControlHandlers+1)
	call := func() {
		got, err := a.Call(callCtx(t), 2, "install", nil)
		if err == nil && string(got) != "installed" {
			err = fmt.Errorf("answered %q", got)
		}
		done <- err
	}
	for range maxControlHandlers {
		go call()
	}
	testwait.Eventually(t, patience, "member 2 running a full control lane", func() error {
		if n := ran.Load(); n != maxControlHandlers {
			return fmt.Errorf("%d control handlers running", n)
		}
		return nil
	})
	go call()
	testwait.Eventually(t, patience, "member 2 answering the extra call busy", func() error {
		if n := testutil.ToFloat64(b.metrics.busy.WithLabelValues("install")); n < 1 {
			return fmt.Errorf("%v calls answered busy", n)
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("a control call ended while the lane was full: %v; want it retried until there is room", err)
	default:
	}
	close(release)
	released = true
	for range maxControlHandlers + 1 {
		if err := <-done; err != nil {
			t.Errorf("a control call: %v", err)
		}
	}
	if n := testutil.ToFloat64(a.metrics.calls.WithLabelValues("install", outcomeOK)); n != maxControlHandlers+1 {
		t.Errorf("ferry_fleet_calls_total{kind=install,outcome=ok} = %v, want %d", n, maxControlHandlers+1)
	}
	if n := testutil.ToFloat64(a.metrics.calls.WithLabelValues("install", outcomeBusy)); n < 1 {
		t.Errorf("ferry_fleet_calls_total{kind=install,outcome=busy} = %v, want the refusals counted", n)
	}
}

// TestCallAllDoesNotWaitForAMemberGone: a member that stops being alive
// while it holds a call is not waited for: CallAll returns, well before
// its context ends, with the others' answers and ErrNotAlive for it, from
// the moment gossip finds it suspect (a call alone ends only once it is
// dead).
func TestCallAllDoesNotWaitForAMemberGone(t *testing.T) {
	a, b, c := threeMembers(t)
	for _, m := range []*member{a, b, c} {
		m.Handle("answer-unless-3", func(ctx context.Context, from int32, body []byte) ([]byte, error) {
			if m.id == 3 {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return fmt.Appendf(nil, "%d", m.id), nil
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	done := make(chan []Reply, 1)
	go func() { done <- a.CallAll(ctx, "answer-unless-3", nil) }()
	testwait.Eventually(t, patience, "member 3 serving the call", func() error {
		if len(c.sem) != 1 {
			return fmt.Errorf("%d handlers running", len(c.sem))
		}
		return nil
	})
	c.kill()
	var replies []Reply
	select {
	case replies = <-done:
	case <-ctx.Done():
		t.Fatal("CallAll waited for a member that died until its context ended")
	}
	if len(replies) != 3 {
		t.Fatalf("CallAll: %d replies, want 3: %+v", len(replies), replies)
	}
	for i, want := range []string{"1", "2"} {
		if r := replies[i]; r.Err != nil || string(r.Body) != want || r.NodeID != int32(i+1) {
			t.Errorf("reply %d: {%d %q %v}, want %q from member %d", i, r.NodeID, r.Body, r.Err, want, i+1)
		}
	}
	// Gossip finds member 3 suspect before dead; Call alone would wait
	// for dead.
	if r := replies[2]; r.NodeID != 3 || !errors.Is(r.Err, ErrNotAlive) {
		t.Errorf("member 3's reply: {%d %q %v}, want ErrNotAlive", r.NodeID, r.Body, r.Err)
	}
}
