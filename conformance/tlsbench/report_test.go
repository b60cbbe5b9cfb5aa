package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteReport: the generated part replaces what is between the
// markers and the text around them stays; a file without them is
// written whole.
func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "r.md")
	if err := writeReport(f, "one\n"); err != nil {
		t.Fatal(err)
	}
	want := "# TLS benchmarks\n\n" + beginMarker + "\none\n" + endMarker + "\n"
	if b, _ := os.ReadFile(f); string(b) != want {
		t.Fatalf("new file:\n%s", b)
	}
	if err := os.WriteFile(f, []byte("before\n"+beginMarker+"\nold\n"+endMarker+"\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeReport(f, "two\n"); err != nil {
		t.Fatal(err)
	}
	want = "before\n" + beginMarker + "\ntwo\n" + endMarker + "\nafter\n"
	if b, _ := os.ReadFile(f); string(b) != want {
		t.Fatalf("replaced:\n%s", b)
	}
}

func TestSpread(t *testing.T) {
	if s := spreadOf([]float64{3, 1, 2}); s != (spread{2, 1, 3}) {
		t.Fatalf("odd: %+v", s)
	}
	if s := spreadOf([]float64{4, 1, 2, 3}); s != (spread{2.5, 1, 4}) {
		t.Fatalf("even: %+v", s)
	}
	if got := (spread{2, 1, 3}).format("%.1f"); got != "2.0 (1.0–3.0)" {
		t.Fatalf("format: %q", got)
	}
}
