// Package benchutil holds what the benchmarks share.
package benchutil

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where a benchmark ran.
type Machine struct {
	CPUs      int
	Model     string
	MemGiB    float64
	Kernel    string
	Load      string // 1, 5 and 15 minute load averages at the start
	GoVersion string
}

// ReadMachine reads this machine's CPUs, memory, kernel and load now.
func ReadMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Model: "unknown", Kernel: "unknown", Load: "unknown", GoVersion: runtime.Version()}
	if v := procField("/proc/cpuinfo", "model name"); v != "" {
		m.Model = v
	}
	if v := procField("/proc/meminfo", "MemTotal"); v != "" {
		if kb, err := strconv.ParseFloat(strings.TrimSuffix(v, " kB"), 64); err == nil {
			m.MemGiB = kb / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if fs := strings.Fields(string(b)); len(fs) >= 3 {
			m.Load = strings.Join(fs[:3], " ")
		}
	}
	return m
}

// procField returns the value of the first "key : value" line of a /proc
// file.
func procField(file, key string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
