package membership

import (
	"bytes"
	"log"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapWriter takes memberlist's log lines ("[WARN] memberlist: ...") and
// logs them on zap at the level of their prefix. memberlist's DEBUG (every
// stream and push/pull) stays at Debug.
type zapWriter struct{ log *zap.Logger }

func newMemberlistLogger(l *zap.Logger) *log.Logger {
	return log.New(zapWriter{l}, "", 0)
}

var levelPrefixes = []struct {
	prefix []byte
	level  zapcore.Level
}{
	{[]byte("[DEBUG]"), zapcore.DebugLevel},
	{[]byte("[INFO]"), zapcore.InfoLevel},
	{[]byte("[WARN]"), zapcore.WarnLevel},
	{[]byte("[ERR]"), zapcore.ErrorLevel},
	{[]byte("[ERROR]"), zapcore.ErrorLevel},
}

func (w zapWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := zapcore.InfoLevel
	for _, lp := range levelPrefixes {
		if bytes.HasPrefix(line, lp.prefix) {
			level, line = lp.level, bytes.TrimSpace(line[len(lp.prefix):])
			break
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	if ce := w.log.Check(level, string(line)); ce != nil {
		ce.Write()
	}
	return len(p), nil
}
