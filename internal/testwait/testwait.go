// Package testwait is the tests' one way to wait for a condition: poll
// it, often at first and then less (1 ms doubling up to 100 ms), and fail
// the test with what was awaited and the condition's last word once the
// time given has passed.
package testwait

import (
	"errors"
	"testing"
	"time"
)

// maxPoll bounds the pause between two polls.
const maxPoll = 100 * time.Millisecond

// Eventually polls cond until it returns nil, and fails t with cond's last
// error if it has not within timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, maxPoll)
	}
}

// Until is Eventually for a condition that only says whether it holds.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	Eventually(t, timeout, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

var errNotYet = errors.New("not yet")
