package main

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// machine describes where the benchmark ran.
type machine struct {
	cpus   int
	model  string
	memGiB float64
	kernel string
	load   string // 1, 5 and 15 minute load averages at the start
	goVer  string
}

func readMachine() machine {
	m := machine{cpus: runtime.NumCPU(), model: "unknown", kernel: "unknown", load: "unknown", goVer: runtime.Version()}
	if v := procField("/proc/cpuinfo", "model name"); v != "" {
		m.model = v
	}
	if v := procField("/proc/meminfo", "MemTotal"); v != "" {
		if kb, err := strconv.ParseFloat(strings.TrimSuffix(v, " kB"), 64); err == nil {
			m.memGiB = kb / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if fs := strings.Fields(string(b)); len(fs) >= 3 {
			m.load = strings.Join(fs[:3], " ")
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
