package main

import (
	"bytes"
	"os"
	"testing"
)

// TestGeneratedFileIsCurrent fails when answer_gen.go is not what
// errorrespgen writes from the kmsg in go.mod: after a franz-go upgrade,
// until `go generate ./protocol/errorresp` has been run and its diff
// reviewed.
func TestGeneratedFileIsCurrent(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../answer_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("protocol/errorresp/answer_gen.go is stale: run `go generate ./protocol/errorresp` and review the diff")
	}
}
