package benchutil

import (
	"os"
	"runtime/pprof"
)

// StartCPUProfile writes this process's CPU profile to path until the
// returned stop is called (deferred by a benchmark's child process, so
// that the profile covers its whole life).
func StartCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
