package benchutil

import (
	"testing"

	"go.uber.org/zap/zapcore"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"1GiB": 1 << 30, "256MiB": 256 << 20, "1.5GiB": 3 << 29, "64KiB": 64 << 10, "1000": 1000} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "1XiB", "one"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q): no error", bad)
		}
	}
}

func TestChildLoggerLevel(t *testing.T) {
	for level, want := range map[string]zapcore.Level{"": zapcore.WarnLevel, "debug": zapcore.DebugLevel, "error": zapcore.ErrorLevel, "loud": zapcore.WarnLevel} {
		log, err := ChildLogger(level)
		if err != nil {
			t.Fatalf("ChildLogger(%q): %v", level, err)
		}
		if got := log.Level(); got != want {
			t.Errorf("ChildLogger(%q) logs at %v; want %v", level, got, want)
		}
	}
}
