package proxy

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// apiVersionsV3 asks addr for its API versions and features.
func apiVersionsV3(t *testing.T, addr string) *kmsg.ApiVersionsResponse {
	t.Helper()
	c := dialRaw(t, addr)
	req := &kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "features-test", ClientSoftwareVersion: "1"}
	writeReq(t, c, req, 1)
	b := readResp(t, c)
	resp := req.ResponseKind().(*kmsg.ApiVersionsResponse)
	resp.SetVersion(3)
	if err := resp.ReadFrom(b[4:]); err != nil || resp.ErrorCode != 0 {
		t.Fatalf("ApiVersions from %s: %v, code %d", addr, err, resp.ErrorCode)
	}
	return resp
}

func finalized(resp *kmsg.ApiVersionsResponse) map[string]int16 {
	m := map[string]int16{}
	for _, f := range resp.FinalizedFeatures {
		m[f.Name] = f.MaxVersionLevel
	}
	return m
}

func supported(resp *kmsg.ApiVersionsResponse) map[string][2]int16 {
	m := map[string][2]int16{}
	for _, f := range resp.SupportedFeatures {
		m[f.Name] = [2]int16{f.MinVersion, f.MaxVersion}
	}
	return m
}

// wantFeatures states, from two brokers' own answers, what a client of
// both may rely on: each feature finalized on both at the lower level,
// each feature supported by both at the levels both support.
func wantFeatures(a, b *kmsg.ApiVersionsResponse) (map[string][2]int16, map[string]int16) {
	sup, fin := map[string][2]int16{}, map[string]int16{}
	sb, fb := supported(b), finalized(b)
	for n, r := range supported(a) {
		if o, ok := sb[n]; ok && max(r[0], o[0]) <= min(r[1], o[1]) {
			sup[n] = [2]int16{max(r[0], o[0]), min(r[1], o[1])}
		}
	}
	for n, l := range finalized(a) {
		if o, ok := fb[n]; ok {
			fin[n] = min(l, o)
		}
	}
	return sup, fin
}

func sameFeatures(t *testing.T, resp *kmsg.ApiVersionsResponse, sup map[string][2]int16, fin map[string]int16) {
	t.Helper()
	gs, gf := supported(resp), finalized(resp)
	if len(gs) != len(sup) || len(gf) != len(fin) {
		t.Fatalf("Ferry advertises supported %v finalized %v; want %v and %v", gs, gf, sup, fin)
	}
	for n, r := range sup {
		if gs[n] != r {
			t.Fatalf("Ferry advertises supported %v; want %v", gs, sup)
		}
	}
	for n, l := range fin {
		if gf[n] != l {
			t.Fatalf("Ferry advertises finalized %v; want %v", gf, fin)
		}
	}
}

// setFeature sets a feature's finalized level on a kfake cluster, down
// as well as up.
func setFeature(t *testing.T, c *kfake.Cluster, name string, level int16) {
	t.Helper()
	req := kmsg.NewPtrUpdateFeaturesRequest()
	u := kmsg.NewUpdateFeaturesRequestFeatureUpdate()
	u.Feature, u.MaxVersionLevel, u.UpgradeType = name, level, 2 // safe downgrade
	req.FeatureUpdates = append(req.FeatureUpdates, u)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, newClient(t, c.ListenAddrs()[0]))
	if err != nil || resp.ErrorCode != 0 {
		t.Fatalf("UpdateFeatures %s=%d: %v %+v", name, level, err, resp)
	}
}

// TestApiVersionsFeaturesOfEveryCluster: Ferry in front of a cluster of
// the newest release and one of Kafka 4.0 with transaction.version set
// back to 1. A client learns, per feature, the levels both clusters
// support, and as finalized only features both finalize, at the lower
// level: transaction.version 1 (so producers keep AddPartitionsToTxn,
// which both clusters take), no share.version (the 4.0 one has none). A
// switch does not change it.
func TestApiVersionsFeaturesOfEveryCluster(t *testing.T) {
	a := newKfake(t, 1)
	b := newKfake(t, 1, kfake.MaxVersions(kversion.V4_0_0()))
	setFeature(t, b, "transaction.version", 1)
	ra, rb := apiVersionsV3(t, a.ListenAddrs()[0]), apiVersionsV3(t, b.ListenAddrs()[0])
	if finalized(ra)["transaction.version"] != 2 || finalized(rb)["transaction.version"] != 1 || finalized(ra)["share.version"] == 0 {
		t.Fatalf("the clusters finalize %v and %v; the test needs transaction.version 2 and 1, share.version on the first", finalized(ra), finalized(rb))
	}
	routes := routing.NewTable(routing.State{Active: "a"})
	_, addr := startFerry(t, a.ListenAddrs(),
		WithClusters(upstream.Config{Name: "a", Bootstrap: a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: b.ListenAddrs()}),
		WithRoutingTable(routes))
	sup, fin := wantFeatures(ra, rb)
	got := apiVersionsV3(t, addr)
	sameFeatures(t, got, sup, fin)
	if fin["transaction.version"] != 1 || fin["metadata.version"] == 0 {
		t.Fatalf("want transaction.version 1 and metadata.version finalized, got %v", fin)
	}
	if got.FinalizedFeaturesEpoch <= 0 {
		t.Fatalf("finalized features epoch %d", got.FinalizedFeaturesEpoch)
	}

	// Below v3 there are no features to state; the versions still are.
	c := dialRaw(t, addr)
	writeReq(t, c, &kmsg.ApiVersionsRequest{Version: 2}, 2)
	old := kmsg.NewPtrApiVersionsResponse()
	old.SetVersion(2)
	if err := old.ReadFrom(readResp(t, c)[4:]); err != nil || len(old.ApiKeys) == 0 {
		t.Fatalf("ApiVersions v2: %v %+v", err, old)
	}

	if !routes.Advance(routing.State{Generation: 1, Active: "b"}) {
		t.Fatal("switch refused")
	}
	after := apiVersionsV3(t, addr)
	sameFeatures(t, after, sup, fin)
	if after.FinalizedFeaturesEpoch != got.FinalizedFeaturesEpoch {
		t.Fatalf("epoch %d after the switch, %d before: nothing changed", after.FinalizedFeaturesEpoch, got.FinalizedFeaturesEpoch)
	}
}

// TestApiVersionsFeaturesWaitForLateCluster: while a configured cluster has
// not been reached its levels are unknown, so nothing is advertised as
// finalized; once it is reached, what both finalize is, under a higher
// epoch (a Java client ignores an answer whose epoch is not higher than
// one it has), and the supported levels narrow to what both support.
func TestApiVersionsFeaturesWaitForLateCluster(t *testing.T) {
	a := newKfake(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there until b starts
	s, addr := startFerry(t, a.ListenAddrs(),
		WithClusters(upstream.Config{Name: "a", Bootstrap: a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: []string{ln.Addr().String()}}),
		WithStandbyWait(100*time.Millisecond))
	ra := apiVersionsV3(t, addr)
	before := apiVersionsV3(t, addr)
	sameFeatures(t, before, supported(ra), nil)
	if before.FinalizedFeaturesEpoch != -1 {
		t.Fatalf("epoch %d with nothing finalized; want -1", before.FinalizedFeaturesEpoch)
	}
	_, epoch0 := s.Features()

	b := newKfake(t, 1, kfake.Ports(port), kfake.MaxVersions(kversion.V4_0_0()))
	rb := apiVersionsV3(t, b.ListenAddrs()[0])
	sup, fin := wantFeatures(apiVersionsV3(t, a.ListenAddrs()[0]), rb)
	if len(sup) == len(supported(ra)) {
		t.Fatalf("the 4.0 cluster supports %v, the other %v: the test needs fewer features on it", supported(rb), supported(ra))
	}
	var got *kmsg.ApiVersionsResponse
	testwait.Eventually(t, 30*time.Second, "finalized features advertised once the late cluster is reached", func() error {
		got = apiVersionsV3(t, addr)
		if len(got.FinalizedFeatures) == 0 {
			return fmt.Errorf("none finalized; supported %v", supported(got))
		}
		return nil
	})
	sameFeatures(t, got, sup, fin)
	if got.FinalizedFeaturesEpoch <= epoch0 {
		t.Fatalf("epoch %d once the late cluster was reached, %d before", got.FinalizedFeaturesEpoch, epoch0)
	}
}

// TestRetireAdvertisesTheClusterLeft: Ferry in front of the newest release
// and a Kafka 4.0 cluster (transaction.version 1) advertises what both
// support; the 4.0 one retired while Ferry runs, a new connection is
// offered the newest one's versions and feature levels, under a higher
// epoch, and a connection opened before goes on; the retired cluster's
// ferry_upstream_connections series go. The active cluster cannot be
// retired, nor one retired already.
func TestRetireAdvertisesTheClusterLeft(t *testing.T) {
	a := newKfake(t, 1)
	b := newKfake(t, 1, kfake.MaxVersions(kversion.V4_0_0()))
	setFeature(t, b, "transaction.version", 1)
	ra, rb := apiVersionsV3(t, a.ListenAddrs()[0]), apiVersionsV3(t, b.ListenAddrs()[0])
	reg := prometheus.NewRegistry()
	s, addr := startFerry(t, a.ListenAddrs(), WithRegisterer(reg),
		WithClusters(upstream.Config{Name: "a", Bootstrap: a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: b.ListenAddrs()}),
		WithRoutingTable(routing.NewTable(routing.State{Active: "a"})))
	poolsOf := func() map[string]int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, mf := range mfs {
			if mf.GetName() == "ferry_upstream_connections" {
				for _, m := range mf.GetMetric() {
					out[label(m, "cluster")]++
				}
			}
		}
		return out
	}
	testwait.Eventually(t, 10*time.Second, "both clusters' pool sizes published", func() error {
		if got := poolsOf(); got["a"] != 2 || got["b"] != 2 {
			return fmt.Errorf("ferry_upstream_connections series by cluster: %v", got)
		}
		return nil
	})
	maxOf := func(r *kmsg.ApiVersionsResponse, key int16) int16 {
		for _, k := range r.ApiKeys {
			if k.ApiKey == key {
				return k.MaxVersion
			}
		}
		return -1
	}
	produce := int16(kmsg.Produce)
	if maxOf(ra, produce) <= maxOf(rb, produce) {
		t.Fatalf("Produce v%d on the newest, v%d on 4.0: the test needs the newest to offer more", maxOf(ra, produce), maxOf(rb, produce))
	}
	before := apiVersionsV3(t, addr)
	sup, fin := wantFeatures(ra, rb)
	sameFeatures(t, before, sup, fin)
	if got := maxOf(before, produce); got != maxOf(rb, produce) {
		t.Fatalf("both configured: Produce v%d advertised, want 4.0's v%d", got, maxOf(rb, produce))
	}
	open := newClient(t, addr)
	ctx := context.Background()
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, open); err != nil {
		t.Fatal(err)
	}

	if err := s.Retire("a"); err == nil {
		t.Fatal("the active cluster retired")
	}
	if err := s.Retire("b"); err != nil {
		t.Fatal(err)
	}
	after := apiVersionsV3(t, addr)
	sameFeatures(t, after, supported(ra), finalized(ra))
	if got := maxOf(after, produce); got != maxOf(ra, produce) {
		t.Fatalf("b retired: Produce v%d advertised, want the newest's v%d", got, maxOf(ra, produce))
	}
	if finalized(after)["transaction.version"] != 2 || after.FinalizedFeaturesEpoch <= before.FinalizedFeaturesEpoch {
		t.Fatalf("b retired: finalized %v under epoch %d (was %d); want transaction.version 2, a higher epoch",
			finalized(after), after.FinalizedFeaturesEpoch, before.FinalizedFeaturesEpoch)
	}
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, open); err != nil {
		t.Fatalf("a connection opened before the retire: %v", err)
	}
	if err := s.Retire("b"); err == nil {
		t.Fatal("b retired twice")
	}
	testwait.Eventually(t, 10*time.Second, "b's pool sizes gone, a's kept", func() error {
		if got := poolsOf(); got["a"] != 2 || got["b"] != 0 {
			return fmt.Errorf("ferry_upstream_connections series by cluster: %v", got)
		}
		return nil
	})
}
