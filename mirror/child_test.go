package mirror

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// childEnv makes the test binary run a Mirror instead of the tests, so that
// a test can SIGKILL a mirror mid-stream (see TestMirrorKillRestart).
const childEnv = "FERRY_MIRROR_CHILD"

// runChild runs a Mirror from the environment: FERRY_MIRROR_SOURCE,
// FERRY_MIRROR_TARGET and FERRY_MIRROR_TOPICS (comma-separated patterns).
func runChild() {
	log, _ := zap.NewDevelopment()
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
