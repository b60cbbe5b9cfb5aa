package logsample

import (
	"testing"
	"time"
)

func TestLogSamplerCountsSuppressed(t *testing.T) {
	now := time.Unix(0, 0)
	l := New(10 * time.Second)
	l.now = func() time.Time { return now }
	if _, ok := l.Allow("bad_frame"); !ok {
		t.Fatal("first line suppressed")
	}
	for i := 0; i < 5; i++ {
		if _, ok := l.Allow("bad_frame"); ok {
			t.Fatal("a second line within the interval")
		}
	}
	if _, ok := l.Allow("sasl"); !ok {
		t.Fatal("another reason's first line suppressed")
	}
	now = now.Add(10 * time.Second)
	if n, ok := l.Allow("bad_frame"); !ok || n != 5 {
		t.Fatalf("after the interval: allowed %v, suppressed %d; want true, 5", ok, n)
	}
}
