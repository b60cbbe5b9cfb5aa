package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/clientauth"
)

// TestPreAuthConfig: the sasl keys bounding unauthenticated connections
// default to Kafka's sasl.server.max.receive.size, 30s and 64, reach the
// proxy, and bad values are refused naming the key.
func TestPreAuthConfig(t *testing.T) {
	const sasl = "sasl: {mechanisms: [SCRAM-SHA-512], credentials_file: u.yaml"
	c, err := configFrom(minimal + sasl + "}\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.SASL.proxySASL().PreAuth, (clientauth.PreAuthLimits{MaxReceiveSize: 524288, Timeout: 30 * time.Second, MaxPerIP: 64}); got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	c, err = configFrom(minimal + sasl + ", max_receive_size: 65536, authentication_timeout: 5s, max_unauthenticated_per_ip: 8}\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.SASL.proxySASL().PreAuth, (clientauth.PreAuthLimits{MaxReceiveSize: 65536, Timeout: 5 * time.Second, MaxPerIP: 8}); got != want {
		t.Errorf("set %+v, want %+v", got, want)
	}
	for _, tc := range []struct{ yaml, want string }{
		{", max_receive_size: 100}", "sasl.max_receive_size 100: must be at least 1024 bytes"},
		{", authentication_timeout: 100ms}", "sasl.authentication_timeout 100ms: must be at least 1s"},
		{", authentication_timeout: -1s}", "sasl.authentication_timeout -1s: must be positive"},
		{", max_unauthenticated_per_ip: -1}", "sasl.max_unauthenticated_per_ip -1: must be positive"},
	} {
		_, err := configFrom(minimal + sasl + tc.yaml + "\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.yaml, err, tc.want)
		}
	}
}
