package main

import (
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestFlagsError(t *testing.T) {
	if err := flagsError(flag.ErrHelp); err != nil {
		t.Errorf("flagsError(ErrHelp) = %v; want nil: -h is no mistake", err)
	}
	bad := errors.New("flag provided but not defined: -x")
	var ue usageError
	if err := flagsError(bad); !errors.As(err, &ue) || !errors.Is(err, bad) {
		t.Errorf("flagsError(%v) = %#v; want a usageError wrapping it", bad, err)
	}
}

func TestSetUsage(t *testing.T) {
	var out strings.Builder
	fs := flag.NewFlagSet("ferry x", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.Bool("json", false, "print JSON")
	setUsage(fs, &out, "Usage: ferry x [--json]", "A second line.")
	if err := fs.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-h) = %v; want ErrHelp", err)
	}
	want := "Usage: ferry x [--json]\nA second line.\n  -json\n    \tprint JSON\n"
	if out.String() != want {
		t.Errorf("usage printed %q; want %q", out.String(), want)
	}
}
