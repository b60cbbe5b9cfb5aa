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
	timeout := c.s.auth.Config().PreAuth.Timeout
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
	c.mem.Authenticated()
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
	return int64(s.auth.Config().PreAuth.MaxReceiveSize)
}
