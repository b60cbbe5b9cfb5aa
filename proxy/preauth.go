package proxy

// Bounds on a connection that has not authenticated yet, on a listener
// with SASL. Such a client is anybody who can reach the port, so it must
// not spend what authenticated clients need:
//
//   - A frame larger than MaxReceiveSize (Kafka's
//     sasl.server.max.receive.size, 512 KiB) is refused from its size
//     alone, before its body is read: the connection closes
//     (unauthenticated_frame_too_large).
//   - The frames it is allowed are charged to its own connection only,
//     never to the process's buffer budget (ferry_buffered_bytes): it is
//     read while it holds less than MaxReceiveSize, so it holds under
//     that plus one frame's buffer (a pooled one is at most 1 MiB), and
//     waits for its answers to be taken before more.
//   - It must authenticate within Timeout of being accepted, or it is
//     closed (authentication_timeout), whatever it is doing.
//   - At most MaxPerIP connections from one source address may be
//     unauthenticated at once; one more is closed as soon as it is
//     accepted (ferry_client_connections_refused_total reason
//     max_unauthenticated_per_ip). A connection stops counting as soon
//     as it authenticates.

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// PreAuthLimits bound a client connection until it has authenticated
// (ClientSASL.PreAuth). Zero values take the defaults.
type PreAuthLimits struct {
	// MaxReceiveSize is the largest frame read before authentication.
	MaxReceiveSize int
	// Timeout closes a connection not authenticated this long after it
	// was accepted.
	Timeout time.Duration
	// MaxPerIP bounds the connections from one source address that have
	// not authenticated yet.
	MaxPerIP int
}

// Defaults of PreAuthLimits.
const (
	// Kafka's sasl.server.max.receive.size: room for any SASL message,
	// an OAUTHBEARER token with many claims included.
	DefaultSASLMaxReceiveSize = 512 << 10
	// A SASL exchange is a few round trips of milliseconds; a client that
	// fetches its OAUTHBEARER token while it authenticates (franz-go
	// does) may wait seconds for its identity provider. 30 s is the
	// request.timeout.ms of Kafka's Java clients: one still not
	// authenticated by then has given up on the attempt.
	DefaultAuthenticationTimeout = 30 * time.Second
	// Connections authenticating at the same moment from one address:
	// a NAT in front of many clients starting together stays far below
	// it, each holding its unauthenticated connections for milliseconds.
	DefaultMaxUnauthenticatedPerIP = 64
	// minSASLMaxReceiveSize leaves room for a SCRAM message with a long
	// user name.
	minSASLMaxReceiveSize = 1 << 10
)

// Validate checks the limits; the errors name the keys of Ferry's
// configuration file.
func (l *PreAuthLimits) Validate() error {
	switch {
	case l.MaxReceiveSize != 0 && l.MaxReceiveSize < minSASLMaxReceiveSize:
		return fmt.Errorf("sasl.max_receive_size %d: must be at least %d bytes (0: the default, %d)", l.MaxReceiveSize, minSASLMaxReceiveSize, DefaultSASLMaxReceiveSize)
	case l.Timeout < 0:
		return fmt.Errorf("sasl.authentication_timeout %s: must be positive (0: the default, %s)", l.Timeout, DefaultAuthenticationTimeout)
	case l.MaxPerIP < 0:
		return fmt.Errorf("sasl.max_unauthenticated_per_ip %d: must be positive (0: the default, %d)", l.MaxPerIP, DefaultMaxUnauthenticatedPerIP)
	}
	return nil
}

// withDefaults fills in the zero values.
func (l PreAuthLimits) withDefaults() PreAuthLimits {
	if l.MaxReceiveSize == 0 {
		l.MaxReceiveSize = DefaultSASLMaxReceiveSize
	}
	if l.Timeout == 0 {
		l.Timeout = DefaultAuthenticationTimeout
	}
	if l.MaxPerIP == 0 {
		l.MaxPerIP = DefaultMaxUnauthenticatedPerIP
	}
	return l
}

// The reason a connection is refused for the unauthenticated connections
// of its address (ferry_client_connections_refused_total).
const refuseUnauthPerIP = "max_unauthenticated_per_ip"

// Errors that close an unauthenticated connection; closeReason (idle.go)
// names them.
var (
	errUnauthFrameTooLarge = errors.New("frame before authentication larger than sasl.max_receive_size")
	errAuthTimeout         = errors.New("not authenticated within sasl.authentication_timeout")
)

// startUnauthenticated starts the authentication deadline of a connection
// counted as unauthenticated (admitConn): whatever it is doing when the
// deadline passes, it is closed.
func (c *clientConn) startUnauthenticated() {
	if !c.unauth.Load() {
		return
	}
	timeout := c.s.auth.cfg.PreAuth.Timeout
	c.authTimer = time.AfterFunc(timeout, func() {
		if !c.unauth.Load() { // authenticated meanwhile
			return
		}
		c.logRefusal(zapcore.InfoLevel, "authentication_timeout", "client not authenticated in time; closing the connection", zap.Duration("authentication_timeout", timeout))
		c.close(fmt.Errorf("%w (%s)", errAuthTimeout, timeout))
	})
}

// authenticatedNow is called by the reader as the connection
// authenticates (authSucceeded): it no longer counts against the
// unauthenticated bounds, and its frames are charged to the process's
// budget from now on.
func (c *clientConn) authenticatedNow() {
	if c.authTimer != nil {
		c.authTimer.Stop()
	}
	c.mem.authenticated()
	c.s.mu.Lock()
	c.s.leaveUnauthLocked(c)
	c.s.mu.Unlock()
}

// leaveUnauthLocked gives back the count admitConn took for c as an
// unauthenticated connection, once; s.mu is held.
func (s *Server) leaveUnauthLocked(c *clientConn) {
	if !c.unauth.CompareAndSwap(true, false) {
		return
	}
	if s.unauthByIP[c.ip]--; s.unauthByIP[c.ip] <= 0 {
		delete(s.unauthByIP, c.ip)
	}
	s.connMetrics.unauth.Dec()
}

// refuseUnauthFrame counts and logs a frame refused before authentication
// for its size, and returns the error that closes the connection.
func (c *clientConn) refuseUnauthFrame(err error) error {
	err = c.s.refuse(-1, reasonUnauthenticated, err)
	c.logRefusal(zapcore.InfoLevel, "unauthenticated_frame_too_large", "closing connection: frame too large before authentication", zap.Error(err))
	return err
}

// preauthBound is what a new connection may hold before it authenticates
// (0: it needs no authentication).
func (s *Server) preauthBound() int64 {
	if s.auth == nil {
		return 0
	}
	return int64(s.auth.cfg.PreAuth.MaxReceiveSize)
}
