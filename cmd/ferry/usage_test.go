package main

import (
	"errors"
	"flag"
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
