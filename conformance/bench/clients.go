package main

// The -clients mode: produce and consume MB/s with many active client
// connections at once, against the same with few. For each count N and
// each path, N franz-go clients, each with connections of its own, first
// produce together at full speed for -duration, then N consumers read
// the topic together, each its own slice of every partition, so that
// every count reads the same records. Paths alternate within a round as
// in the main benchmark. A member's costs per connection and per request
// show here as its CPU per GiB and its RSS with the clients active, set
// beside the same at the smallest count.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// clientsStart bounds the clients connecting (and taking a producer ID)
// at once.
const clientsStart = 64

// clientsBuffered is how many records the producers of a run buffer at
// most, all together.
const clientsBuffered = 100_000

// clientsRunSlack bounds a run beyond its length: starting the clients,
// flushing, reading the slices. A run past it fails the benchmark.
const clientsRunSlack = 5 * time.Minute

// consumeSliceBytes is each consumer's fetch size per partition: small,
// so that a consumer reads little past its slice at 1,000 clients.
const consumeSliceBytes = 256 << 10

// clientsRun is one measured run of N clients on one path.
type clientsRun struct {
	runResult
	rss int64 // the path process's RSS at the run's end, clients still connected (0: no process)
}

// runClients measures every count of o.clients on every path, o.Rounds
// times, and reports medians.
func runClients(ctx context.Context, o options, cmd string, m benchutil.Machine, paths []path, direct string, vals [][]byte) error {
	type key struct {
		n    int
		path string
	}
	produced := map[key][]clientsRun{}
	consumed := map[key][]clientsRun{}
	idleRSS := map[string]int64{}
	for _, p := range paths {
		if p.proc != nil {
			rss, err := benchutil.PidStatus(p.proc.Cmd.Process.Pid, "VmRSS")
			if err != nil {
				return err
			}
			idleRSS[p.name] = rss
		}
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, n := range o.clients {
			for _, p := range paths {
				r, err := produceClients(ctx, p, n, vals, o.Duration)
				if err != nil {
					return fmt.Errorf("%d clients produce %s: %w", n, p.name, err)
				}
				produced[key{n, p.name}] = append(produced[key{n, p.name}], r)
				step("round %d/%d %5d clients produce %-10s %7.1f MB/s%s%s", round, o.Rounds, n, p.name, r.MBps(), cpuNote(r.runResult), rssNote(r))
			}
			slices, err := consumerSlices(ctx, direct, n, o.Records)
			if err != nil {
				return err
			}
			for _, p := range paths {
				r, err := consumeClients(ctx, p, slices)
				if err != nil {
					return fmt.Errorf("%d clients consume %s: %w", n, p.name, err)
				}
				consumed[key{n, p.name}] = append(consumed[key{n, p.name}], r)
				step("round %d/%d %5d clients consume %-10s %7.1f MB/s%s%s", round, o.Rounds, n, p.name, r.MBps(), cpuNote(r.runResult), rssNote(r))
			}
		}
	}

	var md strings.Builder
	fmt.Fprintf(&md, "# Many clients\n\n`%s`\n\n", cmd)
	fmt.Fprintf(&md, "Machine: %d CPUs (%s), %.1f GiB memory, Linux %s, load %s at start; %s. The brokers, Ferry and the clients share its CPUs.\n\n",
		m.CPUs, m.Model, m.MemGiB, m.Kernel, m.Load, m.GoVersion)
	fmt.Fprintf(&md, "3 brokers (Kafka %s), topic of %d partitions (replication factor 3), %d-byte records (lz4), acks=all idempotent producers at full speed for %v, %d records buffered in all of them together at most; "+
		"consumers each read their own slice of every partition (fetches of %d KiB a partition), the same records at every count. "+
		"Each client is a franz-go client with connections of its own. Medians of %d rounds, [lowest – highest].\n\n",
		kafkatest.Version(), o.Partitions, o.Size, o.Duration, clientsBuffered, consumeSliceBytes>>10, o.Rounds)
	md.WriteString("| clients | path | produce MB/s | produce CPU-s/GiB | consume MB/s | consume CPU-s/GiB | RSS, clients active (first round) |\n|--:|---|--:|--:|--:|--:|--:|\n")
	cpu := func(r clientsRun) float64 { return cpuPerGiB(r.runResult) }
	for _, n := range o.clients {
		for _, p := range paths {
			pr, cr := produced[key{n, p.name}], consumed[key{n, p.name}]
			row := []string{fmt.Sprint(n), p.name,
				spread(pr, func(r clientsRun) float64 { return r.MBps() }, "%.1f"), "",
				spread(cr, func(r clientsRun) float64 { return r.MBps() }, "%.1f"), "", ""}
			if p.proc != nil {
				row[3] = spread(pr, cpu, "%.2f")
				row[5] = spread(cr, cpu, "%.2f")
				// The first round's: memory a larger count freed stays
				// with the process a while (the Go runtime returns it
				// slowly), so later rounds of a smaller count read high.
				row[6] = fmt.Sprintf("%.0f MiB (%.0f MiB idle)", float64(pr[0].rss)/(1<<20), float64(idleRSS[p.name])/(1<<20))
			}
			fmt.Fprintf(&md, "| %s |\n", strings.Join(row, " | "))
		}
	}
	if len(o.clients) > 1 {
		lo, hi := o.clients[0], o.clients[len(o.clients)-1]
		fmt.Fprintf(&md, "\nAt %d clients against %d (medians):\n\n", hi, lo)
		for _, p := range paths {
			med := func(m map[key][]clientsRun, n int, f func(clientsRun) float64) float64 {
				v, _, _ := benchutil.Spread(values(m[key{n, p.name}], f))
				return v
			}
			mbps := func(r clientsRun) float64 { return r.MBps() }
			fmt.Fprintf(&md, "- %s: produce MB/s %s, consume MB/s %s", p.name,
				benchutil.Ratio(med(produced, hi, mbps), med(produced, lo, mbps)), benchutil.Ratio(med(consumed, hi, mbps), med(consumed, lo, mbps)))
			if p.proc != nil {
				perClient := float64(produced[key{hi, p.name}][0].rss-produced[key{lo, p.name}][0].rss) / float64(hi-lo) / 1024
				fmt.Fprintf(&md, "; CPU per GiB produced %s, consumed %s; RSS %.0f KiB more a client (first round, %d clients against %d)",
					benchutil.Ratio(med(produced, hi, cpu), med(produced, lo, cpu)),
					benchutil.Ratio(med(consumed, hi, cpu), med(consumed, lo, cpu)), perClient, hi, lo)
			}
			md.WriteString("\n")
		}
	}
	return benchutil.Publish(md.String(), md.String(), o.out, nil)
}

func values(rs []clientsRun, f func(clientsRun) float64) []float64 {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, f(r))
	}
	return xs
}

// spread prints the median of f over rs with its range.
func spread(rs []clientsRun, f func(clientsRun) float64, format string) string {
	med, lo, hi := benchutil.Spread(values(rs, f))
	if len(rs) < 2 {
		return fmt.Sprintf(format, med)
	}
	return fmt.Sprintf(format+" ["+format+" – "+format+"]", med, lo, hi)
}

func rssNote(r clientsRun) string {
	if r.rss == 0 {
		return ""
	}
	return fmt.Sprintf("  RSS %d MiB", r.rss>>20)
}

// startClients makes n clients, client i of optsFor(i), each connected
// (start does its first request), clientsStart at a time.
func startClients(n int, optsFor func(i int) []kgo.Opt, start func(*kgo.Client) error) ([]*kgo.Client, error) {
	cls := make([]*kgo.Client, n)
	errs := make([]error, n)
	sem := make(chan struct{}, clientsStart)
	var wg sync.WaitGroup
	for i := range cls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cl, err := kgo.NewClient(optsFor(i)...)
			if err == nil {
				cls[i] = cl
				err = start(cl)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeClients(cls)
		return nil, err
	}
	return cls, nil
}

func closeClients(cls []*kgo.Client) {
	for _, cl := range cls {
		if cl != nil {
			cl.Close()
		}
	}
}

// produceClients has n producers, connected and holding their producer
// IDs first, produce together at full speed for d.
func produceClients(ctx context.Context, p path, n int, vals [][]byte, d time.Duration) (clientsRun, error) {
	ctx, cancel := context.WithTimeout(ctx, d+clientsRunSlack)
	defer cancel()
	// The records buffered in all the clients together are the same at
	// every count: a producer at full speed keeps its buffer full, and
	// 1,000 clients of the default 10,000 records would hold 10 GB.
	opts := append(baseOpts(p.bootstrap), kgo.MaxBufferedRecords(max(clientsBuffered/n, 64)))
	cls, err := startClients(n, func(int) []kgo.Opt { return opts }, func(cl *kgo.Client) error {
		return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: vals[0]}).FirstErr()
	})
	if err != nil {
		return clientsRun{}, err
	}
	defer closeClients(cls)
	var r clientsRun
	r.runResult, err = measure(p, func() (runResult, error) {
		acks := benchutil.NewAcks(false)
		start := time.Now()
		end := start.Add(d)
		var wg sync.WaitGroup
		for i, cl := range cls {
			wg.Go(func() {
				for k := i; ctx.Err() == nil && time.Now().Before(end); k++ {
					cl.Produce(ctx, &kgo.Record{Topic: topic, Value: vals[k%len(vals)]}, func(r *kgo.Record, err error) {
						acks.Ack(r, 0, err)
					})
				}
			})
		}
		wg.Wait()
		for _, cl := range cls {
			if err := acks.Flush(ctx, cl); err != nil {
				return runResult{}, err
			}
		}
		return runResult{Records: acks.Records, Bytes: acks.Bytes, Elapsed: time.Since(start)}, nil
	})
	if err == nil && p.proc != nil {
		r.rss, err = benchutil.PidStatus(p.proc.Cmd.Process.Pid, "VmRSS")
	}
	return r, err
}

// consumerSlice is what one consumer reads: per partition, offsets [from,
// to).
type consumerSlice map[int32][2]int64

// consumerSlices splits the topic's last up to records records among n
// consumers, each a slice of every partition.
func consumerSlices(ctx context.Context, direct string, n int, records int64) ([]consumerSlice, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(direct, ",")...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(starts.Error(), ends.Error()); err != nil {
		return nil, err
	}
	parts := int64(len(ends[topic]))
	out := make([]consumerSlice, n)
	for i := range out {
		out[i] = consumerSlice{}
	}
	for p, e := range ends[topic] {
		s := starts[topic][p]
		from := max(s.Offset, e.Offset-records/parts)
		per := (e.Offset - from) / int64(n)
		if per == 0 {
			return nil, fmt.Errorf("partition %d holds %d records, fewer than one for each of %d consumers", p, e.Offset-from, n)
		}
		for i := range out {
			lo := from + int64(i)*per
			out[i][p] = [2]int64{lo, lo + per}
		}
	}
	return out, nil
}

// consumeClients has one consumer for each slice, connected first, read
// its slice; the run lasts from the first fetch to the last slice read.
func consumeClients(ctx context.Context, p path, slices []consumerSlice) (clientsRun, error) {
	ctx, cancel := context.WithTimeout(ctx, clientsRunSlack)
	defer cancel()
	cls, err := startClients(len(slices), func(i int) []kgo.Opt {
		offsets := map[int32]kgo.Offset{}
		for part, r := range slices[i] {
			offsets[part] = kgo.NewOffset().At(r[0])
		}
		return append(baseOpts(p.bootstrap), kgo.FetchMaxPartitionBytes(consumeSliceBytes),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}))
	}, func(cl *kgo.Client) error { return cl.Ping(ctx) })
	if err != nil {
		return clientsRun{}, err
	}
	defer closeClients(cls)
	var r clientsRun
	r.runResult, err = measure(p, func() (runResult, error) {
		var records, bytes atomic.Int64
		errs := make([]error, len(cls))
		start := time.Now()
		var wg sync.WaitGroup
		for i, cl := range cls {
			wg.Go(func() {
				left := maps.Clone(slices[i]) // the partitions not yet read to their slice's end
				for len(left) > 0 {
					fs := cl.PollFetches(ctx)
					if err := ctx.Err(); err != nil {
						errs[i] = err
						return
					}
					var ferr error
					fs.EachError(func(t string, part int32, err error) { ferr = fmt.Errorf("%s[%d]: %w", t, part, err) })
					if ferr != nil {
						errs[i] = ferr
						return
					}
					fs.EachRecord(func(rec *kgo.Record) {
						r, ok := left[rec.Partition]
						if !ok || rec.Offset >= r[1] {
							return // past the slice: read ahead, not counted
						}
						records.Add(1)
						bytes.Add(int64(len(rec.Value)))
						if rec.Offset == r[1]-1 {
							delete(left, rec.Partition)
						}
					})
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return runResult{}, err
		}
		return runResult{Records: records.Load(), Bytes: bytes.Load(), Elapsed: time.Since(start)}, nil
	})
	if err == nil && p.proc != nil {
		r.rss, err = benchutil.PidStatus(p.proc.Cmd.Process.Pid, "VmRSS")
	}
	return r, err
}
