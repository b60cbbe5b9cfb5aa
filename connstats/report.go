package connstats

// The connections report: the open connections and the latest closed, as
// GET /connections and `ferry connections` show them, in the manner of
// nats-server's /connz.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Info is one client connection as a Report shows it.
type Info struct {
	// ID numbers the server's connections in the order accepted.
	ID     uint64 `json:"id"`
	Remote string `json:"remote"`
	// Lane is the virtual broker the connection reached (-1: a listener
	// of no particular lane).
	Lane int `json:"lane"`
	// Cluster is the physical cluster its latest request was routed to.
	Cluster string `json:"cluster,omitempty"`
	// ClientID is the client.id of its first request's header;
	// SoftwareName and SoftwareVersion what its ApiVersions (v3 and
	// later) named.
	ClientID        string `json:"client_id"`
	SoftwareName    string `json:"software_name,omitempty"`
	SoftwareVersion string `json:"software_version,omitempty"`
	// Principal is the authenticated identity, Kafka's way: "User:<name>"
	// after SASL, "User:<subject DN>" from a verified client certificate;
	// empty (omitted) on a listener without authentication and before it.
	Principal   string     `json:"principal,omitempty"`
	ConnectedAt time.Time  `json:"connected_at"`
	ClosedAt    *time.Time `json:"closed_at,omitempty"`
	// CloseReason is the reason label of
	// ferry_client_connections_closed_total; CloseError the error that
	// closed it, when there was one.
	CloseReason string `json:"close_reason,omitempty"`
	CloseError  string `json:"close_error,omitempty"`
	// IdleSeconds is how long the connection has had no request being read
	// and none in flight (0 while one is).
	IdleSeconds float64 `json:"idle_seconds"`
	InFlight    int64   `json:"in_flight"`
	// BytesIn and BytesOut count request and response frames, sizes
	// included.
	BytesIn  uint64 `json:"bytes_in"`
	BytesOut uint64 `json:"bytes_out"`
	// Requests counts requests read, by API.
	Requests      map[string]uint64 `json:"requests"`
	RequestsTotal uint64            `json:"requests_total"`
	// Errors counts responses Ferry encoded (built, or decoded and
	// rewritten) with a non-zero error code, top-level or partition, by
	// the code's name: once per response for each code. Responses passed
	// through as bytes are not decoded to be counted. ErrorsTotal counts
	// those responses, plus a request refused by closing the connection.
	Errors      map[string]uint64 `json:"errors,omitempty"`
	ErrorsTotal uint64            `json:"errors_total"`
	// LatencyP50Ms and LatencyP99Ms are over the latest LatencySamples
	// answers (at most 128), from reading the request to having its
	// answer; Fetch long polls count at their wait.
	LatencyP50Ms   float64 `json:"latency_p50_ms"`
	LatencyP99Ms   float64 `json:"latency_p99_ms"`
	LatencySamples int     `json:"latency_samples"`
}

// Query selects and orders what a Report holds.
type Query struct {
	// State is open (the default), closed (recently closed connections,
	// kept as ClosedKept says) or all.
	State string
	// Sort is one of Sorts (default id).
	Sort string
	// Offset skips that many matching connections; Limit returns at most
	// that many (default 100, at most 1000).
	Offset, Limit int
	// ClientID, Software, Remote and Principal keep the connections whose
	// client.id, "software_name/software_version", remote address or
	// principal contain them.
	ClientID, Software, Remote, Principal string
}

// Report is the connections a Query selects.
type Report struct {
	Now   time.Time `json:"now"`
	State string    `json:"state"`
	Sort  string    `json:"sort"`
	// Open is the connections open, whatever the filters.
	Open int `json:"open"`
	// Matched is how many connections the state and filters match,
	// before Offset and Limit.
	Matched     int    `json:"matched"`
	Offset      int    `json:"offset"`
	Limit       int    `json:"limit"`
	Connections []Info `json:"connections"`
}

// ErrQuery is wrapped by the errors about a Query.
var ErrQuery = errors.New("invalid connections query")

// Closed connections are kept for the report this long, at most this many.
const (
	ClosedKept   = 1000
	ClosedMaxAge = 5 * time.Minute
)

const (
	defaultLimit = 100
	maxLimit     = 1000
)

// sorts orders connections by each Sort value: counters largest
// first, the rest ascending; ties by ID.
var sorts = map[string]func(a, b *Info) int{
	"id":           func(a, b *Info) int { return 0 },
	"connected_at": func(a, b *Info) int { return a.ConnectedAt.Compare(b.ConnectedAt) },
	"client_id":    func(a, b *Info) int { return cmp.Compare(a.ClientID, b.ClientID) },
	"bytes_in":     func(a, b *Info) int { return cmp.Compare(b.BytesIn, a.BytesIn) },
	"bytes_out":    func(a, b *Info) int { return cmp.Compare(b.BytesOut, a.BytesOut) },
	"requests":     func(a, b *Info) int { return cmp.Compare(b.RequestsTotal, a.RequestsTotal) },
	"errors":       func(a, b *Info) int { return cmp.Compare(b.ErrorsTotal, a.ErrorsTotal) },
	"in_flight":    func(a, b *Info) int { return cmp.Compare(b.InFlight, a.InFlight) },
	"idle":         func(a, b *Info) int { return cmp.Compare(b.IdleSeconds, a.IdleSeconds) },
	"latency":      func(a, b *Info) int { return cmp.Compare(b.LatencyP99Ms, a.LatencyP99Ms) },
	"closed_at": func(a, b *Info) int { // latest first, open ones last
		switch {
		case a.ClosedAt == nil && b.ClosedAt == nil:
			return 0
		case a.ClosedAt == nil:
			return 1
		case b.ClosedAt == nil:
			return -1
		}
		return b.ClosedAt.Compare(*a.ClosedAt)
	},
}

// Sorts lists the values Query.Sort takes.
func Sorts() []string {
	out := make([]string, 0, len(sorts))
	for k := range sorts {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Check fills in the defaults of q and checks it; its errors wrap
// ErrQuery.
func (q *Query) Check() error {
	if q.State == "" {
		q.State = "open"
	}
	if q.Sort == "" {
		q.Sort = "id"
	}
	if q.Limit == 0 {
		q.Limit = defaultLimit
	}
	_, ok := sorts[q.Sort]
	switch {
	case q.State != "open" && q.State != "closed" && q.State != "all":
		return fmt.Errorf("%w: state %q: want open, closed or all", ErrQuery, q.State)
	case !ok:
		return fmt.Errorf("%w: sort %q: want one of %s", ErrQuery, q.Sort, strings.Join(Sorts(), ", "))
	case q.Offset < 0:
		return fmt.Errorf("%w: offset %d is negative", ErrQuery, q.Offset)
	case q.Limit < 0 || q.Limit > maxLimit:
		return fmt.Errorf("%w: limit %d: want 1 to %d", ErrQuery, q.Limit, maxLimit)
	}
	return nil
}

// Select is the report of q (checked) over all, the connections of its
// state, open of them open.
func Select(q Query, now time.Time, open int, all []Info) *Report {
	less := sorts[q.Sort]
	matched := all[:0]
	for _, ci := range all {
		if ci.matches(&q) {
			matched = append(matched, ci)
		}
	}
	slices.SortFunc(matched, func(a, b Info) int {
		if c := less(&a, &b); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	out := &Report{Now: now.UTC(), State: q.State, Sort: q.Sort, Open: open, Matched: len(matched), Offset: q.Offset, Limit: q.Limit, Connections: []Info{}}
	if q.Offset < len(matched) {
		out.Connections = append(out.Connections, matched[q.Offset:min(q.Offset+q.Limit, len(matched))]...)
	}
	return out
}

func (ci *Info) matches(o *Query) bool {
	return strings.Contains(ci.ClientID, o.ClientID) &&
		strings.Contains(ci.Remote, o.Remote) &&
		strings.Contains(ci.Principal, o.Principal) &&
		strings.Contains(ci.SoftwareName+"/"+ci.SoftwareVersion, o.Software)
}

// Identity is who a connection says it is: the client.id of its first
// request's header and, from ApiVersions v3 and later, its software.
type Identity struct {
	ClientID                      string
	SoftwareName, SoftwareVersion string
}

// Fill sets ci's counters from st.
func (st *Stats) Fill(ci *Info) {
	ci.BytesIn, ci.BytesOut = st.Bytes()
	ci.Requests, ci.RequestsTotal = st.RequestsByAPI()
	ci.Errors, ci.ErrorsTotal = st.ErrorsByCode(), st.ErrorsTotal()
	p50, p99, n := st.Latencies()
	ci.LatencyP50Ms, ci.LatencyP99Ms, ci.LatencySamples = ms(p50), ms(p99), n
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Ring keeps the latest closed connections: at most ClosedKept, none
// closed more than ClosedMaxAge ago.
type Ring struct {
	mu   sync.Mutex
	buf  []Info // oldest first from head, once full
	head int
}

// Add keeps ci, a closed connection.
func (r *Ring) Add(ci Info) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) < ClosedKept {
		r.buf = append(r.buf, ci)
		return
	}
	r.buf[r.head] = ci
	r.head = (r.head + 1) % ClosedKept
}

// List is the connections kept, none closed more than ClosedMaxAge
// before now.
func (r *Ring) List(now time.Time) []Info {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Info, 0, len(r.buf))
	for i := range r.buf {
		ci := r.buf[(r.head+i)%len(r.buf)]
		if now.Sub(*ci.ClosedAt) <= ClosedMaxAge {
			out = append(out, ci)
		}
	}
	return out
}
