package admin

import (
	"net"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// DefaultMaxConnections bounds the admin API's open connections: enough
// for probes, scrapers and operators, few enough that the admin port can
// never take the descriptors the Kafka listeners need.
const DefaultMaxConnections = 64

// WithMaxConnections bounds the admin API's open connections (default
// DefaultMaxConnections); a connection over it is closed as soon as it is
// accepted, and counted in ferry_admin_connections_refused_total.
func WithMaxConnections(n int) Option { return func(c *config) { c.maxConns = n } }

// limitListener closes at once a connection accepted while max are open.
// Closing (rather than leaving it in the kernel's backlog, as
// netutil.LimitListener does) frees the descriptor at once, tells the
// client, and lets it be counted.
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused func(remote string)
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			remote := c.RemoteAddr().String()
			c.Close()
			l.refused(remote)
			continue
		}
		return &limitedConn{Conn: c, l: l}, nil
	}
}

// limitedConn gives its place back once, at its first Close.
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

// refuseConn counts and logs (sampled) a connection closed over the bound.
func (s *Server) refuseConn(remote string) {
	s.connsRefused.Inc()
	if n, ok := s.refusalLogs.Allow("max_connections"); ok {
		s.cfg.log.Warn("admin API connection closed: admin_max_connections are open", zap.Int("max", s.cfg.maxConns),
			zap.String("remote", remote), zap.Int("not_logged_since_last", n))
	}
}
