package proxy

// Client authentication: SASL on the Kafka listeners (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512, OAUTHBEARER), as a Kafka broker's SASL listener does it
// (KIP-43, KIP-152). A connection starts unauthenticated; until a
// SaslHandshake (v1) and the SaslAuthenticate rounds of its mechanism
// succeed, only ApiVersions, SaslHandshake and SaslAuthenticate are
// answered. Any other request closes the connection (close reason
// unauthenticated_request), as Kafka's SaslServerAuthenticator does: the
// request reaches no cluster. A failed authentication is answered
// SASL_AUTHENTICATION_FAILED with a message saying why, after
// failedAuthDelay (Kafka's connection.failed.authentication.delay.ms),
// then the connection closes (auth_failed). Wrong password and unknown
// user get the same message, and the connection's record (its close
// error) the same reason, invalid_credentials, so neither tells which users
// exist; the log line has the same reason with the name claimed, and only
// ferry_client_auth_failures_total{mechanism,reason}, which names no user,
// tells them apart. SCRAM answers an unknown user as it would a real one
// (fakeCredential).
//
// Authentication attempts are limited by token buckets taken when an
// exchange starts and given back when it succeeds (package clientauth):
// per (user, source address), FailedBurst, then one per
// FailedInterval/FailedBurst; and per source address, FailedAddressBurst.
// A user out of tokens at an address is refused there, correct password or
// not, until the bucket refills; the same user at other addresses, and
// other users at the same address, are unaffected.
//
// The principal is "User:<name>" (Kafka's form): the SCRAM or PLAIN user,
// or the token's principal claim. It is shown in GET /connections and in
// the connection's log lines.

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Errors that close a connection during authentication; closeReason
// (idle.go) names them.
var (
	errUnauthenticatedRequest = errors.New("request before SASL authentication")
	errAuthFailed             = errors.New("SASL authentication failed")
	errAuthRateLimited        = errors.New("too many failed authentications from this address")
)

// reasonUnauthenticated is the refusal reason of a request before
// authentication.
const reasonUnauthenticated = "unauthenticated"

// connAuth is a connection's SASL state, the reader goroutine's own.
type connAuth struct {
	mechanism string // chosen by the handshake
	scram     *clientauth.SCRAMServer
	admission *clientauth.Admission // the exchange's tokens
	done      bool
	// closeAfter, set with an answer, closes the connection once it is
	// written.
	closeAfter error
}

// authenticated reports whether c may send requests beyond the SASL ones.
func (s *Server) authenticated(c *clientConn) bool { return s.auth == nil || c.auth.done }

// gateUnauthenticated refuses every request but ApiVersions, SaslHandshake
// and SaslAuthenticate before authentication.
func (s *Server) gateUnauthenticated(c *clientConn, req *request) error {
	switch req.hdr.Key {
	case int16(kmsg.ApiVersions), int16(kmsg.SASLHandshake), int16(kmsg.SASLAuthenticate):
		return nil
	}
	s.authMetrics.Failed(c.auth.mechanism, "unauthenticated_request")
	return s.refuse(req.hdr.Key, reasonUnauthenticated, fmt.Errorf("%w: %s (key %d): the listener requires SASL authentication first; configure the client with security.protocol SASL_SSL or SASL_PLAINTEXT and a mechanism (%s)",
		errUnauthenticatedRequest, kmsg.NameForKey(req.hdr.Key), req.hdr.Key, strings.Join(s.auth.Config().Mechanisms, ", ")))
}

// setPrincipal records who the connection authenticated as.
func (c *clientConn) setPrincipal(p string) {
	c.principal.Store(&p)
	c.ident = c.s.identity(p)
}

// principalName is the connection's principal, "" before authentication.
func (c *clientConn) principalName() string {
	if p := c.principal.Load(); p != nil {
		return *p
	}
	return ""
}

// logger is the connection's logger with its principal, once known.
func (c *clientConn) logger() *zap.Logger {
	if p := c.principalName(); p != "" {
		return c.log.With(zap.String("principal", p))
	}
	return c.log
}

// authFailed counts and logs a failed authentication and marks the
// connection to close once the answer is written.
func (s *Server) authFailed(c *clientConn, mech string, f *clientauth.Failure) {
	s.authMetrics.Failed(mech, f.Reason)
	if f.Reason == "unmapped_principal" || f.Reason == "keys_unavailable" {
		// The credentials were right, or not checked: no guess to count.
		s.auth.Release(c.auth.admission)
	}
	fields := []zap.Field{zap.String("mechanism", mech), zap.String("auth_reason", recordedReason(f.Reason)), zap.String("error", f.Msg)}
	if f.User != "" {
		fields = append(fields, zap.String("user", f.User))
	}
	c.logRefusal(zapcore.InfoLevel, "auth_failed", "client authentication failed; closing the connection", fields...)
	err := errAuthFailed
	if f.Reason == "rate_limited" {
		err = errAuthRateLimited
	}
	c.auth.closeAfter = fmt.Errorf("%w (%s, %s): %s", err, mech, recordedReason(f.Reason), f.Msg)
}

// recordedReason is a failure's reason as the connection's record keeps
// it (its close error, shown by GET /connections): a wrong password and an
// unknown user are both invalid_credentials there and in the log, as they
// are to the client, so neither tells which users exist: the log names
// the user claimed. Only the metric, which names no user, keeps them
// apart.
func recordedReason(reason string) string {
	if reason == "bad_password" || reason == "unknown_user" {
		return "invalid_credentials"
	}
	return reason
}

// authSucceeded records the principal.
func (s *Server) authSucceeded(c *clientConn, mech, principal string) {
	c.auth.done, c.auth.scram = true, nil
	s.auth.Release(c.auth.admission)
	c.authenticatedNow()
	c.setPrincipal(principal)
	s.authMetrics.Succeeded(mech)
	c.logger().Debug("client authenticated", zap.String("mechanism", mech))
}
