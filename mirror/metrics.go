package mirror

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the mirror's Prometheus metrics, registered on the
// Registerer passed in (if any).
type metrics struct {
	halts        *prometheus.CounterVec
	halted       *prometheus.GaugeVec
	batches      *prometheus.CounterVec
	bytes        prometheus.Counter
	fillers      prometheus.Counter
	lostCommit   prometheus.Counter
	resumedTxns  prometheus.Counter
	reframed     prometheus.Counter
	recompressed prometheus.Counter
	syncErrors   *prometheus.CounterVec
	owned        prometheus.Gauge
	handovers    *prometheus.CounterVec
	conns        *connCount
	parked       prometheus.Gauge
	starts       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	tp := partitionLabels
	m := &metrics{
		halts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_mirror_halts_total",
			Help: "Partition writers halted, by reason."}, []string{"reason"}),
		halted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_mirror_partition_halted",
			Help: "1 for a partition whose writer halted, labelled with why (see ferry_mirror_halts_total)."}, append(tp, "reason")),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_mirror_batches_total",
			Help: "Batches appended to the standby, by kind (plain, txn, filler)."}, []string{"kind"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_mirror_bytes_total",
			Help: "Bytes of source batches appended to the standby."}),
		fillers: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_mirror_filler_offsets_total",
			Help: "Offsets filled on the standby where the source holds no data record."}),
		lostCommit: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_mirror_lost_commits_total",
			Help: "Source COMMIT markers found as ABORT on the standby after a writer crash."}),
		resumedTxns: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_mirror_resumed_txns_total",
			Help: "Writer transactions left open by an earlier writer (crash) and resumed to end at the source marker's offset."}),
		reframed: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_mirror_reframed_batches_total",
			Help: "Uncompressed source batches with holes inside them (log cleaner) split into runs of consecutive records."}),
		recompressed: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_mirror_recompressed_batches_total",
			Help: "Compressed source batches with holes inside them (log cleaner) split into runs of consecutive records, each compressed again with the batch's codec."}),
		syncErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_mirror_sync_errors_total",
			Help: "Metadata sync steps that failed, by step."}, []string{"step"}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_mirror_partitions_owned",
			Help: "Mirrored partitions this member owns (writes), whether or not their writer is running."}),
		handovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_mirror_handovers_total",
			Help: "Partitions whose ownership this member gained or lost (direction), after it first learnt of them."}, []string{"direction"}),
		conns: &connCount{Gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_mirror_connections",
			Help: "Broker connections the mirror's writers and idle-partition watchers hold open."})},
		parked: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_mirror_idle_partitions",
			Help: "Mirrored partitions idle long enough that their writers hold no connection and one fetch session per source broker watches them."}),
		starts: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_mirror_writer_start_seconds",
			Help:    "How long partition writers took to start a session (leaders, ownership, slots, the wait for a setup place, the standby's end and tail checks) before copying or parking.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
	}
	// Both directions exist from the start, so that a rate shows 0.
	m.handovers.WithLabelValues("gained")
	m.handovers.WithLabelValues("lost")
	if reg != nil {
		reg.MustRegister(m.halts, m.halted, m.batches,
			m.bytes, m.fillers, m.lostCommit, m.resumedTxns, m.reframed, m.recompressed, m.syncErrors, m.owned, m.handovers, m.conns, m.parked, m.starts)
	}
	return m
}

// forget drops a partition's halted series; its other series go with its
// writer (partitionMetrics).
func (m *metrics) forget(topic string, partition int32) {
	m.halted.DeletePartialMatch(prometheus.Labels{"topic": topic, "partition": strconv.Itoa(int(partition))})
}

// The per-partition series, read from each writer's status at each
// scrape: kept as four gauges per partition, their label pairs, hashes and
// map entries took about 3 KiB of heap per mirrored partition, a quarter
// of what an idle (parked) partition cost besides.
var (
	partitionLabels = []string{"topic", "partition"}
	stateDesc       = prometheus.NewDesc("ferry_mirror_partition_state",
		"Partition writer state: 0 starting, 1 mirroring, 2 caught up, 3 halted, 4 stopped.", partitionLabels, nil)
	mirroredDesc = prometheus.NewDesc("ferry_mirror_mirrored_offset",
		"The standby's end offset, acknowledged by the standby: every source offset below it is mirrored.", partitionLabels, nil)
	lagRecordsDesc = prometheus.NewDesc("ferry_mirror_lag_records",
		"Offsets on the source (high watermark) not yet mirrored to the standby.", partitionLabels, nil)
	lagSecondsDesc = prometheus.NewDesc("ferry_mirror_lag_seconds",
		"Seconds since the partition was last fully mirrored (0 when caught up).", partitionLabels, nil)
)

// partitionMetrics exports the state of every partition whose writer runs
// in the Mirror, and, once it has started, its mirrored offset and lag.
type partitionMetrics struct{ m *Mirror }

func (c partitionMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- stateDesc
	ch <- mirroredDesc
	ch <- lagRecordsDesc
	ch <- lagSecondsDesc
}

func (c partitionMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.m.Status() {
		p := strconv.Itoa(int(st.Partition))
		ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, float64(st.State), st.Topic, p)
		if st.Mirrored >= 0 {
			ch <- prometheus.MustNewConstMetric(mirroredDesc, prometheus.GaugeValue, float64(st.Mirrored), st.Topic, p)
		} else if st.SourceEnd < 0 {
			continue // neither end known yet: no lag to tell
		}
		lag := time.Duration(0)
		if st.LagRecords > 0 {
			lag = st.LagTime
		}
		ch <- prometheus.MustNewConstMetric(lagRecordsDesc, prometheus.GaugeValue, float64(st.LagRecords), st.Topic, p)
		ch <- prometheus.MustNewConstMetric(lagSecondsDesc, prometheus.GaugeValue, lag.Seconds(), st.Topic, p)
	}
}

// halt counts a partition writer's halt.
func (m *metrics) halt(topic string, partition int32, err error) {
	reason := haltReason(err)
	m.halts.WithLabelValues(reason).Inc()
	m.halted.WithLabelValues(topic, strconv.Itoa(int(partition)), reason).Set(1)
}

// connCount is the mirror's open connections: the gauge reports them, and
// writers read the count to decide whether to park (ConnectionBudget).
type connCount struct {
	prometheus.Gauge
	n atomic.Int64
}

func (c *connCount) Inc() { c.n.Add(1); c.Gauge.Inc() }
func (c *connCount) Dec() { c.n.Add(-1); c.Gauge.Dec() }

// over reports whether more than budget are open (budget 0: no bound).
func (c *connCount) over(budget int) bool { return budget > 0 && c.n.Load() > int64(budget) }
