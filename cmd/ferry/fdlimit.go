package main

import (
	"syscall"

	"go.uber.org/zap"
)

// lowFDLimit is the soft limit below which Ferry warns at start: every
// client connection takes a descriptor, and so does each upstream
// connection it leases.
const lowFDLimit = 4096

// raiseFDLimit raises the soft RLIMIT_NOFILE to the hard limit and logs
// the result. The Go runtime does the same on Linux before main, but not
// everywhere and not visibly; doing it here makes it certain and says in
// the log what the process has to work with (/status reports it too).
func raiseFDLimit(log *zap.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the file descriptor limit", zap.Error(err))
		return
	}
	if lim.Cur < lim.Max {
		was := lim.Cur
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			lim.Cur = was
			log.Warn("cannot raise the file descriptor limit", zap.Uint64("soft", was), zap.Uint64("hard", lim.Max), zap.Error(err))
		}
	}
	fields := []zap.Field{zap.Uint64("soft", lim.Cur), zap.Uint64("hard", lim.Max)}
	if lim.Cur < lowFDLimit {
		log.Warn("file descriptor limit is low: each client and upstream connection takes one; raise it (ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=)", fields...)
		return
	}
	log.Info("file descriptor limit", fields...)
}
