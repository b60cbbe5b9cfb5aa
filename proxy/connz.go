package proxy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// ConnInfo is one client connection as Connz reports it.
type ConnInfo struct {
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

// ConnzOptions selects and orders what Connz returns.
type ConnzOptions struct {
	// State is open (the default), closed (recently closed connections,
	// kept as ClosedKept says) or all.
	State string
	// Sort is one of ConnzSorts (default id).
	Sort string
	// Offset skips that many matching connections; Limit returns at most
	// that many (default 100, at most 1000).
	Offset, Limit int
	// ClientID, Software, Remote and Principal keep the connections whose
	// client.id, "software_name/software_version", remote address or
	// principal contain them.
	ClientID, Software, Remote, Principal string
}

// Connz is what Connz returns.
type Connz struct {
	Now   time.Time `json:"now"`
	State string    `json:"state"`
	Sort  string    `json:"sort"`
	// Open is the connections open, whatever the filters.
	Open int `json:"open"`
	// Matched is how many connections the state and filters match,
	// before Offset and Limit.
	Matched     int        `json:"matched"`
	Offset      int        `json:"offset"`
	Limit       int        `json:"limit"`
	Connections []ConnInfo `json:"connections"`
}

// ErrConnzOptions is wrapped by Connz's errors about its options.
var ErrConnzOptions = errors.New("invalid connections query")

// Closed connections are kept for Connz this long, at most this many.
const (
	ClosedKept   = 1000
	ClosedMaxAge = 5 * time.Minute
)

const (
	defaultConnzLimit = 100
	maxConnzLimit     = 1000
)

// connzSorts orders connections by each Sort value: counters largest
// first, the rest ascending; ties by ID.
var connzSorts = map[string]func(a, b *ConnInfo) int{
	"id":           func(a, b *ConnInfo) int { return 0 },
	"connected_at": func(a, b *ConnInfo) int { return a.ConnectedAt.Compare(b.ConnectedAt) },
	"client_id":    func(a, b *ConnInfo) int { return cmp.Compare(a.ClientID, b.ClientID) },
	"bytes_in":     func(a, b *ConnInfo) int { return cmp.Compare(b.BytesIn, a.BytesIn) },
	"bytes_out":    func(a, b *ConnInfo) int { return cmp.Compare(b.BytesOut, a.BytesOut) },
	"requests":     func(a, b *ConnInfo) int { return cmp.Compare(b.RequestsTotal, a.RequestsTotal) },
	"errors":       func(a, b *ConnInfo) int { return cmp.Compare(b.ErrorsTotal, a.ErrorsTotal) },
	"in_flight":    func(a, b *ConnInfo) int { return cmp.Compare(b.InFlight, a.InFlight) },
	"idle":         func(a, b *ConnInfo) int { return cmp.Compare(b.IdleSeconds, a.IdleSeconds) },
	"latency":      func(a, b *ConnInfo) int { return cmp.Compare(b.LatencyP99Ms, a.LatencyP99Ms) },
	"closed_at": func(a, b *ConnInfo) int { // latest first, open ones last
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

// ConnzSorts lists the values ConnzOptions.Sort takes.
func ConnzSorts() []string {
	out := make([]string, 0, len(connzSorts))
	for k := range connzSorts {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Connz reports the server's client connections, in the manner of
// nats-server's /connz.
func (s *Server) Connz(o ConnzOptions) (*Connz, error) {
	if o.State == "" {
		o.State = "open"
	}
	if o.Sort == "" {
		o.Sort = "id"
	}
	if o.Limit == 0 {
		o.Limit = defaultConnzLimit
	}
	less, ok := connzSorts[o.Sort]
	switch {
	case o.State != "open" && o.State != "closed" && o.State != "all":
		return nil, fmt.Errorf("%w: state %q: want open, closed or all", ErrConnzOptions, o.State)
	case !ok:
		return nil, fmt.Errorf("%w: sort %q: want one of %s", ErrConnzOptions, o.Sort, strings.Join(ConnzSorts(), ", "))
	case o.Offset < 0:
		return nil, fmt.Errorf("%w: offset %d is negative", ErrConnzOptions, o.Offset)
	case o.Limit < 0 || o.Limit > maxConnzLimit:
		return nil, fmt.Errorf("%w: limit %d: want 1 to %d", ErrConnzOptions, o.Limit, maxConnzLimit)
	}
	now := time.Now()
	s.mu.Lock()
	open := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		open = append(open, c)
	}
	s.mu.Unlock()
	var all []ConnInfo
	if o.State != "closed" {
		for _, c := range open {
			all = append(all, c.info(now))
		}
	}
	if o.State != "open" {
		all = append(all, s.closedConns.list(now)...)
	}
	matched := all[:0]
	for _, ci := range all {
		if ci.matches(&o) {
			matched = append(matched, ci)
		}
	}
	slices.SortFunc(matched, func(a, b ConnInfo) int {
		if c := less(&a, &b); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	out := &Connz{Now: now.UTC(), State: o.State, Sort: o.Sort, Open: len(open), Matched: len(matched), Offset: o.Offset, Limit: o.Limit, Connections: []ConnInfo{}}
	if o.Offset < len(matched) {
		out.Connections = append(out.Connections, matched[o.Offset:min(o.Offset+o.Limit, len(matched))]...)
	}
	return out, nil
}

func (ci *ConnInfo) matches(o *ConnzOptions) bool {
	return strings.Contains(ci.ClientID, o.ClientID) &&
		strings.Contains(ci.Remote, o.Remote) &&
		strings.Contains(ci.Principal, o.Principal) &&
		strings.Contains(ci.SoftwareName+"/"+ci.SoftwareVersion, o.Software)
}

// connIdentity is who a connection says it is, fixed by its first request
// (identify).
type connIdentity struct {
	clientID                      string
	softwareName, softwareVersion string
}

// identify records who the client is from its first request: the header's
// client.id and, in ApiVersions v3 and later, its software. An ApiVersions
// Ferry could not parse (a version too new, answered UNSUPPORTED_VERSION)
// waits for the client's retry. It runs on the reader goroutine.
func (c *clientConn) identify(req *request) {
	if req.hdr.Key == int16(kmsg.ApiVersions) && req.kr == nil {
		return
	}
	c.identified = true
	id := &connIdentity{clientID: req.hdr.ClientID}
	if av, ok := req.kr.(*kmsg.ApiVersionsRequest); ok {
		id.softwareName, id.softwareVersion = av.ClientSoftwareName, av.ClientSoftwareVersion
	}
	c.identity.Store(id)
	if c.stats != nil {
		c.s.clientMetrics.bind(c, id)
	}
}

// info is the connection's ConnInfo now.
func (c *clientConn) info(now time.Time) ConnInfo {
	ci := ConnInfo{ID: c.id, Remote: c.remote, Lane: c.lane, ConnectedAt: c.connectedAt.UTC(), InFlight: c.inflight.Load(), Requests: map[string]uint64{}}
	if id := c.identity.Load(); id != nil {
		ci.ClientID, ci.SoftwareName, ci.SoftwareVersion = id.clientID, id.softwareName, id.softwareVersion
	}
	if u := c.cluster.Load(); u != nil {
		ci.Cluster = u.name
	}
	ci.Principal = c.principalName()
	if ci.InFlight == 0 {
		ci.IdleSeconds = max(now.Sub(time.Unix(0, c.lastActive.Load())).Seconds(), 0)
	}
	if st := c.stats; st != nil {
		ci.BytesIn, ci.BytesOut = st.bytesIn.Load(), st.bytesOut.Load()
		ci.Requests, ci.RequestsTotal = st.requestsByAPI()
		ci.Errors, ci.ErrorsTotal = st.errorsByCode(), st.errors.Load()
		p50, p99, n := st.latencies()
		ci.LatencyP50Ms, ci.LatencyP99Ms, ci.LatencySamples = ms(p50), ms(p99), n
	}
	return ci
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// retire records a connection that has closed, every goroutine of it done:
// its counters into the per-client metrics, its last state into the
// closed ring.
func (s *Server) retire(c *clientConn) {
	if c.stats != nil {
		s.clientMetrics.retire(c)
	}
	now := time.Now()
	ci := c.info(now)
	at := c.closedAt.UTC()
	ci.ClosedAt, ci.CloseReason, ci.InFlight = &at, c.closeReason, 0
	if c.closeErr != nil {
		ci.CloseError = c.closeErr.Error()
	}
	s.closedConns.add(ci)
}

// closedRing keeps the latest closed connections: at most ClosedKept, none
// closed more than ClosedMaxAge ago.
type closedRing struct {
	mu   sync.Mutex
	buf  []ConnInfo // oldest first from head, once full
	head int
}

func (r *closedRing) add(ci ConnInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) < ClosedKept {
		r.buf = append(r.buf, ci)
		return
	}
	r.buf[r.head] = ci
	r.head = (r.head + 1) % ClosedKept
}

func (r *closedRing) list(now time.Time) []ConnInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ConnInfo, 0, len(r.buf))
	for i := range r.buf {
		ci := r.buf[(r.head+i)%len(r.buf)]
		if now.Sub(*ci.ClosedAt) <= ClosedMaxAge {
			out = append(out, ci)
		}
	}
	return out
}
