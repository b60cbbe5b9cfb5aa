package admin

import (
	"bytes"
	"compress/gzip"
	"io"
	"strings"
	"testing"
)

// TestProfilesBehindToken: the runtime profiles answer only with the token,
// and what they answer is a profile go tool pprof reads (gzip), not a page.
func TestProfilesBehindToken(t *testing.T) {
	f := newFixture(t, WithToken(testToken))
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1", "/debug/pprof/profile?seconds=1", "/debug/pprof/cmdline"} {
		for _, auth := range []string{"", "Bearer wrong"} {
			if rec := f.getAs(t, path, auth); rec.Code != 401 || strings.Contains(rec.Body.String(), "goroutine") {
				t.Errorf("%s with %q: %d %.100q, want 401 and no profile", path, auth, rec.Code, rec.Body.String())
			}
		}
	}
	rec := f.getAs(t, "/debug/pprof/heap", "Bearer "+testToken)
	if rec.Code != 200 {
		t.Fatalf("/debug/pprof/heap with the token: %d %.200q", rec.Code, rec.Body.String())
	}
	zr, err := gzip.NewReader(bytes.NewReader(rec.Body.Bytes()))
	if err != nil {
		t.Fatalf("/debug/pprof/heap is no gzip profile: %v", err)
	}
	if b, err := io.ReadAll(zr); err != nil || len(b) == 0 {
		t.Fatalf("/debug/pprof/heap: %d bytes, %v", len(b), err)
	}
	rec = f.getAs(t, "/debug/pprof/goroutine?debug=1", "Bearer "+testToken)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "goroutine profile:") {
		t.Fatalf("/debug/pprof/goroutine?debug=1 with the token: %d %.200q", rec.Code, rec.Body.String())
	}
}
