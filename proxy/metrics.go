package proxy

import (
	"errors"
	"strconv"
	"time"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/upstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type metrics struct {
	connsOpen prometheus.Gauge
	held      prometheus.Gauge
	// heldTooLong counts requests answered with a retriable error after
	// waiting in a switch's hold for heldAnswerAfter.
	heldTooLong prometheus.Counter
	// staleCommits counts OffsetCommits of group members from before a
	// switch applied on the new cluster (group_member.go).
	staleCommits prometheus.Counter
	connsTotal   prometheus.Counter
	badFrames    prometheus.Counter
	bytesOut     prometheus.Counter
	bytesUp      prometheus.Counter
	// splicedBytes counts record bytes moved from a broker's socket to a
	// client's without entering Ferry's memory.
	splicedBytes prometheus.Counter
	// produceSpliced counts the record bytes of Produce requests moved
	// into a pipe (produce_splice.go), by where they went from it: to the
	// broker, or read back into Ferry for a request it had to rewrite.
	produceSpliced *prometheus.CounterVec
	// splicedToBroker and splicedToFerry are its two series, looked up
	// once rather than by label at each request.
	splicedToBroker, splicedToFerry prometheus.Counter
	// streamed counts Fetch answers streamed (fetchStream) rather than
	// read whole; fillersHidden the filler batches emptied on the way.
	streamed      prometheus.Counter
	fillersHidden prometheus.Counter
	// buffered is the bytes of requests and answers held (upstream.Budget);
	// readPauses counts the times reading waited for a budget.
	buffered   prometheus.Gauge
	readPauses prometheus.Counter
	requests   *prometheus.CounterVec
	errors     *prometheus.CounterVec
	upFailures *prometheus.CounterVec
	upConns    *prometheus.GaugeVec
	// refusals counts every request or frame Ferry refused, by API and
	// reason (refusals.go).
	refusals  *prometheus.CounterVec
	abandoned *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	// evictions counts entries dropped from Ferry's bounded tables, by
	// table (stateCoordinators, stateTxnTimeouts, stateTxnMappings,
	// statePIDMappings).
	evictions *prometheus.CounterVec
	// metaAll counts Metadata requests for every topic by how they were
	// answered (metaHow, metadata_answers.go).
	metaAll   *prometheus.CounterVec
	metaAllBy [len(metaHowNames)]prometheus.Counter
	// per-key children, resolved once: the request path does no label
	// lookups.
	byKey [kmsg.MaxKey + 1]keyMetrics
}

type keyMetrics struct {
	requests  prometheus.Counter
	errors    prometheus.Counter
	latency   prometheus.Observer
	upFailed  prometheus.Counter
	abandoned prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Name: "client_connections", Help: "Client connections open."}),
		held:      prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Name: "requests_held", Help: "Client writes waiting for a switch of the active cluster to finish."}),
		heldTooLong: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "requests_held_too_long_total",
			Help: "Client writes answered with their retriable error after waiting 10 s in a switch's hold (the client sends them again), before a client's own request timeout would close its connection."}),
		staleCommits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "group_commits_carried_total",
			Help: "OffsetCommits of group members that joined before a switch, refused by the new cluster as from unknown members and applied there as commits from outside the group while the group had no members."}),
		connsTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "client_connections_total", Help: "Client connections accepted."}),
		badFrames:  prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "bad_frames_total", Help: "Client connections closed for an oversized or malformed frame or header."}),
		bytesOut:   prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "client_bytes_sent_total", Help: "Bytes of responses sent to clients."}),
		bytesUp:    prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "upstream_bytes_sent_total", Help: "Bytes of requests sent to physical brokers."}),
		splicedBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "fetch_spliced_bytes_total",
			Help: "Record bytes of Fetch answers moved from a broker's socket to a client's with splice(2), never entering Ferry's memory (included in client_bytes_sent_total)."}),
		produceSpliced: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "produce_spliced_bytes_total",
			Help: "Record bytes of Produce requests moved from a client's socket into a kernel pipe with splice(2), by where they went: to=broker without entering Ferry's memory, to=ferry read back for a request Ferry rewrote or split."}, []string{"to"}),
		streamed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "fetch_streamed_total",
			Help: "Fetch answers streamed from a broker's socket to a client's, their small fields and batch headers rewritten on the way, rather than read whole."}),
		fillersHidden: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "fetch_fillers_hidden_total",
			Help: "Filler batches (written by the mirror to keep offsets equal) emptied in Fetch answers before they reached a client."}),
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ferry", Name: "buffered_bytes",
			Help: "Bytes of client requests and broker answers Ferry holds in memory until they are answered and written, counted against buffer_budget."}),
		readPauses: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ferry", Name: "buffer_budget_pauses_total",
			Help: "Times Ferry stopped reading a client's requests, or a broker's answers ahead of a client, until the bytes held fell below buffer_budget or buffer_budget_per_connection."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "requests_total", Help: "Client requests answered, by API."}, []string{"api"}),
		errors:   prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "request_failures_total", Help: "Client requests that closed the connection instead of being answered, by API."}, []string{"api"}),
		upFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "upstream_failures_total",
			Help: "Client requests Ferry answered in the broker's place with a retriable error code (broker unreachable, its connection lost with the request in flight, the upstream pool full), by API. The client connection stays open."}, []string{"api"}),
		upConns: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ferry", Name: "upstream_connections",
			Help: "Connections to the brokers of a physical cluster: in_use (checked out to a client with requests in flight on it) or idle (pooled), sampled every second."}, []string{"cluster", "state"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "refusals_total",
			Help: "Client requests and frames Ferry refused, by API (unknown when no header could be read) and reason: bad_frame, unknown_key, unsupported_version, malformed_body and SaslAuthenticate's sasl close the connection; policy, internal_topic, SaslHandshake's sasl, ApiVersions' unsupported_version and upstream are answered with an error code."}, []string{"api", "reason"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "requests_abandoned_total",
			Help: "Client requests left unanswered because their client closed its connection while they waited upstream (not failures), by API."}, []string{"api"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ferry", Name: "request_duration_seconds", Help: "Time from reading a client request to having its answer, by API.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"api"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "state_evictions_total",
			Help: "Entries dropped from Ferry's bounded tables to stay within their bound, by table: coordinators, txn_timeouts, txn_mappings, pid_mappings."}, []string{"table"}),
		metaAll: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ferry", Name: "metadata_all_topics_total",
			Help: "Metadata requests for every topic, by answer: same_bytes and same_fields (the kept translation, the cluster's answer unchanged in its bytes or only in its order), translated (the cluster's answer changed, or first), snapshot (the cluster did not answer)."}, []string{"answer"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.connsOpen, m.held, m.heldTooLong, m.staleCommits, m.connsTotal, m.badFrames, m.bytesOut, m.bytesUp, m.splicedBytes, m.produceSpliced, m.streamed, m.fillersHidden, m.buffered, m.readPauses, m.requests, m.errors, m.upFailures, m.upConns, m.refusals, m.abandoned, m.latency, m.evictions, m.metaAll} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
			}
		}
	}
	for _, t := range []string{stateCoordinators, stateTxnTimeouts, stateTxnMappings, statePIDMappings} {
		m.evictions.WithLabelValues(t)
	}
	for i, a := range metaHowNames {
		m.metaAllBy[i] = m.metaAll.WithLabelValues(a)
	}
	m.splicedToBroker = m.produceSpliced.WithLabelValues("broker")
	m.splicedToFerry = m.produceSpliced.WithLabelValues("ferry")
	for k := range m.byKey {
		name := kmsg.NameForKey(int16(k))
		if name == "Unknown" {
			name = "key_" + strconv.Itoa(k)
		}
		m.byKey[k] = keyMetrics{m.requests.WithLabelValues(name), m.errors.WithLabelValues(name), m.latency.WithLabelValues(name), m.upFailures.WithLabelValues(name), m.abandoned.WithLabelValues(name)}
	}
	return m, nil
}

func (m *metrics) observe(key int16, start time.Time, err error) {
	if key < 0 || int(key) >= len(m.byKey) {
		return
	}
	km := &m.byKey[key]
	if errors.Is(err, upstream.ErrClientClosed) {
		km.abandoned.Inc() // answered to nobody: not a request answered, nor a failure
		return
	}
	km.requests.Inc()
	if err != nil {
		km.errors.Inc()
	}
	km.latency.Observe(time.Since(start).Seconds())
}

func (m *metrics) upstreamFailure(key int16) {
	if key >= 0 && int(key) < len(m.byKey) {
		m.byKey[key].upFailed.Inc()
	}
	m.refused(key, reasonUpstream)
}

// The tables of ferry_state_evictions_total.
const (
	stateCoordinators = "coordinators" // the coordinator cache of a cluster (upstream.coords)
	stateTxnTimeouts  = "txn_timeouts" // Server.txnTimeouts
	stateTxnMappings  = "txn_mappings" // txnRemaps: only entries idle past txnRemapIdle
	statePIDMappings  = "pid_mappings" // remappedPIDs: the least recently used
)

// evicted counts an entry dropped from table.
func (m *metrics) evicted(table string) { m.evictions.WithLabelValues(table).Inc() }

// refused counts one refusal. Refusals are off the request path, so the
// label lookup is affordable.
func (m *metrics) refused(key int16, reason string) {
	m.refusals.WithLabelValues(protocol.APIName(key), reason).Inc()
}
