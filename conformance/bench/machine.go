package main

import "github.com/ferry-gw/ferry/conformance/benchutil"

// machine describes where the benchmark ran (shared with the other
// benchmark).
type machine = benchutil.Machine

func readMachine() machine { return benchutil.ReadMachine() }
