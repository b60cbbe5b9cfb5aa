// Package logsample bounds repeated log lines: at most one per key per
// interval, the next one saying how many were suppressed.
package logsample

import (
	"sync"
	"time"
)

// Sampler bounds the log lines written about refusals: at most one line
// per key (a refusal reason) per interval, the next one saying how many
// were suppressed before it. A client, or a scanner, that opens thousands
// of bad connections must not turn into megabytes of logs; the metrics
// count every one. The admin API samples its refused tokens and
// connections with it too.
type Sampler struct {
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	byKey map[string]*sampleState
}

type sampleState struct {
	next       time.Time // no line before this
	suppressed int       // lines skipped since the last one written
}

// New returns a sampler writing at most one line per key per
// interval every.
func New(every time.Duration) *Sampler {
	return &Sampler{every: every, now: time.Now, byKey: make(map[string]*sampleState)}
}

// Allow reports whether a line about key may be written now and, when it
// may, how many lines about key were suppressed since the last one.
func (l *Sampler) Allow(key string) (suppressed int, ok bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.byKey[key]
	if st == nil {
		st = &sampleState{}
		l.byKey[key] = st
	}
	if now.Before(st.next) {
		st.suppressed++
		return 0, false
	}
	suppressed, st.suppressed = st.suppressed, 0
	st.next = now.Add(l.every)
	return suppressed, true
}
