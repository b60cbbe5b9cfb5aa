// Package listen wraps a listener so that Accept retries the errors that
// pass (out of file descriptors, a pending connection reset) instead of
// ending the server.
package listen

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

// Reasons lists every reason label, so each series exists from the start
// at 0.
func Reasons() []string {
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

// Log logs accept errors at most once per acceptLogInterval for all the
// listeners that share it (a server's), with the count of those not
// logged.
type Log struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *Log) failed(log *zap.Logger, ln net.Listener, what, reason string, err error, retryIn time.Duration) {
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
	log.Warn("accepting "+what+" connection failed; retrying", fields...)
}

// Listener is a listener whose Accept retries the errors that pass
// (acceptErrReasons: out of file descriptors, a pending connection reset)
// with a backoff from 5 ms doubling to 1 s, while the open connections are
// served; each is counted by reason and logged at most once per 10 s. Other
// errors, and Close, end Accept. The Kafka listeners accept through one; so
// does the admin API, whose net/http server would log every retry.
type Listener struct {
	net.Listener
	log   *zap.Logger
	what  string
	count func(reason string)
	alog  *Log
	stop  <-chan struct{} // ends a wait too (the server closing); nil: none
	done  chan struct{}
	once  sync.Once
}

// New wraps ln; what names its connections in the log ("an admin API"),
// count counts an error by reason. Listeners given one shared log are
// logged together (nil: a log of its own); stop, when closed, ends a wait
// between retries (nil: only Close does).
func New(ln net.Listener, log *zap.Logger, what string, count func(reason string), shared *Log, stop <-chan struct{}) *Listener {
	if shared == nil {
		shared = new(Log)
	}
	return &Listener{Listener: ln, log: log, what: what, count: count, alog: shared, stop: stop, done: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		nc, err := l.Listener.Accept()
		if err == nil {
			return nc, nil
		}
		reason := acceptErrReason(err)
		if reason == "" {
			return nil, err
		}
		backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
		l.count(reason)
		l.alog.failed(l.log, l.Listener, l.what, reason, err, backoff)
		t := time.NewTimer(backoff)
		select {
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		case <-l.stop:
			t.Stop()
			return nil, net.ErrClosed
		case <-t.C:
		}
	}
}

// Close implements net.Listener; safe to call more than once.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}
