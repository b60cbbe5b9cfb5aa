package benchutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestPublishWritesMarkdownOnlyWhenAsked(t *testing.T) {
	file := filepath.Join(t.TempDir(), "report.md")
	if err := Publish("text\n", "# md\n", "", func(string, string) error {
		t.Error("write called without an out file")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := Publish("text\n", "# md\n", file, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "# md\n" {
		t.Fatalf("report file = %q, %v; want %q", b, err, "# md\n")
	}
	var got [2]string
	if err := Publish("text\n", "# other\n", file, func(f, md string) error {
		got = [2]string{f, md}
		return nil
	}); err != nil || got != [2]string{file, "# other\n"} {
		t.Fatalf("write got %q, Publish: %v", got, err)
	}
	failed := errors.New("disk full")
	if err := Publish("text\n", "# md\n", file, func(string, string) error { return failed }); !errors.Is(err, failed) {
		t.Fatalf("Publish = %v; want the write's error", err)
	}
}

func TestStartCPUProfileWritesAProfile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := StartCPUProfile(file)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if fi, err := os.Stat(file); err != nil || fi.Size() == 0 {
		t.Fatalf("profile: %v, %v; want a non-empty file", fi, err)
	}
	if _, err := StartCPUProfile(filepath.Join(t.TempDir(), "no", "such", "dir")); err == nil {
		t.Fatal("StartCPUProfile into a missing directory: no error")
	}
}
