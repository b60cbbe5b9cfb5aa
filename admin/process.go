package admin

import (
	"os"
	"syscall"
)

// Process is this process's use of file descriptors, in /status: every
// client connection, upstream connection and listener takes one, and a
// process at its limit cannot accept connections (see
// ferry_accept_errors_total).
type Process struct {
	// FDLimit is the soft RLIMIT_NOFILE: how many descriptors the process
	// may hold open (ferry raises it to the hard limit at start).
	FDLimit uint64 `json:"fd_limit"`
	// FDLimitHard is the hard RLIMIT_NOFILE, the most an unprivileged
	// process can raise FDLimit to.
	FDLimitHard uint64 `json:"fd_limit_hard"`
	// FDsOpen is how many it holds now; absent where /proc/self/fd cannot
	// be read (not Linux, or no descriptor left to read it with).
	FDsOpen *int `json:"fds_open,omitempty"`
}

// processStatus reads the descriptor limit and, from /proc/self/fd, the
// number open. Cheap enough for /status: one directory read.
func processStatus() Process {
	var p Process
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		p.FDLimit, p.FDLimitHard = lim.Cur, lim.Max
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		n := len(fds) - 1 // the descriptor ReadDir itself held open
		p.FDsOpen = &n
	}
	return p
}
