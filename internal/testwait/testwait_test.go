package testwait

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}

func run(f func(tb testing.TB)) (failed string) {
	r := &recorder{}
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
		failed = r.failed
	}()
	f(r)
	return ""
}

// TestEventually: a condition that comes true is waited for; one that
// does not fails with what was awaited and its last error, after the time
// given and not long after.
func TestEventually(t *testing.T) {
	n := 0
	if failed := run(func(tb testing.TB) {
		Eventually(tb, time.Second, "three polls", func() error {
			if n++; n < 3 {
				return errors.New("not three")
			}
			return nil
		})
	}); failed != "" || n != 3 {
		t.Fatalf("a condition true at the third poll: failed %q after %d polls", failed, n)
	}
	start := time.Now()
	failed := run(func(tb testing.TB) {
		Until(tb, 300*time.Millisecond, "never", func() bool { return false })
	})
	if took := time.Since(start); took < 300*time.Millisecond || took > 2*time.Second {
		t.Errorf("a condition never true failed after %v, want about 300ms", took)
	}
	if !strings.Contains(failed, "never") || !strings.Contains(failed, "not yet") {
		t.Errorf("failure %q does not say what was awaited and why", failed)
	}
}
