package main

import (
	"bytes"
	"os"
	"testing"
)

// TestGeneratedFileIsCurrent fails when visit_gen.go is not what kfieldsgen
// writes from the kmsg in go.mod: after a franz-go upgrade, until `go
// generate ./protocol/kfields` has been run and its diff reviewed.
func TestGeneratedFileIsCurrent(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../visit_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("protocol/kfields/visit_gen.go is stale: run `go generate ./protocol/kfields` and review the diff")
	}
}
