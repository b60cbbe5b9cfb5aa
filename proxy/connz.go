package proxy

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/connstats"
)

// Connz reports the server's client connections (GET /connections).
func (s *Server) Connz(q connstats.Query) (*connstats.Report, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	now := time.Now()
	s.mu.Lock()
	open := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		open = append(open, c)
	}
	s.mu.Unlock()
	var all []connstats.Info
	if q.State != "closed" {
		for _, c := range open {
			all = append(all, c.info(now))
		}
	}
	if q.State != "open" {
		all = append(all, s.closedConns.List(now)...)
	}
	return connstats.Select(q, now, len(open), all), nil
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
	id := &connstats.Identity{ClientID: req.hdr.ClientID}
	if av, ok := req.kr.(*kmsg.ApiVersionsRequest); ok {
		id.SoftwareName, id.SoftwareVersion = av.ClientSoftwareName, av.ClientSoftwareVersion
	}
	c.identity.Store(id)
	if c.stats != nil {
		c.s.clientMetrics.Bind(c.stats, id)
	}
}

// info is the connection as the report shows it now.
func (c *clientConn) info(now time.Time) connstats.Info {
	ci := connstats.Info{ID: c.id, Remote: c.remote, Lane: c.lane, ConnectedAt: c.connectedAt.UTC(), InFlight: c.inflight.Load(), Requests: map[string]uint64{}}
	if id := c.identity.Load(); id != nil {
		ci.ClientID, ci.SoftwareName, ci.SoftwareVersion = id.ClientID, id.SoftwareName, id.SoftwareVersion
	}
	if u := c.cluster.Load(); u != nil {
		ci.Cluster = u.Name
	}
	ci.Principal = c.principalName()
	if ci.InFlight == 0 {
		ci.IdleSeconds = max(now.Sub(time.Unix(0, c.lastActive.Load())).Seconds(), 0)
	}
	if c.stats != nil {
		c.stats.Fill(&ci)
	}
	return ci
}

// retire records a connection that has closed, every goroutine of it done:
// its counters into the per-client metrics, its last state into the
// closed ring.
func (s *Server) retire(c *clientConn) {
	if c.stats != nil {
		s.clientMetrics.Retire(c.stats)
	}
	now := time.Now()
	ci := c.info(now)
	at := c.closedAt.UTC()
	ci.ClosedAt, ci.CloseReason, ci.InFlight = &at, c.closeReason, 0
	if c.closeErr != nil {
		ci.CloseError = c.closeErr.Error()
	}
	s.closedConns.Add(ci)
}
