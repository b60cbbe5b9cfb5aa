package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// rendered is the report as a terminal table and as markdown.
type rendered struct{ text, markdown string }

// spread is a median with the lowest and highest value.
type spread struct{ med, lo, hi float64 }

func spreadOf(vs []float64) spread {
	if len(vs) == 0 {
		return spread{}
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	m := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		m = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return spread{m, vs[0], vs[len(vs)-1]}
}

// format renders s with verb f (e.g. "%.1f"): "m (lo–hi)".
func (s spread) format(f string) string {
	if s.lo == s.hi {
		return fmt.Sprintf(f, s.med)
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", s.med, s.lo, s.hi)
}

func values(ss []sample, f func(sample) float64) []float64 {
	var vs []float64
	for _, s := range ss {
		vs = append(vs, f(s))
	}
	return vs
}

func mbps(s sample) float64 { return s.MBps() }

func perGiB(d func(sample) time.Duration) func(sample) float64 {
	return func(s sample) float64 { return d(s).Seconds() / (float64(s.Bytes) / (1 << 30)) }
}

var (
	ferryCPU  = perGiB(func(s sample) time.Duration { return s.CPU })
	brokerCPU = perGiB(func(s sample) time.Duration { return s.brokerCPU })
)

// ratioPair is a ratio reported: num/den per round.
type ratioPair struct{ num, den, meaning string }

var ratioPairs = []ratioPair{
	{"direct-TLS", "direct", "TLS's own cost, no Ferry"},
	{"Ferry", "direct", "Ferry's cost, no TLS"},
	{"Ferry-no-splice", "Ferry", "fetch answers read whole, no TLS"},
	{"Ferry-TLS-client", "Ferry", "TLS to clients, through Ferry"},
	{"Ferry-TLS-client", "Ferry-no-splice", "TLS to clients, on the same data path"},
	{"Ferry-TLS-upstream", "Ferry", "TLS to brokers, through Ferry"},
	{"Ferry-TLS-both", "Ferry", "TLS on both sides, through Ferry"},
	{"Ferry-TLS-both", "direct-TLS", "Ferry's cost when everything is TLS"},
}

// ratios are num/den of f per round (runs of a round are paired: they ran
// one after the other).
func ratios(m map[string][]sample, num, den string, f func(sample) float64) []float64 {
	var vs []float64
	for i := range min(len(m[num]), len(m[den])) {
		if d := f(m[den][i]); d != 0 {
			vs = append(vs, f(m[num][i])/d)
		}
	}
	return vs
}

func report(res *results) rendered {
	o := res.opts
	type line struct{ cells []string }
	head := []string{"path", "produce MB/s", "consume MB/s", "Ferry CPU-s/GiB produce", "Ferry CPU-s/GiB consume",
		"brokers CPU-s/GiB produce", "brokers CPU-s/GiB consume", "consume: spliced / sent to clients"}
	var lines []line
	for _, name := range o.paths {
		m := modeNamed(name)
		p, c := res.produce[name], res.consume[name]
		l := line{[]string{name,
			spreadOf(values(p, mbps)).format("%.1f"), spreadOf(values(c, mbps)).format("%.1f"), "–", "–",
			spreadOf(values(p, brokerCPU)).format("%.2f"), spreadOf(values(c, brokerCPU)).format("%.2f"), "–"}}
		if m.ferry {
			l.cells[3] = spreadOf(values(p, ferryCPU)).format("%.2f")
			l.cells[4] = spreadOf(values(c, ferryCPU)).format("%.2f")
			var spl, sent, streamed float64
			for _, s := range c {
				spl, sent, streamed = spl+s.spliced, sent+s.sent, streamed+s.streamed
			}
			l.cells[7] = fmt.Sprintf("%.2f / %.2f GiB (%.0f%%), %.0f fetches streamed", spl/(1<<30), sent/(1<<30), 100*spl/max(sent, 1), streamed)
		}
		lines = append(lines, l)
	}
	rhead := []string{"ratio (per round)", "what it is", "produce MB/s", "consume MB/s", "Ferry CPU-s/GiB produce", "Ferry CPU-s/GiB consume"}
	var rlines []line
	for _, r := range ratioPairs {
		if !slices.Contains(o.paths, r.num) || !slices.Contains(o.paths, r.den) {
			continue
		}
		l := line{[]string{r.num + " / " + r.den, r.meaning,
			spreadOf(ratios(res.produce, r.num, r.den, mbps)).format("%.2f×"),
			spreadOf(ratios(res.consume, r.num, r.den, mbps)).format("%.2f×"), "–", "–"}}
		if modeNamed(r.num).ferry && modeNamed(r.den).ferry {
			l.cells[4] = spreadOf(ratios(res.produce, r.num, r.den, ferryCPU)).format("%.2f×")
			l.cells[5] = spreadOf(ratios(res.consume, r.num, r.den, ferryCPU)).format("%.2f×")
		}
		rlines = append(rlines, l)
	}
	var tlsNotes []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range res.tlsNote {
			if !yield(k) {
				return
			}
		}
	}) {
		tlsNotes = append(tlsNotes, k+": "+res.tlsNote[k])
	}
	mach := res.machine

	// Terminal.
	var t strings.Builder
	table := func(head []string, ls []line) {
		tw := tabwriter.NewWriter(&t, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		for _, l := range ls {
			fmt.Fprintln(tw, strings.Join(l.cells, "\t"))
		}
		tw.Flush()
	}
	fmt.Fprintf(&t, "median (lowest–highest) of %d rounds:\n", o.Rounds)
	table(head, lines)
	fmt.Fprintln(&t)
	table(rhead, rlines)
	fmt.Fprintf(&t, "\nnegotiated TLS (Go client): %s\n", strings.Join(tlsNotes, "; "))
	fmt.Fprintf(&t, "machine: %d CPUs (%s), %.1f GiB memory, Linux %s, load %s at start, %s at the end; %s; Kafka %s\n",
		mach.CPUs, mach.Model, mach.MemGiB, mach.Kernel, mach.Load, res.loadEnd, mach.GoVersion, kafkatest.Version())
	fmt.Fprintf(&t, "command: %s\ntook %v\n", res.command, res.took.Round(time.Second))

	// Markdown.
	var b strings.Builder
	mdTable := func(head []string, ls []line) {
		fmt.Fprintf(&b, "| %s |\n|", strings.Join(head, " | "))
		for i := range head {
			if i == 0 {
				b.WriteString("---|")
			} else {
				b.WriteString("--:|")
			}
		}
		b.WriteString("\n")
		for _, l := range ls {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(l.cells, " | "))
		}
	}
	fmt.Fprintf(&b, "Generated by `conformance/tlsbench` on %s; the whole run took %v.\n\n",
		res.started.UTC().Format("2006-01-02 15:04 MST"), res.took.Round(time.Second))
	fmt.Fprintf(&b, "```sh\n%s\n```\n\n", res.command)
	fmt.Fprintf(&b, "- machine: %d CPUs (%s), %.1f GiB memory, Linux %s; %s; Kafka %s on OpenJDK, brokers with `-Xmx512m`\n",
		mach.CPUs, mach.Model, mach.MemGiB, mach.Kernel, mach.GoVersion, kafkatest.Version())
	fmt.Fprintf(&b, "- load average (1, 5, 15 min): %s at the start, %s at the end\n", mach.Load, res.loadEnd)
	fmt.Fprintf(&b, "- negotiated TLS, seen by a Go client: %s\n", strings.Join(tlsNotes, "; "))
	fmt.Fprintf(&b, "- %d partitions, RF 3, %d-byte values, lz4; produce runs of %v, consume runs of %d records from the start; "+
		"warm-up %v of produce and a quarter of a consume run per path; each round runs %s in turn\n\n",
		o.Partitions, o.Size, o.Duration, res.consumeN, o.Warmup, strings.Join(o.paths, ", "))
	fmt.Fprintf(&b, "Median (lowest–highest) of %d rounds. CPU is utime+stime per GiB (2^30) of record values moved; "+
		"\"brokers\" is the three broker JVMs together.\n\n", o.Rounds)
	mdTable(head, lines)
	fmt.Fprintf(&b, "\nRatios, taken per round between runs that ran one after the other, median (lowest–highest):\n\n")
	mdTable(rhead, rlines)
	fmt.Fprintf(&b, "\n<details><summary>Every run</summary>\n\n| phase | round | path | records | MB/s | Ferry CPU | brokers CPU | sent to clients | spliced |\n|---|--:|---|--:|--:|--:|--:|--:|--:|\n")
	for _, ph := range []struct {
		name string
		m    map[string][]sample
	}{{"produce", res.produce}, {"consume", res.consume}} {
		for i := range o.Rounds {
			for _, name := range o.paths {
				if i >= len(ph.m[name]) {
					continue
				}
				s := ph.m[name][i]
				fc, sent, spl := "", "", ""
				if modeNamed(name).ferry {
					fc = fmt.Sprintf("%.1f s", s.CPU.Seconds())
					sent, spl = fmt.Sprintf("%.2f GiB", s.sent/(1<<30)), fmt.Sprintf("%.2f GiB", s.spliced/(1<<30))
				}
				fmt.Fprintf(&b, "| %s | %d | %s | %d | %.1f | %s | %.1f s | %s | %s |\n", ph.name, i+1, name, s.Records, s.MBps(), fc, s.brokerCPU.Seconds(), sent, spl)
			}
		}
	}
	fmt.Fprintf(&b, "\n</details>\n")
	return rendered{text: t.String(), markdown: b.String()}
}

// The markers around the generated part of the -out file.
const (
	beginMarker = "<!-- tlsbench:begin -->"
	endMarker   = "<!-- tlsbench:end -->"
)

// writeReport puts md between the markers of file, keeping the text around
// them, or writes the file whole (with the markers) if it has none.
func writeReport(file, md string) error {
	block := beginMarker + "\n" + md + endMarker + "\n"
	old, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(old)
	i, j := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	if i < 0 || j < i {
		return os.WriteFile(file, []byte("# TLS benchmarks\n\n"+block), 0o644)
	}
	rest := strings.TrimPrefix(s[j+len(endMarker):], "\n")
	return os.WriteFile(file, []byte(s[:i]+block+rest), 0o644)
}
