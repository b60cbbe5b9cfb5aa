package main

import (
	"testing"

	"github.com/ferry-gw/ferry/protocol/internal/kmsggen"
)

// TestGeneratedFileIsCurrent fails when visit_gen.go is not what kfieldsgen
// writes from the kmsg in go.mod (after a franz-go upgrade).
func TestGeneratedFileIsCurrent(t *testing.T) {
	kmsggen.CheckCurrent(t, generate, "../../visit_gen.go", "./protocol/kfields")
}
