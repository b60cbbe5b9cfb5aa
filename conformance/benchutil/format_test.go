package benchutil

import (
	"testing"
	"time"
)

func TestSpread(t *testing.T) {
	if m, lo, hi := Spread([]time.Duration{3, 1, 2, 5}); m != 3 || lo != 1 || hi != 5 {
		t.Errorf("Spread(3 1 2 5) = %v %v %v; want 3 1 5 (the upper median of an even count)", m, lo, hi)
	}
	xs := []int{2, 1, 3}
	if m, lo, hi := Spread(xs); m != 2 || lo != 1 || hi != 3 || xs[0] != 2 {
		t.Errorf("Spread(2 1 3) = %v %v %v, xs now %v; want 2 1 3 and xs untouched", m, lo, hi, xs)
	}
	if m, lo, hi := Spread[float64](nil); m != 0 || lo != 0 || hi != 0 {
		t.Errorf("Spread(nil) = %v %v %v; want zeros", m, lo, hi)
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Ratio(3, 2), "1.50×"},
		{Ratio(1, 0), "–"},
		{Verdict(true), "PASS"},
		{Verdict(false), "FAIL"},
		{HumanBytes(2 << 30), "2 GiB"},
		{HumanBytes(3 << 30 / 2), "1536 MiB"},
		{HumanBytes(256 << 20), "256 MiB"},
		{HumanBytes(64 << 10), "64 KiB"},
	} {
		if c.got != c.want {
			t.Errorf("got %q; want %q", c.got, c.want)
		}
	}
}
