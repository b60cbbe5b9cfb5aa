package main

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
)

// A Kafka or admin port that another process holds is a configuration
// problem: `ferry serve` exits with status 2 and says which listener and
// why, instead of panicking.
func TestServePortInUseExits2(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().String()
	for _, tc := range []struct{ key, listen, admin string }{
		{"listen", taken, "127.0.0.1:0"},
		{"admin_listen", "127.0.0.1:0", taken},
	} {
		t.Run(tc.key, func(t *testing.T) {
			path := writeConfig(t, fmt.Sprintf(`
cluster_id: vc
listen: %s
admin_listen: %s
clusters:
  - name: a
    bootstrap: [%q]
`, tc.listen, tc.admin, deadAddr(t)))
			out, err := ferryCmd(t, "serve", "--config", path).CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want status 2; output:\n%s", err, out)
			}
			want := fmt.Sprintf("ferry: %s %s: address already in use", tc.key, taken)
			if !strings.Contains(string(out), want) || strings.Contains(string(out), "panic") {
				t.Fatalf("output does not say %q:\n%s", want, out)
			}
		})
	}
}
