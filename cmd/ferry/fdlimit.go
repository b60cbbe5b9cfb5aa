package main

import (
	"fmt"
	"syscall"

	"go.uber.org/zap"
)

// lowFDLimit is the soft limit below which Ferry warns at start: every
// client connection takes a descriptor, and so does each upstream
// connection it checks out.
const lowFDLimit = 4096

// raiseFDLimit raises the soft RLIMIT_NOFILE to the hard limit, logs the
// result and returns the soft limit in force (0: unknown). The Go runtime does the same on Linux before main, but not
// everywhere and not visibly; doing it here makes it certain and says in
// the log what the process has to work with (/status reports it too).
func raiseFDLimit(log *zap.Logger) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the file descriptor limit", zap.Error(err))
		return 0
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
		return lim.Cur
	}
	log.Info("file descriptor limit", fields...)
	return lim.Cur
}

// checkAdminConnections refuses an admin_max_connections above a quarter of
// the descriptor limit fds: the admin port must never be able to take the
// descriptors the Kafka listeners need.
func checkAdminConnections(maxConns int, fds uint64) error {
	if fds == 0 || uint64(maxConns) <= fds/4 {
		return nil
	}
	return fmt.Errorf("admin_max_connections %d is more than a quarter of the file descriptor limit (%d): admin API connections could take the descriptors the Kafka listeners need; lower admin_max_connections or raise the limit (ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=)", maxConns, fds)
}

// fdLimit is the process's soft RLIMIT_NOFILE (0: unknown).
func fdLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return lim.Cur
}
