package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/ferry-gw/ferry/protocol"
)

// Client connection timeouts.
//
// A connection is idle while Ferry waits for the first byte of a request
// and has nothing in flight for it: an answer parked upstream (a long-poll
// Fetch, a JoinGroup waiting out a rebalance) or not yet written keeps it
// busy, whatever the time. An idle connection is closed after
// connectionsMaxIdle, like Kafka's connections.max.idle.ms.
//
// Once the first byte of a request has arrived, the rest must arrive
// within requestReadTimeout, so a client that stops mid-frame does not
// hold the connection and its buffer for ever.
const (
	// Kafka's connections.max.idle.ms default (10 minutes): clients set
	// their own connections.max.idle.ms below the broker's (Java's default
	// is 9 minutes), so they close first and never see Ferry do it.
	defaultConnectionsMaxIdle = 10 * time.Minute
	// The default request.timeout.ms of Kafka's Java producer, consumer
	// and admin client: a client still sending a frame after 30 s has
	// given up on that request and will reconnect and retry, so nothing
	// it waits for is lost by closing.
	defaultRequestReadTimeout = 30 * time.Second
	// Twice a client's request timeout: a client that has not taken an
	// answer in that long has given up on it.
	defaultWriteTimeout = 60 * time.Second
	// Shutdown closes idle connections at least this often (100 a
	// second): fewer reconnecting clients than that are no herd to
	// spread.
	defaultLameDuckMaxGap = 10 * time.Millisecond
)

var (
	errIdle               = errors.New("idle longer than connections.max.idle")
	errRequestReadTimeout = errors.New("request started but not complete within the request read timeout")
)

// awaitRequest waits for the first byte of the next request on br. It
// returns errIdle once the connection has been idle (no request being read,
// nothing in flight) for connectionsMaxIdle; when a byte arrives it sets
// the deadline for the rest of the frame.
//
// No timer runs per connection: the read deadline is the earliest moment
// the connection could be idle for long enough, and when it passes the
// condition is checked again and the deadline moved if the connection was
// busy meanwhile.
func (c *clientConn) awaitRequest(br *bufio.Reader) error {
	c.lastActive.Store(time.Now().UnixNano())
	st := c.s.settings.Load()
	maxIdle := st.ConnectionsMaxIdle
	for br.Buffered() == 0 {
		if c.s.draining.Load() {
			return c.awaitDrain(br)
		}
		deadline := time.Unix(0, c.lastActive.Load()).Add(maxIdle)
		if c.inflight.Load() > 0 {
			deadline = time.Now().Add(maxIdle)
		}
		c.nc.SetReadDeadline(deadline)
		if _, err := br.Peek(1); err == nil {
			break
		} else if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		// inflight is read before lastActive: the writer moves lastActive
		// before it lowers inflight, so a reply just written counts.
		if c.inflight.Load() == 0 && time.Since(time.Unix(0, c.lastActive.Load())) >= maxIdle {
			return fmt.Errorf("%w (%s)", errIdle, maxIdle)
		}
	}
	if c.s.draining.Load() {
		return errDraining
	}
	c.nc.SetReadDeadline(time.Now().Add(st.RequestReadTimeout))
	return nil
}

// awaitDrain is awaitRequest during Shutdown: no new request is read, and
// the reader's return lets the writer answer what was read, then close.
// It returns at the connection's turn in the lame-duck period (drainAt),
// or as soon as the client sends a request: the client reconnects to
// another member then anyway, and turns spread over the period keep the
// idle clients from all reconnecting at once.
func (c *clientConn) awaitDrain(br *bufio.Reader) error {
	for {
		at := time.Unix(0, c.drainAt.Load())
		if br.Buffered() > 0 || !time.Now().Before(at) {
			return errDraining
		}
		c.nc.SetReadDeadline(at)
		if _, err := br.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
	}
}

// replied records that one reply has been written to the client.
func (c *clientConn) replied() {
	c.lastActive.Store(time.Now().UnixNano())
	c.inflight.Add(-1)
}

// readErr names a request that did not arrive in time.
func (c *clientConn) readErr(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w (%s): %w", errRequestReadTimeout, c.s.settings.Load().RequestReadTimeout, err)
	}
	return err
}

// closeReasons lists the reason labels of ferry_client_connections_closed_total.
func closeReasons() []string {
	return []string{"client_closed", "idle", "request_read_timeout", "write_timeout", "bad_frame", "refused", "shutdown", "other",
		"tls_handshake", "auth_failed", "auth_rate_limited", "unauthenticated_request",
		"unauthenticated_frame_too_large", "authentication_timeout"}
}

// closeReason classifies why a client connection closed.
func closeReason(err error) string {
	switch {
	case errors.Is(err, errIdle):
		return "idle"
	case errors.Is(err, errRequestReadTimeout):
		return "request_read_timeout"
	case errors.Is(err, ErrServerClosed), errors.Is(err, context.Canceled):
		return "shutdown"
	case errors.Is(err, errTLSHandshake):
		return "tls_handshake"
	case errors.Is(err, errAuthRateLimited):
		return "auth_rate_limited"
	case errors.Is(err, errAuthFailed):
		return "auth_failed"
	case errors.Is(err, errUnauthenticatedRequest):
		return "unauthenticated_request"
	case errors.Is(err, errUnauthFrameTooLarge):
		return "unauthenticated_frame_too_large"
	case errors.Is(err, errAuthTimeout):
		return "authentication_timeout"
	case errors.Is(err, protocol.ErrFrameTooLarge), errors.Is(err, protocol.ErrMalformedFrame), errors.Is(err, protocol.ErrMalformedHeader):
		return "bad_frame"
	case refusalReason(err) != "":
		// A request Ferry does not serve; ferry_refusals_total says why.
		return "refused"
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Only writes have other deadlines: the client stopped reading.
		return "write_timeout"
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "client_closed"
	}
	return "other"
}
