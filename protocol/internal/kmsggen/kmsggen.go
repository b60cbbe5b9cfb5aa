// Package kmsggen is what the generators of protocol's typed code over
// kmsg's types share (kfields' walks, errorresp's refusals): the requests
// they write code for, the kmsg version they write it from, and the test
// that the file in the repository is what they would write.
package kmsggen

import (
	"bytes"
	"log"
	"os"
	"runtime/debug"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Requests is every request kmsg knows, by key.
func Requests() []kmsg.Request {
	var out []kmsg.Request
	for k := int16(0); k < 1024; k++ {
		if r := kmsg.RequestForKey(k); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// Version is the kmsg module's version the code is written from.
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/twmb/franz-go/pkg/kmsg" {
				return d.Version
			}
		}
	}
	return "unknown"
}

// Main writes file, in the directory go generate runs the generator in,
// with what generate returns; it exits on an error.
func Main(file string, generate func() ([]byte, error)) {
	src, err := generate()
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(file, src, 0o644); err != nil {
		log.Fatal(err)
	}
}

// CheckCurrent fails t when file is not what generate writes from the
// kmsg in go.mod: after a franz-go upgrade, until `go generate pkg` has
// been run and its diff reviewed.
func CheckCurrent(t testing.TB, generate func() ([]byte, error), file, pkg string) {
	t.Helper()
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run `go generate %s` and review the diff", file, pkg)
	}
}
