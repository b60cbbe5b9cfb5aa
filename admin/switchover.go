package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/routing"
)

// SwitchFunc runs one switch of the active cluster and returns the state in
// force once it is done; its errors are *routing.Error. cmd/ferry passes a
// routing.Switcher's Switch.
type SwitchFunc func(ctx context.Context, req routing.Request) (routing.State, error)

// WithSwitch enables POST /switchover, which runs f. Without it the
// endpoint does not exist (404).
func WithSwitch(f SwitchFunc) Option { return func(c *config) { c.switchFn = f } }

// WithToken requires "Authorization: Bearer <token>" on the endpoints that
// change something (POST /switchover), and to see the principals, client
// addresses and close errors of GET /connections (WithPublicRead aside).
// Empty: all of it is open, which the caller allows only on a loopback
// address.
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// WithTLS serves the API over TLS with cfg. When cfg verifies client
// certificates, a request that presents a verified one may change things
// without the token: the certificate is the credential (mutual TLS).
func WithTLS(cfg *tls.Config) Option { return func(c *config) { c.tls = cfg } }

// WithRegisterer registers the routing and switchover metrics
// (ferry_routing_generation, ferry_switchover_*) there. Without it they are
// not exported.
func WithRegisterer(r prometheus.Registerer) Option { return func(c *config) { c.registerer = r } }

// MaxSwitchTimeout bounds the timeout a switchover request may ask for:
// writes are held for as long as the drain takes.
const MaxSwitchTimeout = 10 * time.Minute

// SwitchMargin is how long a switch may run beyond its drain timeout:
// saving the new state and installing it have their own bounds (30 s
// each). A client waiting for the answer should wait the timeout plus this.
const SwitchMargin = time.Minute

// maxSwitchBody bounds a switchover request's body.
const maxSwitchBody = 64 << 10

// RoutingStatus is the routing section of /status and the answer to a
// switchover: the state in force without its fences, which grow with the
// number of partitions.
type RoutingStatus struct {
	Generation uint32        `json:"generation"`
	Active     string        `json:"active"`
	Phase      routing.Phase `json:"phase"`
	// LastSwitch is the most recent switch, finished or not; null before
	// the first.
	LastSwitch *routing.Switch `json:"last_switch"`
	// History is the switches before it, newest first (at most
	// routing.MaxHistory), kept in the routing state: every member, and a
	// restarted one, shows the same.
	History []routing.Switch `json:"history"`
	// FailoverPaused is set while automatic failover is paused.
	FailoverPaused *routing.FailoverPause `json:"failover_paused,omitempty"`
}

func routingStatus(st routing.State) RoutingStatus {
	phase := st.Phase
	if phase == "" {
		phase = routing.PhaseServing
	}
	history := slices.Clone(st.History)
	slices.Reverse(history)
	if history == nil {
		history = []routing.Switch{}
	}
	return RoutingStatus{Generation: st.Generation, Active: st.Active, Phase: phase, LastSwitch: st.Last, History: history, FailoverPaused: st.FailoverPaused}
}

// SwitchRequest is the body of POST /switchover.
type SwitchRequest struct {
	// To names the cluster to make active. Required.
	To string `json:"to"`
	// Mode is planned (default) or forced.
	Mode routing.Mode `json:"mode,omitempty"`
	// Timeout bounds a planned switch's drain, as a Go duration ("30s");
	// default routing.DefaultSwitchTimeout, at most MaxSwitchTimeout.
	Timeout string `json:"timeout,omitempty"`
	// ForceUnauthenticated, with mode forced only, switches even when
	// some mapped client principals cannot authenticate on the target
	// (they lose their access to the clusters until they can).
	ForceUnauthenticated bool `json:"force_unauthenticated,omitempty"`
}

// ErrorBody is how the admin API answers a refused request.
type ErrorBody struct {
	// Error is the reason: one of routing's Reason constants, or
	// unauthorized, method_not_allowed, internal.
	Error      string   `json:"error"`
	Message    string   `json:"message"`
	Partitions []string `json:"partitions,omitempty"`
	// Principals lists, for principals_unauthenticated, the mapped client
	// principals that could not authenticate on the target, with why.
	Principals []string `json:"principals,omitempty"`
	// Switch names, for switch_running, the switch already running
	// (its ID), when known.
	Switch string `json:"switch,omitempty"`
}

// Reasons the admin API answers besides routing's.
const (
	ReasonUnauthorized     = "unauthorized"
	ReasonMethodNotAllowed = "method_not_allowed"
	ReasonInternal         = "internal"
)

// switchStatus is the HTTP status of a switch refused for reason.
func switchStatus(reason string) int {
	switch reason {
	case routing.ReasonBadRequest, routing.ReasonUnknownCluster:
		return http.StatusBadRequest
	case routing.ReasonAlreadyActive, routing.ReasonRunning, routing.ReasonHalted, routing.ReasonNoMirror, routing.ReasonPrincipals, routing.ReasonGenerationLimit, routing.ReasonSuperseded:
		return http.StatusConflict
	case routing.ReasonDrainTimeout:
		return http.StatusGatewayTimeout
	default: // save_failed, or an error that is no *routing.Error
		return http.StatusInternalServerError
	}
}

// HandleMutating adds an endpoint that changes something: it answers method
// only, behind the token (401 without it, h not run), and a JSON 405 naming
// the method for any other. Call it before Serve.
func (s *Server) HandleMutating(method, path string, h http.Handler) {
	s.mux.Handle(method+" "+path, s.authorize(h))
	s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", method)
		writeJSON(w, http.StatusMethodNotAllowed, ErrorBody{Error: ReasonMethodNotAllowed, Message: fmt.Sprintf("%s %s: use %s", r.Method, path, method)})
	})
}

// authorize lets a request through when no token is configured or it
// carries the token (or a verified client certificate); otherwise 401, or
// 429 from an address that sent too many wrong tokens, and h never runs.
func (s *Server) authorize(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		if cred != credFull {
			s.refuseToken(w, r, authNoToken, 0, "")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hasVerifiedCert reports whether the request came over TLS with a client
// certificate the server verified against its client CAs.
func hasVerifiedCert(r *http.Request) bool {
	return r.TLS != nil && len(r.TLS.VerifiedChains) > 0
}

// hasToken compares the bearer token in constant time. Both sides are
// hashed first so that not even the token's length shows in the timing.
func (s *Server) hasToken(r *http.Request) bool {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	want := sha256.Sum256([]byte(s.cfg.token))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// ParseSwitchRequest reads a switchover body strictly: JSON, one object,
// no unknown fields, "to" given, a known mode, a timeout within bounds. Its
// errors are *routing.Error with ReasonBadRequest.
func ParseSwitchRequest(r io.Reader) (routing.Request, error) {
	bad := func(format string, args ...any) (routing.Request, error) {
		return routing.Request{}, &routing.Error{Reason: routing.ReasonBadRequest, Msg: fmt.Sprintf(format, args...)}
	}
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var body SwitchRequest
	if err := dec.Decode(&body); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.Is(err, io.EOF):
			return bad(`the body is empty; want {"to": "<cluster>", "mode": "planned"|"forced", "timeout": "30s"}`)
		case errors.As(err, &mbe):
			return bad("the body is larger than %d bytes", mbe.Limit)
		}
		return bad("the body is not a switchover request: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return bad("the body holds more than one JSON value")
	}
	req := routing.Request{To: body.To, Mode: body.Mode, Timeout: routing.DefaultSwitchTimeout, SkipPrincipalCheck: body.ForceUnauthenticated}
	if req.To == "" {
		return bad(`"to" is required: the cluster to make active`)
	}
	switch req.Mode {
	case "":
		req.Mode = routing.Planned
	case routing.Planned, routing.Forced:
	default:
		return bad(`mode %q: want "planned" or "forced"`, body.Mode)
	}
	if body.ForceUnauthenticated && req.Mode != routing.Forced {
		return bad(`force_unauthenticated is for mode "forced" only: a planned switch always checks the mapped principals`)
	}
	if body.Timeout != "" {
		d, err := time.ParseDuration(body.Timeout)
		if err != nil {
			return bad(`timeout %q: not a duration (e.g. "30s", "2m")`, body.Timeout)
		}
		if d <= 0 || d > MaxSwitchTimeout {
			return bad("timeout %s: must be more than 0 and at most %s", d, MaxSwitchTimeout)
		}
		req.Timeout = d
	}
	return req, nil
}

// HandleSwitchover runs POST /switchover: the switch, then 200 with the
// routing state in force, or the refusal.
//
// The switch runs on a context detached from the request: a client that
// disconnects (a curl interrupted, a proxy timing out) must not cancel a
// switch midway, which would roll a planned switch back after holding
// writes, for nothing. The switch is bounded by its timeout plus
// SwitchMargin instead.
func (s *Server) HandleSwitchover(w http.ResponseWriter, r *http.Request) {
	req, err := ParseSwitchRequest(http.MaxBytesReader(w, r.Body, maxSwitchBody))
	if err != nil {
		s.writeSwitchError(w, err)
		return
	}
	// The server's write timeout (1 minute) would cut the answer to a long
	// drain; this answer gets the switch's own bound.
	bound := req.Timeout + SwitchMargin
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(bound + 10*time.Second))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), bound)
	defer cancel()

	log := s.cfg.log.With(zap.String("to", req.To), zap.String("mode", string(req.Mode)), zap.Duration("timeout", req.Timeout), zap.String("remote", r.RemoteAddr))
	log.Info("switchover requested")
	before := s.cfg.routes.Current()
	st, err := s.cfg.switchFn(ctx, req)
	s.metrics.observe(req.Mode, before, st, err)
	if err != nil {
		log.Warn("switchover refused", zap.Error(err))
		s.writeSwitchError(w, err)
		return
	}
	log.Info("switchover done", zap.Stringer("routing", st))
	writeJSON(w, http.StatusOK, routingStatus(st))
}

func (s *Server) writeSwitchError(w http.ResponseWriter, err error) {
	var re *routing.Error
	if !errors.As(err, &re) {
		writeJSON(w, http.StatusInternalServerError, ErrorBody{Error: ReasonInternal, Message: err.Error()})
		return
	}
	writeJSON(w, switchStatus(re.Reason), ErrorBody{Error: re.Reason, Message: re.Msg, Partitions: re.Partitions, Principals: re.Principals, Switch: re.Switch})
}

// writeJSON answers v as indented JSON with the given status.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nothing to do
}

// switchMetrics exports the routing state and the switches run here. The
// generation and the phase are read from the table at each scrape, so they
// are true whoever changed it; the counters and the last duration and losses
// count the switches this member's API ran.
type switchMetrics struct {
	routes     *routing.Table
	generation *prometheus.Desc
	phase      *prometheus.Desc
	total      *prometheus.CounterVec
	duration   *prometheus.GaugeVec
	lost       *prometheus.GaugeVec
}

var phases = []routing.Phase{routing.PhaseServing, routing.PhaseDraining, routing.PhaseSwitching}

func newSwitchMetrics(routes *routing.Table) *switchMetrics {
	m := &switchMetrics{
		routes: routes,
		generation: prometheus.NewDesc("ferry_routing_generation",
			"The routing generation in force; it increases at every switch of the active cluster.", nil, nil),
		phase: prometheus.NewDesc("ferry_switchover_phase",
			"1 for the switchover phase this member is in (serving, draining, switching), 0 for the others.", []string{"phase"}, nil),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_switchovers_total",
			Help: "Switchovers asked of this member's admin API, by mode and outcome: switched, or the reason it was refused or rolled back.",
		}, []string{"mode", "outcome"}),
		duration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_switchover_duration_seconds",
			Help: "How long the last switchover of this mode took, from holding writes to installing the new generation (or rolling back).",
		}, []string{"mode"}),
		lost: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_switchover_lost_offsets",
			Help: "Offsets the old active cluster held that the new one never received, per partition, at the last forced switchover (-1: from the range's start on, how many unknown: the old cluster could not be read).",
		}, []string{"topic", "partition"}),
	}
	for _, mode := range []routing.Mode{routing.Planned, routing.Forced} {
		m.total.WithLabelValues(string(mode), "switched")
	}
	return m
}

func (m *switchMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.generation
	ch <- m.phase
	m.total.Describe(ch)
	m.duration.Describe(ch)
	m.lost.Describe(ch)
}

func (m *switchMetrics) Collect(ch chan<- prometheus.Metric) {
	st := m.routes.Current()
	ch <- prometheus.MustNewConstMetric(m.generation, prometheus.GaugeValue, float64(st.Generation))
	cur := st.Phase
	if cur == "" {
		cur = routing.PhaseServing
	}
	for _, p := range phases {
		v := 0.0
		if p == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(m.phase, prometheus.GaugeValue, v, string(p))
	}
	m.total.Collect(ch)
	m.duration.Collect(ch)
	m.lost.Collect(ch)
}

// observe counts one switch call. A repeat of a switch that finished (same
// generation, no error) changed nothing and counts nothing.
func (m *switchMetrics) observe(mode routing.Mode, before, after routing.State, err error) {
	if m == nil {
		return
	}
	if err == nil && after.Generation == before.Generation {
		return
	}
	outcome := "switched"
	if err != nil {
		outcome = ReasonInternal
		var re *routing.Error
		if errors.As(err, &re) {
			outcome = re.Reason
		}
	}
	m.total.WithLabelValues(string(mode), outcome).Inc()
	// A rolled-back switch is in the table, not in the answer.
	last := after.Last
	if err != nil {
		last = m.routes.Current().Last
	}
	if last == nil || last.Finished.IsZero() || (before.Last != nil && last.Started.Equal(before.Last.Started)) {
		return // refused before it started
	}
	m.duration.WithLabelValues(string(last.Mode)).Set(last.Finished.Sub(last.Started).Seconds())
	if err == nil && last.Mode == routing.Forced {
		m.lost.Reset()
		for _, l := range last.Lost {
			n := float64(l.To - l.From)
			if l.To == routing.UnknownEnd {
				n = -1 // the old cluster's end is unknown
			}
			m.lost.WithLabelValues(l.Topic, strconv.Itoa(int(l.Partition))).Set(n)
		}
	}
}
