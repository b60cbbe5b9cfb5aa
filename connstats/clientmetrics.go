package connstats

import (
	"strings"
	"sync"

	"github.com/ferry-gw/ferry/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultClientMetricsLimit is how many distinct (client_id, software)
// pairs get series of their own by default.
const DefaultClientMetricsLimit = 100

// clientOther labels the pairs beyond the limit.
const clientOther = "other"

// maxClientLabel bounds a client_id or software label value, in bytes.
const maxClientLabel = 128

// ClientMetrics exposes bytes, requests and errors by client_id and
// software (name). Nothing is counted on the request path for it: it sums,
// at each scrape, the counters of the open connections (Stats) and the
// totals folded in from the closed ones. The first limit pairs seen get
// series of their own, for the process's life (counters must not vanish);
// every later pair is counted as client_id="other", software="other", so a
// fleet of clients cannot grow the label set without bound.
type ClientMetrics struct {
	limit                         int
	bytesIn, bytesOut, reqs, errs *prometheus.Desc

	mu     sync.Mutex
	series map[clientKey]*clientTotals // totals of the closed connections
	named  int                         // series other than other
	live   map[*Stats]*clientTotals
}

type clientKey struct{ clientID, software string }

type clientTotals struct {
	key                           clientKey
	bytesIn, bytesOut, reqs, errs uint64
}

// NewClientMetrics registers the per-client counters on reg (nil: none),
// series for the first limit pairs.
func NewClientMetrics(reg prometheus.Registerer, limit int) (*ClientMetrics, error) {
	labels := []string{"client_id", "software"}
	const more = " Series exist for the first client_metrics_limit distinct (client_id, software) pairs; later ones count as client_id=\"other\", software=\"other\"."
	m := &ClientMetrics{
		limit:    max(limit, 0),
		bytesIn:  prometheus.NewDesc("ferry_clients_received_bytes_total", "Bytes of requests read from clients, by client.id and client software name (ApiVersions v3+)."+more, labels, nil),
		bytesOut: prometheus.NewDesc("ferry_clients_sent_bytes_total", "Bytes of responses written to clients, by client.id and client software name."+more, labels, nil),
		reqs:     prometheus.NewDesc("ferry_clients_requests_total", "Requests read from clients, by client.id and client software name."+more, labels, nil),
		errs: prometheus.NewDesc("ferry_clients_errors_total", "Responses Ferry encoded with a non-zero error code (built by Ferry, or decoded to be rewritten; bytes passed through are not decoded to count) plus requests refused by closing the connection, by client.id and client software name."+more,
			labels, nil),
		series: map[clientKey]*clientTotals{},
		live:   map[*Stats]*clientTotals{},
	}
	// Several servers on one registry count together.
	return promreg.Shared(reg, m)
}

// Bind counts the connection of st, once identified, under its pair's
// series.
func (m *ClientMetrics) Bind(st *Stats, id *Identity) {
	key := clientKey{clientLabel(id.ClientID), clientLabel(id.SoftwareName)}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.series[key]
	if t == nil {
		if m.named >= m.limit {
			key = clientKey{clientOther, clientOther}
			t = m.series[key]
		}
		if t == nil {
			t = &clientTotals{key: key}
			m.series[key] = t
			if key.clientID != clientOther || key.software != clientOther {
				m.named++
			}
		}
	}
	m.live[st] = t
}

// Retire folds a closed connection's final counts into its series.
func (m *ClientMetrics) Retire(st *Stats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.live[st]
	if t == nil {
		return // never identified
	}
	delete(m.live, st)
	t.add(st)
}

func (t *clientTotals) add(st *Stats) {
	t.bytesIn += st.bytesIn.Load()
	t.bytesOut += st.bytesOut.Load()
	for i := range st.requests {
		t.reqs += st.requests[i].Load()
	}
	t.errs += st.errors.Load()
}

// clientLabel makes a label value of what a client sent: valid UTF-8, at
// most maxClientLabel bytes.
func clientLabel(s string) string {
	if len(s) > maxClientLabel {
		s = s[:maxClientLabel]
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

func (m *ClientMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.bytesIn, m.bytesOut, m.reqs, m.errs} {
		ch <- d
	}
}

func (m *ClientMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	sums := make(map[clientKey]clientTotals, len(m.series))
	for k, t := range m.series {
		sums[k] = *t
	}
	for st, t := range m.live {
		s := sums[t.key]
		s.add(st)
		sums[t.key] = s
	}
	m.mu.Unlock()
	for k, t := range sums {
		for _, v := range []struct {
			d *prometheus.Desc
			n uint64
		}{{m.bytesIn, t.bytesIn}, {m.bytesOut, t.bytesOut}, {m.reqs, t.reqs}, {m.errs, t.errs}} {
			ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n), k.clientID, k.software)
		}
	}
}
