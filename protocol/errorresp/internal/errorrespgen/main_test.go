package main

import (
	"testing"

	"github.com/ferry-gw/ferry/protocol/internal/kmsggen"
)

// TestGeneratedFileIsCurrent fails when answer_gen.go is not what
// errorrespgen writes from the kmsg in go.mod (after a franz-go upgrade).
func TestGeneratedFileIsCurrent(t *testing.T) {
	kmsggen.CheckCurrent(t, generate, "../../answer_gen.go", "./protocol/errorresp")
}
