package proxy

import (
	"errors"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"
)

// Settings are what a running Server can change (SetSettings, on a
// configuration reload): the client connection limits and timeouts. A
// change applies to what comes next: a new connection is counted against
// the new limits (connections already open above them stay open, as with
// Kafka's dynamic max.connections), a connection's next wait uses the new
// timeouts (one idle already waiting keeps its deadline, then takes the
// new timeout).
type Settings struct {
	// ConnectionsMaxIdle closes a client connection idle this long
	// (Kafka's connections.max.idle.ms).
	ConnectionsMaxIdle time.Duration
	// RequestReadTimeout closes a connection whose request started
	// arriving and is not complete this much later.
	RequestReadTimeout time.Duration
	// WriteTimeout closes a connection whose client has not taken an
	// answer this long after Ferry began writing it: a client that stops
	// reading must not hold its answers, and their buffers, for ever.
	WriteTimeout time.Duration
	// MaxConnections bounds the client connections open on the member,
	// every lane together (Kafka's max.connections); 0: no limit.
	MaxConnections int
	// MaxConnectionsPerIP bounds the connections from one source address
	// (Kafka's max.connections.per.ip); 0: no limit.
	MaxConnectionsPerIP int
	// PerIPOverrides gives some addresses a limit of their own, as
	// Kafka's max.connections.per.ip.overrides does (0: no limit).
	PerIPOverrides map[string]int
	// LameDuck is the period over which Shutdown spreads the closing of
	// idle connections (0: all at once).
	LameDuck time.Duration
}

func (st *Settings) validate() error {
	switch {
	case st.ConnectionsMaxIdle <= 0:
		return fmt.Errorf("%w: connections max idle %s must be positive", ErrConfig, st.ConnectionsMaxIdle)
	case st.RequestReadTimeout <= 0:
		return fmt.Errorf("%w: request read timeout %s must be positive", ErrConfig, st.RequestReadTimeout)
	case st.WriteTimeout <= 0:
		return fmt.Errorf("%w: write timeout %s must be positive", ErrConfig, st.WriteTimeout)
	case st.LameDuck < 0:
		return fmt.Errorf("%w: lame-duck period %s is negative", ErrConfig, st.LameDuck)
	case st.MaxConnections < 0 || st.MaxConnectionsPerIP < 0:
		return fmt.Errorf("%w: connection limits must not be negative (0: no limit)", ErrConfig)
	}
	norm := make(map[string]int, len(st.PerIPOverrides))
	for addr, n := range st.PerIPOverrides {
		ip := net.ParseIP(addr)
		if ip == nil {
			return fmt.Errorf("%w: connection limit override for %q: not an IP address", ErrConfig, addr)
		}
		if n < 0 {
			return fmt.Errorf("%w: connection limit override for %s is negative", ErrConfig, addr)
		}
		norm[ip.String()] = n
	}
	st.PerIPOverrides = norm
	return nil
}

// perIPLimit is the limit for connections from ip (0: none).
func (st *Settings) perIPLimit(ip string) int {
	if n, ok := st.PerIPOverrides[ip]; ok {
		return n
	}
	return st.MaxConnectionsPerIP
}

// Settings returns the settings in force.
func (s *Server) Settings() Settings { return *s.settings.Load() }

// SetSettings changes the limits and timeouts of a running Server. An
// invalid Settings changes nothing.
func (s *Server) SetSettings(st Settings) error {
	if err := st.validate(); err != nil {
		return err
	}
	// Not woken: a reader waiting on an idle connection keeps the deadline
	// it set from the old idle timeout, and takes the new one when that
	// passes (waking it could fail a frame it is part-way through).
	s.settings.Store(&st)
	return nil
}

// Reasons a new client connection is refused, as the reason label of
// ferry_client_connections_refused_total.
const (
	refuseMaxConnections = "max_connections"
	refusePerIP          = "max_connections_per_ip"
)

var errConnLimit = errors.New("connection limit reached")

// admitConn counts a new connection from ip against the limits, s.mu held.
// Refused, it returns the reason.
func (s *Server) admitConn(ip string) string {
	st := s.settings.Load()
	if st.MaxConnections > 0 && len(s.conns) >= st.MaxConnections {
		return refuseMaxConnections
	}
	if n := st.perIPLimit(ip); n > 0 && s.connsByIP[ip] >= n {
		return refusePerIP
	}
	if s.auth != nil {
		// Every connection starts unauthenticated (preauth.go).
		if s.unauthByIP[ip] >= s.auth.Config().PreAuth.MaxPerIP {
			return refuseUnauthPerIP
		}
		s.unauthByIP[ip]++
		s.connMetrics.unauth.Inc()
	}
	s.connsByIP[ip]++
	return ""
}

// releaseConn gives back what admitConn counted, s.mu held.
func (s *Server) releaseConn(ip string) {
	if s.connsByIP[ip]--; s.connsByIP[ip] <= 0 {
		delete(s.connsByIP, ip)
	}
}

// refuseConn closes a connection over a limit at once, as a broker over
// max.connections.per.ip does: the client backs off and tries again,
// perhaps another member.
func (s *Server) refuseConn(nc net.Conn, ip, reason string) {
	// Counted before the close, so that a client that sees its
	// connection closed finds it counted.
	s.connMetrics.refused[reason].Inc()
	nc.Close()
	if suppressed, ok := s.refusalLogs.Allow(reason); ok {
		st := s.settings.Load()
		fields := []zap.Field{zap.String("reason", reason), zap.String("client_ip", ip),
			zap.Int("max_connections", st.MaxConnections), zap.Int("max_connections_per_ip", st.perIPLimit(ip)),
			zap.Int("not_logged_since_last", suppressed)}
		if reason == refuseUnauthPerIP {
			fields = append(fields, zap.Int("max_unauthenticated_per_ip", s.auth.Config().PreAuth.MaxPerIP))
		}
		s.log.Warn("refused a client connection: "+errConnLimit.Error(), fields...)
	}
}

// remoteIP is the source address of nc, "" when it has none (a pipe).
func remoteIP(nc net.Conn) string {
	if ta, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return ""
}
