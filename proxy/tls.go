package proxy

// TLS on the Kafka listeners: the handshake of each client connection, on
// the connection's own goroutine (clientauth.TLSServer holds the
// configuration and its reload).
//
// A TLS connection is never spliced (01_fetch_stream.go): splice(2) moves
// bytes between sockets, and these bytes must be encrypted on the way.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/clientauth"
)

// errTLSHandshake closes a connection whose TLS handshake failed.
var errTLSHandshake = errors.New("TLS handshake failed")

// initClientSecurity loads the listeners' TLS and SASL configuration.
func (s *Server) initClientSecurity() error {
	var err error
	if s.authMetrics, err = clientauth.NewMetrics(s.cfg.reg); err != nil {
		return err
	}
	if t := s.cfg.clientTLS; t != nil {
		if s.tls, err = clientauth.NewTLSServer(*t, s.log); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	if a := s.cfg.clientSASL; a != nil {
		if s.auth, err = clientauth.New(*a, s.tls != nil, s.log); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		s.goTracked(func() { s.auth.Run(s.ctx) })
	}
	return nil
}

// handshake runs a TLS connection's handshake (nothing without TLS) and
// records the principal of a verified client certificate.
func (c *clientConn) handshake() error {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return nil
	}
	p, err := c.s.tls.Handshake(c.ctx, tc)
	if err != nil {
		reason := clientauth.TLSFailureReason(err)
		c.s.authMetrics.Failed("TLS", reason)
		c.logRefusal(zapcore.InfoLevel, "tls_handshake", "client TLS handshake failed; closing the connection", zap.String("tls_reason", reason), zap.Error(err))
		return fmt.Errorf("%w (%s): %w", errTLSHandshake, reason, err)
	}
	tc.SetDeadline(time.Time{})
	if p != "" {
		c.setPrincipal(p)
		c.s.authMetrics.Succeeded("TLS")
	}
	return nil
}
