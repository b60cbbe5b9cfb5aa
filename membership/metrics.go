package membership

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a call, the outcome label of ferry_fleet_calls_total.
const (
	outcomeOK          = "ok"          // the handler answered
	outcomeRefused     = "refused"     // the handler returned an error (or there is none for the kind)
	outcomeUnreachable = "unreachable" // not a live member, or the request could not be sent
	outcomeTimeout     = "timeout"     // the context ended before the answer came
	outcomeBusy        = "busy"        // the member called had its call's lane full: nothing ran
)

type metrics struct {
	members  *prometheus.GaugeVec
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	busy     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_fleet_members",
			Help: "Members of the Ferry fleet this member knows, by state (alive, suspect, dead, left)."}, []string{"state"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_fleet_calls_total",
			Help: "Calls this member made to fleet members (itself included), by kind and outcome (ok, refused, unreachable, timeout, busy)."},
			[]string{"kind", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_fleet_call_duration_seconds",
			Help:    "Time from a call to a fleet member to its answer, by kind.",
			Buckets: []float64{.001, .005, .025, .1, .5, 2.5, 10}}, []string{"kind"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_fleet_calls_busy_total",
			Help: "Calls from other members this member answered busy without running them, by kind: every handler slot of the call's lane (switch control, or the other kinds) was taken."},
			[]string{"kind"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.members, m.calls, m.duration, m.busy} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			// Two fleets on one registry (tests) share the series.
			switch existing := are.ExistingCollector.(type) {
			case *prometheus.GaugeVec:
				m.members = existing
			case *prometheus.CounterVec:
				if c == m.busy {
					m.busy = existing
				} else {
					m.calls = existing
				}
			case *prometheus.HistogramVec:
				m.duration = existing
			default:
				return nil, err
			}
		}
	}
	for _, s := range []State{Alive, Suspect, Dead, Left} {
		m.members.WithLabelValues(s.String())
	}
	return m, nil
}

func (m *metrics) setMembers(ms []Member) {
	var n [4]int
	for _, x := range ms {
		if int(x.State) < len(n) {
			n[x.State]++
		}
	}
	for s, c := range n {
		m.members.WithLabelValues(State(s).String()).Set(float64(c))
	}
}
