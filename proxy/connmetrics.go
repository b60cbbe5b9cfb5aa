package proxy

import (
	"github.com/ferry-gw/ferry/internal/listen"
	"github.com/ferry-gw/ferry/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// connMetrics are the metrics of accepting and closing client connections.
// Children are resolved once for every known reason, so each series exists
// from the start (at 0) and counting does no label lookups.
type connMetrics struct {
	accept  map[string]prometheus.Counter
	closed  map[string]prometheus.Counter
	refused map[string]prometheus.Counter
	// unauth is the connections open and not authenticated yet
	// (preauth.go).
	unauth prometheus.Gauge
}

func newConnMetrics(reg prometheus.Registerer) (*connMetrics, error) {
	accept := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "accept_errors_total",
		Help: "Errors accepting a client connection that Ferry retried after a backoff, by reason (emfile, enfile: out of file descriptors)."}, []string{"reason"})
	closed := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "client_connections_closed_total",
		Help: "Client connections closed, by reason."}, []string{"reason"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "client_connections_refused_total",
		Help: "Client connections closed as soon as accepted because a connection limit was reached, by reason (max_connections, max_connections_per_ip, max_unauthenticated_per_ip)."}, []string{"reason"})
	for _, c := range []**prometheus.CounterVec{&accept, &closed, &refused} {
		var err error
		if *c, err = promreg.Shared(reg, *c); err != nil {
			return nil, err
		}
	}
	unauth, err := promreg.Shared(reg, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Name: "client_connections_unauthenticated",
		Help: "Client connections open that have not authenticated yet, on a listener with SASL."}))
	if err != nil {
		return nil, err
	}
	m := &connMetrics{accept: map[string]prometheus.Counter{}, closed: map[string]prometheus.Counter{}, refused: map[string]prometheus.Counter{}, unauth: unauth}
	for _, r := range []string{refuseMaxConnections, refusePerIP, refuseUnauthPerIP} {
		m.refused[r] = refused.WithLabelValues(r)
	}
	for _, r := range listen.Reasons() {
		m.accept[r] = accept.WithLabelValues(r)
	}
	for _, r := range closeReasons() {
		m.closed[r] = closed.WithLabelValues(r)
	}
	return m, nil
}

func (m *connMetrics) acceptErrors(reason string) prometheus.Counter { return m.accept[reason] }

func (m *connMetrics) closes(reason string) prometheus.Counter { return m.closed[reason] }
