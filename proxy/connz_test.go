package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// waitConnz polls connstats.Report until ok accepts its answer, failing after 30 s.
func waitConnz(t *testing.T, s *Server, o connstats.Query, what string, ok func(*connstats.Report) bool) *connstats.Report {
	t.Helper()
	var cz *connstats.Report
	testwait.Eventually(t, 30*time.Second, what, func() error {
		var err error
		if cz, err = s.Connz(o); err != nil {
			t.Fatal(err)
		}
		if !ok(cz) {
			return fmt.Errorf("Connz(%+v) = %+v", o, cz)
		}
		return nil
	})
	return cz
}

// sumConns adds up the connections of one client (a franz-go client opens
// several: one for metadata and others, one for produce, one for fetch).
func sumConns(cs []connstats.Info) (in, out uint64, reqs map[string]uint64) {
	reqs = map[string]uint64{}
	for _, c := range cs {
		in += c.BytesIn
		out += c.BytesOut
		for k, n := range c.Requests {
			reqs[k] += n
		}
	}
	return in, out, reqs
}

// A client that produced and consumed shows on /connections with who it
// is, where it is routed, what it moved and sent, what it waits for, and,
// once it has closed, why.
func TestConnectionsReportClients(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(newClient(t, addr, kgo.ClientID("setup"))).CreateTopic(ctx, 1, 1, nil, "conns"); err != nil {
		t.Fatal(err)
	}

	prod, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ClientID("orders-svc"), kgo.SoftwareNameAndVersion("orders-app", "1.2.3"), kgo.DefaultProduceTopic("conns"),
		kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for i := 0; i < 50; i++ {
		prod.Produce(ctx, &kgo.Record{Value: []byte(strings.Repeat("x", 100))}, nil)
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cons := newClient(t, addr, kgo.ClientID("billing-svc"), kgo.ConsumeTopics("conns"), kgo.FetchMaxWait(5*time.Second))
	for got := 0; got < 50; {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of 50", got)
		}
		got += fs.NumRecords()
	}

	cz := waitConnz(t, s, connstats.Query{ClientID: "orders-svc"}, "producer's connections", func(cz *connstats.Report) bool {
		_, _, reqs := sumConns(cz.Connections)
		return reqs["Produce"] > 0
	})
	in, out, reqs := sumConns(cz.Connections)
	if in < 50*100 || out == 0 || reqs["ApiVersions"] == 0 || reqs["Metadata"] == 0 {
		t.Errorf("producer moved %d bytes in, %d out, requests %v; want its 5000 bytes of values in, answers out, ApiVersions and Metadata", in, out, reqs)
	}
	for _, c := range cz.Connections {
		if c.ClientID != "orders-svc" || c.SoftwareName != "orders-app" || c.SoftwareVersion != "1.2.3" || c.Lane != 0 || c.Cluster != "a" ||
			c.ConnectedAt.IsZero() || c.ClosedAt != nil || c.Principal != "" || !strings.HasPrefix(c.Remote, "127.0.0.1:") {
			t.Errorf("producer connection %+v", c)
		}
		if c.RequestsTotal > 0 && (c.LatencySamples == 0 || c.LatencyP99Ms < c.LatencyP50Ms) {
			t.Errorf("connection %d answered %d requests, latency p50 %vms p99 %vms over %d", c.ID, c.RequestsTotal, c.LatencyP50Ms, c.LatencyP99Ms, c.LatencySamples)
		}
	}

	// The consumer, with franz-go's own software name and version, has a
	// fetch long-polling on the empty end of the topic: in flight.
	cz = waitConnz(t, s, connstats.Query{ClientID: "billing-svc", Sort: "in_flight"}, "consumer's fetch in flight", func(cz *connstats.Report) bool {
		return len(cz.Connections) > 0 && cz.Connections[0].InFlight > 0
	})
	_, out, reqs = sumConns(cz.Connections)
	if out < 50*100 || reqs["Fetch"] == 0 || cz.Connections[0].IdleSeconds != 0 {
		t.Errorf("consumer: %d bytes out, requests %v, first %+v", out, reqs, cz.Connections[0])
	}
	for _, c := range cz.Connections {
		if c.SoftwareName != "kgo" || c.SoftwareVersion == "" {
			t.Errorf("consumer's software %q %q, want kgo and its version", c.SoftwareName, c.SoftwareVersion)
		}
	}

	// A closed client's connections are kept, with why they closed.
	prod.Close()
	cz = waitConnz(t, s, connstats.Query{ClientID: "orders-svc", State: "closed"}, "producer's closed connections", func(cz *connstats.Report) bool {
		return cz.Matched > 0 && cz.Matched == len(cz.Connections) && len(cz.Connections) >= 2
	})
	for _, c := range cz.Connections {
		if c.ClosedAt == nil || c.CloseReason != "client_closed" || c.InFlight != 0 || c.BytesIn == 0 {
			t.Errorf("closed connection %+v", c)
		}
	}
	// Closing is noticed per connection, each by its own reader: wait for the
	// last rather than assume the closed ones seen above were all of them.
	waitConnz(t, s, connstats.Query{ClientID: "orders-svc"}, "no producer connection listed open", func(cz *connstats.Report) bool {
		return cz.Matched == 0
	})
	if all, _ := s.Connz(connstats.Query{State: "all", Sort: "closed_at"}); all.Connections[0].ClosedAt == nil || all.Connections[len(all.Connections)-1].ClosedAt != nil {
		t.Errorf("state=all sorted by closed_at does not list the closed first, the open last")
	}
}

// Error codes Ferry answers with are counted by name: here Metadata's
// UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist.
func TestConnectionsCountErrors(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, addr, kgo.ClientID("asker")))
	if _, err := adm.Metadata(ctx, "no-such-topic"); err != nil {
		t.Fatal(err)
	}
	cz := waitConnz(t, s, connstats.Query{ClientID: "asker", Sort: "errors"}, "errors counted", func(cz *connstats.Report) bool {
		return len(cz.Connections) > 0 && cz.Connections[0].ErrorsTotal > 0
	})
	if c := cz.Connections[0]; c.Errors["UNKNOWN_TOPIC_OR_PARTITION"] != 1 || c.ErrorsTotal != 1 {
		t.Fatalf("errors %v (total %d), want one UNKNOWN_TOPIC_OR_PARTITION", c.Errors, c.ErrorsTotal)
	}
}

// Sorting, paging and filters select what a person asks for.
func TestConnectionsPagingSortingFilters(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Client page-i asks for the cluster 5*i times more than the others.
	for i := 0; i < 4; i++ {
		cl := newClient(t, addr, kgo.ClientID(fmt.Sprintf("page-%d", i)))
		for j := 0; j <= 5*i; j++ {
			if _, err := kmsg.NewPtrDescribeClusterRequest().RequestWith(ctx, cl); err != nil {
				t.Fatal(err)
			}
		}
	}
	all := waitConnz(t, s, connstats.Query{ClientID: "page-", Sort: "requests"}, "four clients", func(cz *connstats.Report) bool { return cz.Matched >= 4 })
	if all.Connections[0].ClientID != "page-3" {
		t.Fatalf("sorted by requests, the first is %s's", all.Connections[0].ClientID)
	}
	for i := 1; i < len(all.Connections); i++ {
		if all.Connections[i-1].RequestsTotal < all.Connections[i].RequestsTotal {
			t.Fatalf("not sorted by requests: %d then %d", all.Connections[i-1].RequestsTotal, all.Connections[i].RequestsTotal)
		}
	}
	page, err := s.Connz(connstats.Query{ClientID: "page-", Sort: "requests", Offset: 1, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if page.Matched != all.Matched || len(page.Connections) != 2 || page.Connections[0].ID != all.Connections[1].ID || page.Connections[1].ID != all.Connections[2].ID {
		t.Fatalf("offset 1 limit 2: %+v", page)
	}
	if past, _ := s.Connz(connstats.Query{ClientID: "page-", Offset: 100}); past.Matched != all.Matched || len(past.Connections) != 0 {
		t.Fatalf("offset past the end: %+v", past)
	}
	byID, _ := s.Connz(connstats.Query{ClientID: "page-"})
	for i := 1; i < len(byID.Connections); i++ {
		if byID.Connections[i-1].ID >= byID.Connections[i].ID {
			t.Fatalf("default order is not by ID: %+v", byID.Connections)
		}
	}
	one, _ := s.Connz(connstats.Query{ClientID: "page-3"})
	for _, c := range one.Connections {
		if c.ClientID != "page-3" {
			t.Fatalf("client_id page-3: %+v", one)
		}
	}
	remote := one.Connections[0].Remote
	if r, _ := s.Connz(connstats.Query{Remote: remote}); r.Matched != 1 || r.Connections[0].ClientID != "page-3" {
		t.Fatalf("remote %s: %+v", remote, r)
	}
	if sw, _ := s.Connz(connstats.Query{Software: "kgo/"}); sw.Matched < all.Matched {
		t.Fatalf("software kgo/: %d matched", sw.Matched)
	}
	if none, _ := s.Connz(connstats.Query{Software: "librdkafka"}); none.Matched != 0 {
		t.Fatalf("software librdkafka: %+v", none)
	}
	for _, o := range []connstats.Query{{Sort: "size"}, {State: "gone"}, {Limit: 5000}, {Offset: -1}} {
		if _, err := s.Connz(o); !errors.Is(err, connstats.ErrQuery) {
			t.Errorf("Connz(%+v): %v, want connstats.ErrQuery", o, err)
		}
	}
}

// clientSeries returns the ferry_clients_requests_total series by
// client_id/software.
func clientSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "ferry_clients_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[label(m, "client_id")+"/"+label(m, "software")] = m.GetCounter().GetValue()
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// More distinct client IDs than the limit: the first get series of their
// own, the rest count together as other, and what closed connections did
// stays counted.
func TestClientMetricsCardinalityCap(t *testing.T) {
	kf := newKfake(t, 1)
	reg := prometheus.NewRegistry()
	s, addr := startFerry(t, kf.ListenAddrs(), WithRegisterer(reg), WithClientMetricsLimit(2))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var clients []*kgo.Client
	for i := 0; i < 5; i++ {
		cl := newClient(t, addr, kgo.ClientID(fmt.Sprintf("fleet-%d", i)))
		if _, err := kadm.NewClient(cl).BrokerMetadata(ctx); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cl)
		// In order: the first two clients take the two series.
		waitConnz(t, s, connstats.Query{ClientID: fmt.Sprintf("fleet-%d", i)}, "identified", func(cz *connstats.Report) bool { return cz.Matched > 0 })
	}
	got := clientSeries(t, reg)
	if len(got) != 3 || got["fleet-0/kgo"] < 2 || got["fleet-1/kgo"] < 2 || got["other/other"] < 6 {
		t.Fatalf("ferry_clients_requests_total %v, want fleet-0, fleet-1 and other (3 clients' requests)", got)
	}
	before := got["other/other"]
	for _, cl := range clients {
		cl.Close()
	}
	waitConnz(t, s, connstats.Query{ClientID: "fleet-"}, "clients closed", func(cz *connstats.Report) bool { return cz.Matched == 0 })
	after := clientSeries(t, reg)
	if after["other/other"] < before || after["fleet-0/kgo"] < got["fleet-0/kgo"] {
		t.Fatalf("after the clients closed: %v, before %v: counters went down", after, got)
	}
}

// Connection stats off: connections are listed, nothing is counted.
func TestConnectionStatsOff(t *testing.T) {
	kf := newKfake(t, 1)
	reg := prometheus.NewRegistry()
	s, addr := startFerry(t, kf.ListenAddrs(), WithRegisterer(reg), WithConnectionStats(false))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(newClient(t, addr, kgo.ClientID("quiet"))).BrokerMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	cz := waitConnz(t, s, connstats.Query{ClientID: "quiet"}, "listed", func(cz *connstats.Report) bool { return cz.Matched > 0 })
	if c := cz.Connections[0]; c.BytesIn != 0 || c.RequestsTotal != 0 || c.SoftwareName != "kgo" {
		t.Fatalf("stats off: %+v", c)
	}
	if got := clientSeries(t, reg); len(got) != 0 {
		t.Fatalf("stats off: per-client series %v", got)
	}
}
