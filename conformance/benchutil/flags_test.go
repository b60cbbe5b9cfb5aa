package benchutil

import (
	"flag"
	"io"
	"testing"
	"time"
)

func TestLoadFlags(t *testing.T) {
	l := Load{Duration: 20 * time.Second, Warmup: 10 * time.Second, Records: 1000, Rounds: 3, Partitions: 6, Size: 1024}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l.Flags(fs, LoadHelp{Duration: "d", Warmup: "w", Rounds: "r"})
	if err := fs.Parse([]string{"-duration", "3s", "-rounds", "1"}); err != nil {
		t.Fatal(err)
	}
	want := Load{Duration: 3 * time.Second, Warmup: 10 * time.Second, Records: 1000, Rounds: 1, Partitions: 6, Size: 1024}
	if l != want {
		t.Fatalf("after parsing: %+v; want %+v (the unset flags keep their defaults)", l, want)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("Check(%+v) = %v", l, err)
	}
	for _, bad := range []Load{
		{Duration: 0, Records: 1, Rounds: 1, Partitions: 1, Size: 1},
		{Duration: 1, Warmup: -1, Records: 1, Rounds: 1, Partitions: 1, Size: 1},
		{Duration: 1, Records: 0, Rounds: 1, Partitions: 1, Size: 1},
		{Duration: 1, Records: 1, Rounds: 0, Partitions: 1, Size: 1},
		{Duration: 1, Records: 1, Rounds: 1, Partitions: 0, Size: 1},
		{Duration: 1, Records: 1, Rounds: 1, Partitions: 1, Size: 0},
	} {
		if bad.Check() == nil {
			t.Errorf("Check(%+v): no error", bad)
		}
	}
}
