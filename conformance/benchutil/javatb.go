package benchutil

import (
	"fmt"
	"sync"
	"testing"
)

// JavaTB adapts kafkatest.JavaCmd and kafkatest.Classpath, written for
// tests, to a benchmark program: the only testing.TB methods they call are
// Helper, Fatalf, Logf, Name and Cleanup. Fatalf panics with a value that
// RecoverJava turns back into an error; Close runs what Cleanup registered,
// last first (for a JavaCmd: the SIGKILL of the JVM's process group).
type JavaTB struct {
	testing.TB // nil: any other method panics
	name       string
	logf       func(format string, args ...any)

	mu       sync.Mutex
	cleanups []func()
}

// NewJavaTB returns a JavaTB named name that logs through logf.
func NewJavaTB(name string, logf func(format string, args ...any)) *JavaTB {
	return &JavaTB{name: name, logf: logf}
}

type javaFatal struct{ err error }

func (t *JavaTB) Helper()      {}
func (t *JavaTB) Name() string { return t.name }
func (t *JavaTB) Fatalf(format string, args ...any) {
	panic(javaFatal{fmt.Errorf(format, args...)})
}
func (t *JavaTB) Logf(format string, args ...any) { t.logf(t.name+": "+format, args...) }
func (t *JavaTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// Close runs the registered cleanups, last first. Safe to call twice.
func (t *JavaTB) Close() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// RecoverJava, deferred, turns a JavaTB's Fatalf into *err; any other
// panic goes on. It reports whether it recovered one.
func RecoverJava(r any, err *error) bool {
	if r == nil {
		return false
	}
	f, ok := r.(javaFatal)
	if !ok {
		panic(r)
	}
	*err = f.err
	return true
}
