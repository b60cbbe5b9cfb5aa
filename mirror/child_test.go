package mirror

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// childEnv makes the test binary run a Mirror instead of the tests, so that
// a test can SIGKILL a mirror mid-stream (see TestMirrorKillRestart).
const childEnv = "FERRY_MIRROR_CHILD"

// runChild runs a Mirror from the environment: FERRY_MIRROR_SOURCE,
// FERRY_MIRROR_TARGET and FERRY_MIRROR_TOPICS (comma-separated patterns).
// FERRY_MIRROR_CRASH="commit:N" or "abort:N" makes the process SIGKILL
// itself just before its Nth EndTxn of that kind, with the transaction's
// batches on the standby.
func runChild() {
	log, _ := zap.NewDevelopment()
	if c := os.Getenv("FERRY_MIRROR_CRASH"); c != "" {
		var kind string
		var n int64
		if _, err := fmt.Sscanf(strings.Replace(c, ":", " ", 1), "%s %d", &kind, &n); err != nil {
			log.Fatal("FERRY_MIRROR_CRASH", zap.Error(err))
		}
		var seen atomic.Int64
		testHookEndTxn = func(commit bool) {
			if commit == (kind == "commit") && seen.Add(1) == n {
				log.Warn("crashing before EndTxn", zap.String("kind", kind), zap.Int64("n", n))
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}
	m, err := New(
		Source(os.Getenv("FERRY_MIRROR_SOURCE")),
		Target(os.Getenv("FERRY_MIRROR_TARGET")),
		Topics(strings.Split(os.Getenv("FERRY_MIRROR_TOPICS"), ","), nil),
		SyncInterval(500*time.Millisecond),
		FetchMaxWait(100*time.Millisecond),
		SyncGroups(false),
		Logger(log),
	)
	if err != nil {
		log.Fatal("mirror child", zap.Error(err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	_ = m.Run(ctx)
	m.Close()
	os.Exit(0)
}
