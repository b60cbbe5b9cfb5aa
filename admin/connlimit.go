package admin

import (
	"net"
	"sync"

	"go.uber.org/zap"
)

// DefaultMaxConnections bounds the admin API's open connections: enough
// for probes, scrapers and operators, few enough that the admin port can
// never take the descriptors the Kafka listeners need.
// DefaultMaxConnectionsPerIP bounds those of one source address, so that
// one client cannot take them all from the probes and scrapers.
const (
	DefaultMaxConnections      = 64
	DefaultMaxConnectionsPerIP = 16
)

// Reasons of ferry_admin_connections_refused_total.
const (
	refusedMax   = "max_connections"
	refusedPerIP = "max_connections_per_ip"
)

// WithMaxConnections bounds the admin API's open connections, in all and
// from one source address (default DefaultMaxConnections and
// DefaultMaxConnectionsPerIP); a connection over either is closed as soon
// as it is accepted, and counted in ferry_admin_connections_refused_total.
func WithMaxConnections(total, perIP int) Option {
	return func(c *config) { c.maxConns, c.maxConnsPerIP = total, perIP }
}

// limitListener closes at once a connection accepted while max are open,
// or maxPerIP from its address. Closing (rather than leaving it in the
// kernel's backlog, as netutil.LimitListener does) frees the descriptor at
// once, tells the client, and lets it be counted.
type limitListener struct {
	net.Listener
	max, maxPerIP int
	refused       func(reason, remote string)

	mu   sync.Mutex
	open int
	byIP map[string]int
}

func newLimitListener(ln net.Listener, maxConns, maxPerIP int, refused func(reason, remote string)) *limitListener {
	return &limitListener{Listener: ln, max: maxConns, maxPerIP: maxPerIP, refused: refused, byIP: map[string]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		remote := c.RemoteAddr().String()
		ip := sourceOf(remote)
		reason := ""
		l.mu.Lock()
		switch {
		case l.open >= l.max:
			reason = refusedMax
		case l.byIP[ip] >= l.maxPerIP:
			reason = refusedPerIP
		default:
			l.open++
			l.byIP[ip]++
		}
		l.mu.Unlock()
		if reason == "" {
			return &limitedConn{Conn: c, l: l, ip: ip}, nil
		}
		l.refused(reason, remote) // counted before the client can see the close
		c.Close()
	}
}

// release gives a closed connection's place back.
func (l *limitListener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

// limitedConn gives its place back once, at its first Close.
type limitedConn struct {
	net.Conn
	l    *limitListener
	ip   string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip) })
	return err
}

// refuseConn counts and logs (sampled) a connection closed over a bound.
func (s *Server) refuseConn(reason, remote string) {
	s.connsRefused.WithLabelValues(reason).Inc()
	if n, ok := s.refusalLogs.Allow("conn:" + reason); ok {
		s.cfg.log.Warn("admin API connection closed: too many open", zap.String("reason", reason),
			zap.Int("max", s.cfg.maxConns), zap.Int("max_per_ip", s.cfg.maxConnsPerIP),
			zap.String("remote", remote), zap.Int("not_logged_since_last", n))
	}
}
