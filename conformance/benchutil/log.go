package benchutil

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Step logs one line of a benchmark's progress to stderr, with the time.
func Step(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// ParseBytes reads a byte count with an optional binary suffix (KiB, MiB,
// GiB): "1GiB", "256MiB", "1.5GiB".
func ParseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.mult
			break
		}
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, err
	}
	return int64(n * float64(mult)), nil
}

// ChildLogger is the logger of a benchmark's child process (a Ferry or a
// mirror it measures): console lines on stderr at level ("debug", "info",
// ...), warn when level is empty or not one.
func ChildLogger(level string) (*zap.Logger, error) {
	lcfg := zap.NewProductionConfig()
	lcfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	if lvl, err := zap.ParseAtomicLevel(level); err == nil && level != "" {
		lcfg.Level = lvl
	}
	lcfg.Encoding = "console"
	return lcfg.Build()
}
