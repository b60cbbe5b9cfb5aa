package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// TestUpstreamAuthFailureMessage: bob is mapped to bob-app, a user the
// cluster does not have. bob's produce is answered a retriable code and a
// short message that names neither the broker's address nor the upstream
// user; UpstreamAuthFailures (/status) has the details, and alice, whose mapping
// works, is not listed.
func TestUpstreamAuthFailureMessage(t *testing.T) {
	kf := aclKfake(t) // no bob-app
	e := newSecEnv(t)
	e.addUser(t, "bob", "bob-secret")
	sec, mapped := principalSecurity(t, "a")
	s, addr := startFerry(t, kf.ListenAddrs(), WithClusters(upstream.Config{Name: "a", Bootstrap: kf.ListenAddrs(), Security: sec, Principals: mapped}),
		WithClientSASL(e.sasl(clientauth.MechanismSCRAMSHA512)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := produceErr(ctx, t, addr, "alice"); err != nil {
		t.Fatalf("alice (mapped to alice-app, allowed): %v", err)
	}
	cl := newClient(t, addr, scram512("bob", "bob-secret"), kgo.MaxVersions(kversion.V3_6_0())) // a Produce naming its topic
	resp, err := cl.Request(ctx, oneRecordProduce("a-only"))
	if err != nil {
		t.Fatal(err)
	}
	p := resp.(*kmsg.ProduceResponse).Topics[0].Partitions[0]
	code := kerr.ErrorForCode(p.ErrorCode)
	if code == nil || !kerr.IsRetriable(code) || p.ErrorMessage == nil {
		t.Fatalf("bob's produce: %v %v, want a retriable code with a message", code, p.ErrorMessage)
	}
	t.Logf("bob's produce: %v: %s", code, *p.ErrorMessage)
	broker := kf.ListenAddrs()[0]
	host := broker[:strings.LastIndex(broker, ":")]
	for _, leak := range []string{broker, host, "bob-app", "SCRAM-SHA-512 as"} {
		if strings.Contains(*p.ErrorMessage, leak) {
			t.Errorf("the client's message %q shows %q", *p.ErrorMessage, leak)
		}
	}
	if !strings.Contains(*p.ErrorMessage, "refused the credentials") {
		t.Errorf("the client's message %q does not say the cluster refused the credentials", *p.ErrorMessage)
	}
	fails := s.UpstreamAuthFailures()
	if len(fails) != 1 {
		t.Fatalf("upstream failures %+v, want bob's", fails)
	}
	f := fails[0]
	if f.Cluster != "a" || f.Principal != "User:bob" || !strings.Contains(f.Error, "bob-app") || !strings.Contains(f.Error, broker) {
		t.Errorf("upstream failure %+v, want cluster a, User:bob, the broker %s and the upstream user bob-app", f, broker)
	}
}
