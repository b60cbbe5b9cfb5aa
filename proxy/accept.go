package proxy

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Accept errors that pass. Running out of file descriptors (EMFILE, ENFILE)
// or kernel memory must not end the listener: every open connection keeps
// being served, and new ones are accepted again as soon as some close. The
// pending connection waits in the listen backlog meanwhile.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	// acceptLogInterval: a process out of descriptors fails every accept,
	// on every lane; one line per interval says so without flooding the log.
	acceptLogInterval = 10 * time.Second
)

// acceptErrReasons are the errors of accept(2) worth retrying, as the
// reason label of ferry_accept_errors_total. Linux reports some network
// errors of the pending connection through accept (see accept(2), "Error
// handling"); they concern that connection only.
var acceptErrReasons = map[syscall.Errno]string{
	syscall.EMFILE:       "emfile",
	syscall.ENFILE:       "enfile",
	syscall.ECONNABORTED: "econnaborted",
	syscall.ENOBUFS:      "enobufs",
	syscall.ENOMEM:       "enomem",
	syscall.EINTR:        "temporary",
	syscall.EAGAIN:       "temporary",
	syscall.EPROTO:       "network",
	syscall.EPERM:        "network", // a firewall rule refused it
	syscall.ENETDOWN:     "network",
	syscall.ENOPROTOOPT:  "network",
	syscall.EHOSTDOWN:    "network",
	syscall.ENONET:       "network",
	syscall.EHOSTUNREACH: "network",
	syscall.EOPNOTSUPP:   "network",
	syscall.ENETUNREACH:  "network",
	syscall.ECONNRESET:   "network",
}

// acceptReasons lists every reason label, so each series exists from the
// start at 0.
func acceptReasons() []string {
	return []string{"emfile", "enfile", "econnaborted", "enobufs", "enomem", "temporary", "network", "timeout"}
}

// acceptErrReason classifies an error of Accept: the reason label when
// accepting should be retried, "" when the listener is done (closed, or an
// error that retrying cannot fix).
func acceptErrReason(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if r, ok := acceptErrReasons[errno]; ok {
			return r
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return ""
}

// acceptLog logs accept errors at most once per acceptLogInterval for the
// whole server, with the count of those not logged.
type acceptLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *acceptLog) failed(log *zap.Logger, ln net.Listener, reason string, err error, retryIn time.Duration) {
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < acceptLogInterval {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	fields := []zap.Field{zap.String("listen", ln.Addr().String()), zap.String("reason", reason), zap.Error(err),
		zap.Duration("retry_in", retryIn), zap.Int("not_logged_since_last", n)}
	if reason == "emfile" || reason == "enfile" {
		fields = append(fields, zap.String("hint", "out of file descriptors: each client and upstream connection takes one; raise the limit (ulimit -n, LimitNOFILE=)"))
	}
	log.Warn("accepting a client connection failed; retrying", fields...)
}

// acceptFailed counts and logs an accept error that passes, then waits
// out the backoff. It reports false when the server closed meanwhile.
func (s *Server) acceptFailed(ln net.Listener, reason string, err error, backoff *time.Duration) bool {
	*backoff = min(max(2**backoff, acceptBackoffMin), acceptBackoffMax)
	s.connMetrics.acceptErrors(reason).Inc()
	s.acceptLog.failed(s.log, ln, reason, err, *backoff)
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
