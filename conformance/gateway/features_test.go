package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
)

// apiVersions asks the cluster at addr (through one of its brokers, or
// through Ferry) for its API versions and features.
func apiVersions(t *testing.T, addr string) *kmsg.ApiVersionsResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := &kmsg.ApiVersionsRequest{Version: 3, ClientSoftwareName: "ferry-features-test", ClientSoftwareVersion: "1"}
	resp, err := req.RequestWith(ctx, client(t, addr))
	if err != nil || resp.ErrorCode != 0 {
		t.Fatalf("ApiVersions from %s: %v %+v", addr, err, resp)
	}
	return resp
}

// TestApiVersionsFeaturesThroughFerry: Ferry in front of one Kafka cluster
// states the cluster's own feature levels, supported and finalized, so a
// client behaves as it would connected directly (transaction.version 2:
// KIP-890's implicit AddPartitionsToTxn).
func TestApiVersionsFeaturesThroughFerry(t *testing.T) {
	c := cluster(t)
	f := ferrytest.Start(t, c.Bootstrap())
	direct, via := apiVersions(t, c.Bootstrap()), apiVersions(t, f.Addr)
	fin := func(r *kmsg.ApiVersionsResponse) map[string][2]int16 {
		m := map[string][2]int16{}
		for _, f := range r.FinalizedFeatures {
			m[f.Name] = [2]int16{f.MinVersionLevel, f.MaxVersionLevel}
		}
		return m
	}
	sup := func(r *kmsg.ApiVersionsResponse) map[string][2]int16 {
		m := map[string][2]int16{}
		for _, f := range r.SupportedFeatures {
			m[f.Name] = [2]int16{f.MinVersion, f.MaxVersion}
		}
		return m
	}
	if fin(direct)["transaction.version"][1] < 2 {
		t.Fatalf("the broker finalizes %v; the test needs transaction.version 2", fin(direct))
	}
	for what, pair := range map[string][2]map[string][2]int16{
		"finalized": {fin(direct), fin(via)},
		"supported": {sup(direct), sup(via)},
	} {
		want, got := pair[0], pair[1]
		if len(got) != len(want) {
			t.Errorf("%s features: broker %v, through Ferry %v", what, want, got)
			continue
		}
		for n, l := range want {
			if got[n] != l {
				t.Errorf("%s features: broker %v, through Ferry %v", what, want, got)
				break
			}
		}
	}
	if via.FinalizedFeaturesEpoch <= 0 {
		t.Errorf("finalized features epoch %d through Ferry", via.FinalizedFeaturesEpoch)
	}
}

// requestsAnswered reads ferry_requests_total for one API from a Ferry's
// registry.
func requestsAnswered(t *testing.T, reg *prometheus.Registry, api string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ferry_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "api" && strings.EqualFold(l.GetValue(), api) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
