package main

// The scale mode (-shapes, `make bench-scale`): the same switches measured
// as the clusters Ferry fronts grow. Shapes are taken in the order given,
// each growing the last on the same clusters and the same Ferry (topics
// and groups are added, never removed), so that each cost is read as a
// slope between shapes as well as a level:
//
//   - partitions: topics of 10 partitions each, one record in every
//     partition, idle but mirrored; the traffic (-rate records/s and
//     -groups live consumer groups, half of them KIP-848) stays on its own
//     topic;
//   - groups: groups with a committed offset on each partition of one
//     idle topic, as consumers that come and go leave them: every switch
//     copies them all.
//
// At each shape: the member's resident and Go heap memory and its CPU with
// the producer paused (idle cost), Metadata for every topic at the member
// and at the active cluster directly (sequential requests, p50 and p99),
// then -rounds planned and -rounds forced switches as in the default mode.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// shape is a size of the clusters: partitions mirrored and groups with
// committed offsets.
type shape struct{ partitions, groups int }

func (s shape) String() string { return fmt.Sprintf("%dx%d", s.partitions, s.groups) }

// parseShapes reads "100x10,1000x100": partitions x groups, each shape at
// least as large as the one before.
func parseShapes(v string) ([]shape, error) {
	var out []shape
	for f := range strings.SplitSeq(v, ",") {
		p, g, ok := strings.Cut(strings.TrimSpace(f), "x")
		np, err1 := strconv.Atoi(p)
		ng, err2 := strconv.Atoi(g)
		if !ok || err1 != nil || err2 != nil || np < scaleTopicPartitions || ng < 0 {
			return nil, fmt.Errorf("shape %q: want PARTITIONSxGROUPS, partitions at least %d", f, scaleTopicPartitions)
		}
		s := shape{np, ng}
		if n := len(out); n > 0 && (s.partitions < out[n-1].partitions || s.groups < out[n-1].groups) {
			return nil, fmt.Errorf("shape %v after %v: shapes only grow", s, out[n-1])
		}
		out = append(out, s)
	}
	return out, nil
}

// scaleTopicPartitions is the partitions of each idle topic.
const scaleTopicPartitions = 10

// shapeResult is what one shape measured.
type shapeResult struct {
	shape
	mirrored              int // partitions the mirror reported
	grow                  time.Duration
	rss, heap             int64
	idleCPU               float64 // of one core
	parked, mirrorConns   int     // idle partitions parked, the mirror's broker connections (-1: not reported)
	metaFerry, metaDirect []time.Duration
	metaAdded             []time.Duration // the member's time less the direct one, each pair
	planned               map[string][]time.Duration
	catchUp               []float64       // MB/s of each catch-up round (catchup.go), from the restart
	catchUpCopy           []float64       // the same from the backlog's first byte on the standby
	catchUpFirst          []time.Duration // restart → the first byte on the standby
	catchUpDirect         []float64       // MB/s of the backlog written by a client straight to the source
	catchUpCPU            []float64       // the member's cores busy from the restart to caught up
	catchUpBusy           []float64       // the machine's busy share (of every core) over the same
	catchUpStarts         [][2]float64    // the restarted writers' start times (s): the bucket bounds of their median and of the last
	mirrorBack            []time.Duration // planned switch's call → the mirror caught up the other way
	forced, forcedAnswer  []time.Duration
	steps                 []string // each planned switch's, as it answered
	topicsNow, groupsNow  int
}

func (b *bench) measureShapes(ctx context.Context, shapes []shape) error {
	tr, stop, err := b.startTraffic(ctx, "switchbench-traffic")
	if err != nil {
		return err
	}
	defer stop()
	var topics, groups int // created so far
	for _, sh := range shapes {
		r := &shapeResult{shape: sh, planned: map[string][]time.Duration{}}
		t0 := time.Now()
		step("shape %v: growing to %d idle topics of %d partitions and %d groups", sh, sh.partitions/scaleTopicPartitions, scaleTopicPartitions, sh.groups)
		var err error
		if topics, err = b.growTopics(ctx, topics, sh.partitions/scaleTopicPartitions); err != nil {
			return fmt.Errorf("shape %v: %w", sh, err)
		}
		if groups, err = b.growGroups(ctx, groups, sh.groups, topics); err != nil {
			return fmt.Errorf("shape %v: %w", sh, err)
		}
		// Every idle topic and the traffic topic mirrored.
		want := topics*scaleTopicPartitions + b.o.partitions
		if b.o.mirrorExclude != "" {
			want = b.o.partitions // at least the traffic's
		}
		if err := b.waitCaughtUp(ctx, int64(b.o.rate/10), want); err != nil {
			return fmt.Errorf("shape %v: %w", sh, err)
		}
		r.grow = time.Since(t0)
		r.topicsNow, r.groupsNow = topics, groups
		if r.mirrored, err = b.mirroredPartitions(); err != nil {
			return err
		}
		step("shape %v: %d partitions mirrored, caught up %v after the growth began", sh, r.mirrored, r.grow.Round(time.Millisecond))
		// Its memory and idle cost with every partition in its view:
		// the member refreshes its metadata every 30 s, and grown in
		// seconds (kfake) the shape may not be in it yet.
		if err := b.waitMemberSees(ctx, sh.partitions); err != nil {
			return fmt.Errorf("shape %v: %w", sh, err)
		}
		if err := b.measureIdle(ctx, tr, r); err != nil {
			return fmt.Errorf("shape %v: %w", sh, err)
		}
		if err := b.measureMetadata(ctx, r); err != nil {
			return fmt.Errorf("shape %v: %w", sh, err)
		}
		if b.o.idleConns > 0 && b.idleConns == nil {
			if b.idleConns, err = b.measureIdleConns(ctx, b.o.idleConns); err != nil {
				return fmt.Errorf("shape %v: idle connections: %w", sh, err)
			}
		}
		// After the idle connections: the heap the copy frees would
		// be reused by them, and their cost read low.
		for range b.o.rounds {
			if b.o.catchUpBytes <= 0 {
				break
			}
			if err := b.measureCatchUp(ctx, r); err != nil {
				return fmt.Errorf("shape %v: catch-up: %w", sh, err)
			}
		}
		for i := range b.o.rounds {
			call, answer, ack, grp, err := b.plannedSwitch(ctx, tr)
			if err != nil {
				return fmt.Errorf("shape %v: %w", sh, err)
			}
			r.planned["answer"] = append(r.planned["answer"], answer)
			r.planned["ack"] = append(r.planned["ack"], ack)
			r.planned["groups"] = append(r.planned["groups"], grp)
			r.steps = append(r.steps, b.lastSteps)
			// How long until the mirror runs the other way again, every
			// writer past starting: the standby unprotected meanwhile.
			if err := b.waitCaughtUp(ctx, int64(b.o.rate/10), want); err != nil {
				return fmt.Errorf("shape %v: after planned %d: %w", sh, i+1, err)
			}
			r.mirrorBack = append(r.mirrorBack, time.Since(call))
			step("shape %v: planned %d → %s: answer %v, first ack %v, every live group consuming %v (%s; steps: %s); mirror caught up the other way %v after the call",
				sh, i+1, b.active, answer, ack, grp, b.lastGroups, b.lastSteps, r.mirrorBack[i].Round(time.Millisecond))
			time.Sleep(2 * time.Second)
		}
		for i := range b.o.rounds {
			answer, ack, err := b.forcedSwitch(ctx, tr)
			if err != nil {
				return fmt.Errorf("shape %v: %w", sh, err)
			}
			r.forcedAnswer = append(r.forcedAnswer, answer)
			r.forced = append(r.forced, ack)
			step("shape %v: forced %d → %s: answer %v, first ack %v (steps: %s)", sh, i+1, b.active, answer, ack, b.lastSteps)
			time.Sleep(2 * time.Second)
		}
		b.shapes = append(b.shapes, r)
	}
	if n := tr.errs(); n > 0 {
		return fmt.Errorf("%d produces failed during the switches", n)
	}
	return nil
}

// activeAdmin is an admin client of the active cluster, directly.
func (b *bench) activeAdmin(opts ...kgo.Opt) (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.clusters[b.active].Addrs()...)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl.Close, nil
}

func scaleTopic(i int) string { return fmt.Sprintf("scale-%05d", i) }

// growTopics creates idle topics have..want-1 on the active cluster, with
// one record in each partition, and returns want.
func (b *bench) growTopics(ctx context.Context, have, want int) (int, error) {
	if want <= have {
		return have, nil
	}
	adm, closeAdm, err := b.activeAdmin()
	if err != nil {
		return have, err
	}
	defer closeAdm()
	for i := have; i < want; i += 200 {
		var names []string
		for j := i; j < min(i+200, want); j++ {
			names = append(names, scaleTopic(j))
		}
		resps, err := adm.CreateTopics(ctx, scaleTopicPartitions, 1, nil, names...)
		if err == nil {
			err = resps.Error()
		}
		if err != nil {
			return have, fmt.Errorf("creating topics: %w", err)
		}
	}
	// New topics reach the broker's metadata a moment after they are
	// created: unknown topics are retried until the delivery timeout,
	// generous because this is set-up, not a measurement (1,000 new
	// topics once took a loaded machine's broker past 5 minutes).
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.clusters[b.active].Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.UnknownTopicRetries(-1), kgo.RecordDeliveryTimeout(15*time.Minute))
	if err != nil {
		return have, err
	}
	defer prod.Close()
	var recs []*kgo.Record
	for i := have; i < want; i++ {
		for p := range int32(scaleTopicPartitions) {
			recs = append(recs, &kgo.Record{Topic: scaleTopic(i), Partition: p, Value: []byte("idle")})
		}
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return have, fmt.Errorf("a record in each new partition: %w", err)
	}
	return want, nil
}

// growGroups commits offsets for groups have..want-1 on the active
// cluster, group i on every partition of idle topic i mod topics, and
// returns want.
func (b *bench) growGroups(ctx context.Context, have, want, topics int) (int, error) {
	if want <= have {
		return have, nil
	}
	if topics == 0 {
		return have, fmt.Errorf("groups need an idle topic")
	}
	adm, closeAdm, err := b.activeAdmin()
	if err != nil {
		return have, err
	}
	defer closeAdm()
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := have; i < want; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var o kadm.Offsets
			for p := range int32(scaleTopicPartitions) {
				o.AddOffset(scaleTopic(i%topics), p, 1, -1)
			}
			resp, err := adm.CommitOffsets(ctx, fmt.Sprintf("scale-g-%05d", i), o)
			if err == nil {
				err = resp.Error()
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return have, fmt.Errorf("committing group offsets: %d failed, the first: %w", len(errs), errs[0])
	}
	return want, nil
}

// mirroredPartitions is how many partitions the mirror reports.
func (b *bench) mirroredPartitions() (int, error) {
	var st struct {
		Mirror struct {
			Partitions []struct{} `json:"partitions"`
		} `json:"mirror"`
	}
	resp, err := http.Get("http://" + b.admin + "/status")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, err
	}
	return len(st.Mirror.Partitions), nil
}

// measureIdle reads the member's memory, then its CPU over idleFor with
// the producer paused (the live groups still poll, as idle consumers do).
func (b *bench) measureIdle(ctx context.Context, tr *traffic, r *shapeResult) error {
	const idleFor = 30 * time.Second // one round of each periodic task (configs, the parked partitions' listing)
	tr.paused.Store(true)
	defer tr.paused.Store(false)
	if err := tr.prod.Flush(ctx); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // the last records mirrored
	// An idle partition parks about 15 s after its last record
	// (mirror/watch.go): the figures are those of the steady state, every
	// idle topic's partitions parked (a build without parking reports no
	// such metric, and is measured at once).
	r.parked, r.mirrorConns = -1, -1
	for deadline := time.Now().Add(90 * time.Second); ; {
		n, err := b.metric("ferry_mirror_idle_partitions")
		if err != nil {
			break
		}
		r.parked = int(n)
		if r.parked >= r.mirrored-b.o.partitions || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if n, err := b.metric("ferry_mirror_connections"); err == nil {
		r.mirrorConns = int(n)
	}
	c0, err := benchutil.PidCPU(b.ferryPID)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if b.o.profileDir != "" {
		// The CPU profile spans the idle period itself.
		if err := b.profile(ctx, fmt.Sprintf("profile?seconds=%d", int(idleFor/time.Second)), fmt.Sprintf("cpu-idle-%v.pb.gz", r.shape)); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t0.Add(idleFor))):
	}
	c1, err := benchutil.PidCPU(b.ferryPID)
	if err != nil {
		return err
	}
	r.idleCPU = (c1 - c0).Seconds() / time.Since(t0).Seconds()
	mem, err := b.memory()
	if err != nil {
		return err
	}
	r.rss, r.heap = mem.rss, mem.heap
	if b.o.profileDir != "" {
		if err := b.profile(ctx, "heap?gc=1", fmt.Sprintf("heap-%v.pb.gz", r.shape)); err != nil {
			return err
		}
	}
	stacks, err := b.metric("go_memstats_stack_inuse_bytes")
	if err != nil {
		return err
	}
	step("shape %v: member RSS %s, Go heap in use %s, stacks %s (%d goroutines), CPU idle %.1f%% of a core; %d partitions parked, %d mirror connections", r.shape, benchutil.HumanBytes(r.rss), benchutil.HumanBytes(r.heap),
		benchutil.HumanBytes(stacks), mem.goroutines, 100*r.idleCPU, r.parked, r.mirrorConns)
	return nil
}

// memoryUse is the member's resident memory, Go heap in use and
// goroutines.
type memoryUse struct{ rss, heap, goroutines int64 }

func (b *bench) memory() (memoryUse, error) {
	var m memoryUse
	var err error
	if m.rss, err = benchutil.PidStatus(b.ferryPID, "VmRSS"); err != nil {
		return m, err
	}
	if m.heap, err = b.metric("go_memstats_heap_inuse_bytes"); err != nil {
		return m, err
	}
	m.goroutines, err = b.metric("go_goroutines")
	return m, err
}

// profile saves the member's runtime profile /debug/pprof/<what> as file in
// -profile-dir.
func (b *bench) profile(ctx context.Context, what, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.admin+"/debug/pprof/"+what, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", what, resp.Status)
	}
	if err := os.MkdirAll(b.o.profileDir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(b.o.profileDir, file))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	step("profile %s saved in %s", what, f.Name())
	return f.Close()
}

// metric reads one unlabelled metric of the member's /metrics.
func (b *bench) metric(name string) (int64, error) {
	resp, err := http.Get("http://" + b.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int64(f), err
		}
	}
	return 0, fmt.Errorf("no %s in /metrics (%v)", name, sc.Err())
}

// histogram reads the cumulative bucket counts of one unlabelled
// histogram of the member's /metrics, by upper bound (+Inf included).
func (b *bench) histogram(name string) (map[float64]float64, error) {
	resp, err := http.Get("http://" + b.admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	h := map[float64]float64{}
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, n, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		bound, err1 := strconv.ParseFloat(le, 64)
		count, err2 := strconv.ParseFloat(n, 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("%s: %w", sc.Text(), err)
		}
		h[bound] = count
	}
	if len(h) == 0 {
		return nil, fmt.Errorf("no %s in /metrics (%v)", name, sc.Err())
	}
	return h, sc.Err()
}

// histQuantile is the upper bound of the bucket holding quantile q of
// what was observed between two readings (0: nothing observed).
func histQuantile(before, after map[float64]float64, q float64) (bound, n float64) {
	bounds := make([]float64, 0, len(after))
	for b := range after {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	total := after[math.Inf(1)] - before[math.Inf(1)]
	if total <= 0 {
		return 0, 0
	}
	for _, b := range bounds {
		if after[b]-before[b] >= q*total {
			return b, total
		}
	}
	return math.Inf(1), total
}

// metadataRounds is how many Metadata requests for every topic each side
// is asked: p99 resolved to its fourth-highest of 400.
const metadataRounds = 400

// measureMetadata times Metadata for every topic, one request at a time,
// at the member and at the active cluster directly, alternately (which
// goes first alternating too): both sides see the same machine, whose
// other work (the mirror, the traffic, the brokers' collections) sets the
// tail on two shared cores. Each pair's difference is the member's own
// share.
func (b *bench) measureMetadata(ctx context.Context, r *shapeResult) error {
	var cls [2]*kgo.Client
	for i, seed := range [][]string{{b.addr}, b.clusters[b.active].Addrs()} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(seed...))
		if err != nil {
			return err
		}
		defer cl.Close()
		cls[i] = cl
	}
	ask := func(cl *kgo.Client) (time.Duration, error) {
		req := kmsg.NewPtrMetadataRequest() // Topics nil: every topic
		t0 := time.Now()
		resp, err := req.RequestWith(ctx, cl)
		took := time.Since(t0)
		if err != nil {
			return 0, fmt.Errorf("metadata: %w", err)
		}
		if n := partitionsIn(resp); n < r.partitions {
			return 0, fmt.Errorf("metadata named %d partitions, want at least %d", n, r.partitions)
		}
		return took, nil
	}
	for i := range metadataRounds + 5 {
		var took [2]time.Duration
		for k := range 2 {
			side := (i + k) % 2
			var err error
			if took[side], err = ask(cls[side]); err != nil {
				return err
			}
		}
		if i < 5 {
			continue // connections up, versions known
		}
		r.metaFerry, r.metaDirect = append(r.metaFerry, took[0]), append(r.metaDirect, took[1])
		r.metaAdded = append(r.metaAdded, took[0]-took[1])
	}
	step("shape %v: Metadata for every topic: member p50 %v p99 %v, directly p50 %v p99 %v, the member's added time per pair p50 %v", r.shape,
		pct(r.metaFerry, 50), pct(r.metaFerry, 99), pct(r.metaDirect, 50), pct(r.metaDirect, 99), pct(r.metaAdded, 50))
	return nil
}

// waitMemberSees waits until Metadata for every topic through the member
// names at least partitions partitions.
func (b *bench) waitMemberSees(ctx context.Context, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n := 0
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl) // Topics nil: every topic
		if err == nil {
			if n = partitionsIn(resp); n >= partitions {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the member's Metadata names %d partitions after 2 minutes, want at least %d (%v)", n, partitions, err)
		}
		time.Sleep(time.Second)
	}
}

// partitionsIn counts the partitions a Metadata answer names.
func partitionsIn(resp *kmsg.MetadataResponse) int {
	n := 0
	for _, t := range resp.Topics {
		n += len(t.Partitions)
	}
	return n
}

// pct is the p-th percentile of xs (nearest rank).
func pct(xs []time.Duration, p int) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))].Round(10 * time.Microsecond)
}

// parkedConns is the report's parked partitions / mirror connections.
func durOrNone(xs []time.Duration) string {
	if len(xs) == 0 {
		return "–"
	}
	return dur(xs)
}

func mbps(xs []float64) string {
	if len(xs) == 0 {
		return "–"
	}
	m, lo, hi := benchutil.Spread(xs)
	return fmt.Sprintf("%.1f MB/s (%.1f – %.1f)", m, lo, hi)
}

// share is the median and range of xs scaled by unit (1: cores, 100: %).
func share(xs []float64, unit float64) string {
	if len(xs) == 0 {
		return "–"
	}
	m, lo, hi := benchutil.Spread(xs)
	if unit == 100 {
		return fmt.Sprintf("%.0f %% (%.0f – %.0f)", m*unit, lo*unit, hi*unit)
	}
	return fmt.Sprintf("%.2f (%.2f – %.2f)", m*unit, lo*unit, hi*unit)
}

func parkedConns(r *shapeResult) string {
	if r.parked < 0 {
		return "–"
	}
	return fmt.Sprintf("%d / %d", r.parked, r.mirrorConns)
}

func (b *bench) reportShapes(w io.Writer) error {
	m := benchutil.ReadMachine()
	var sb strings.Builder
	fmt.Fprintf(&sb, "# Scale benchmark\n\n")
	clusters := fmt.Sprintf("Kafka %s (two 1-broker KRaft clusters on this machine)", kafkatest.Version())
	if b.o.fake {
		clusters = "two in-process kfake clusters (franz-go's fake Kafka, 1 broker each, in the benchmark's process; the member runs as its own process): the member's own costs at each shape, not a broker's"
	}
	fmt.Fprintf(&sb, "`%s` on %d CPUs (%s), %.0f GiB, Linux %s, load %s, Go %s, %s, franz-go clients.\n\n",
		benchutil.Command("./conformance/switchbench", os.Args[1:]), m.CPUs, m.Model, m.MemGiB, m.Kernel, m.Load, m.GoVersion, clusters)
	interval := "Ferry's default (5 s)"
	if b.o.syncInterval > 0 {
		interval = b.o.syncInterval.String()
	}
	catchUp := ""
	if b.o.catchUpBytes > 0 {
		catchUp = fmt.Sprintf(" Mirror catch-up: the writers of partition 0 of every idle topic halted, %s of %d-byte records (lz4) written to those partitions directly, the writers restarted; MB/s of record values from the restart to the standby holding every offset (each restarted writer takes its partition over first: its leaders looked up, a producer ID, a check of its ownership and of its slots, the check of its tail; no fence period, as it succeeds its own predecessor), and from the first byte of the backlog seen on the standby; medians of %d with the range in brackets.",
			benchutil.HumanBytes(b.o.catchUpBytes), catchUpValueSize, b.o.rounds)
	}
	fmt.Fprintf(&sb, "The member runs with its defaults but for the listeners; mirror.sync_interval: %s. Idle CPU is the member's over 30 s with the producer paused (the live groups still poll), once every idle partition has parked. Metadata for every topic: %d requests at the member and %d at the cluster directly, one at a time, alternately; the member's added time is the median of each pair's difference.%s\n\n",
		interval, metadataRounds, metadataRounds, catchUp)
	mirrored := "mirrored"
	if b.o.mirrorExclude != "" {
		mirrored = fmt.Sprintf("served through the member but not mirrored (mirror.topics.exclude %q: the mirror, its drains and the switch cover the traffic's topic alone)", b.o.mirrorExclude)
	}
	fmt.Fprintf(&sb, "Each shape grows the one before on the same clusters and the same member: idle topics of %d partitions with a record in each, %s; groups with a committed offset on every partition of one idle topic. Traffic on its own %d-partition topic: one idempotent producer at %d records/s and %d live consumer groups (half KIP-848), through Ferry. Switch times are medians of %d with the lowest and highest in brackets.\n\n",
		scaleTopicPartitions, mirrored, b.o.partitions, b.o.rate, b.o.groups, b.o.rounds)
	fmt.Fprintf(&sb, "| shape (partitions × groups) | mirrored partitions | planned: answer | planned: first ack | planned: live groups consuming | planned: mirror caught up the other way | forced: first ack | Metadata p50 / p99, member | directly | member's added, p50 | member RSS | Go heap | CPU idle | parked partitions / mirror connections |\n")
	fmt.Fprintf(&sb, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range b.shapes {
		fmt.Fprintf(&sb, "| %d × %d | %d | %s | %s | %s | %s | %s | %v / %v | %v / %v | %v | %s | %s | %.1f %% | %s |\n",
			r.partitions, r.groups, r.mirrored, dur(r.planned["answer"]), dur(r.planned["ack"]), dur(r.planned["groups"]), dur(r.mirrorBack), dur(r.forced),
			pct(r.metaFerry, 50), pct(r.metaFerry, 99), pct(r.metaDirect, 50), pct(r.metaDirect, 99), pct(r.metaAdded, 50),
			benchutil.HumanBytes(r.rss), benchutil.HumanBytes(r.heap), 100*r.idleCPU, parkedConns(r))
	}
	if len(b.shapes) > 0 && len(b.shapes[0].catchUp) > 0 {
		fmt.Fprintf(&sb, "\nMirror catch-up (the backlog over a tenth of the shape's partitions; \"written directly\": the same bytes as the client wrote them to the source, before the restart; cores: the member's CPU over the catch-up, and the machine's busy share of both cores):\n\n")
		fmt.Fprintf(&sb, "| shape | partitions with a backlog | mirror catch-up from the restart | its first byte after | the copy from there | written directly | member cores | machine busy | writer starts: half within / all within (each round) |\n")
		fmt.Fprintf(&sb, "|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range b.shapes {
			var starts []string
			for _, st := range r.catchUpStarts {
				starts = append(starts, fmt.Sprintf("%gs / %gs", st[0], st[1]))
			}
			fmt.Fprintf(&sb, "| %d × %d | %d | %s | %s | %s | %s | %s | %s | %s |\n", r.partitions, r.groups, r.topicsNow,
				mbps(r.catchUp), durOrNone(r.catchUpFirst), mbps(r.catchUpCopy), mbps(r.catchUpDirect), share(r.catchUpCPU, 1), share(r.catchUpBusy, 100),
				strings.Join(starts, "; "))
		}
		fmt.Fprintf(&sb, "\nWriter starts are ferry_mirror_writer_start_seconds over the catch-up, as bucket bounds: every restarted writer starts at the restart, so the last start is about when the last partition began copying.\n")
	}
	if n := len(b.shapes); n >= 2 && len(b.shapes[0].catchUp) > 0 && len(b.shapes[n-1].catchUp) > 0 {
		a, z := b.shapes[0], b.shapes[n-1]
		am, _, _ := benchutil.Spread(a.catchUp)
		zm, _, _ := benchutil.Spread(z.catchUp)
		zc, _, _ := benchutil.Spread(z.catchUpCopy)
		ac, _, _ := benchutil.Spread(a.catchUpCopy)
		zd, _, _ := benchutil.Spread(z.catchUpDirect)
		ad, _, _ := benchutil.Spread(a.catchUpDirect)
		fmt.Fprintf(&sb, "\nMirror catch-up at %d partitions against %d: %s from the restart (floor ≥ 0.8×), %s from the first byte; the same backlog written directly: %s.\n",
			z.partitions, a.partitions, benchutil.Ratio(zm, am), benchutil.Ratio(zc, ac), benchutil.Ratio(zd, ad))
	}
	// The slope from the first shape measured after the idle connections
	// were opened and closed: the heap they leave behind (freed, not yet
	// returned) is not the partitions'.
	first := 0
	if b.idleConns != nil {
		first = 1
	}
	// And from the shape before the last: a collection pending at one
	// shape (its heap up to twice what is live) can turn a slope over
	// the whole range negative.
	if n := len(b.shapes); n >= first+2 {
		for _, from := range slices.Compact([]int{first, n - 2}) {
			a, z := b.shapes[from], b.shapes[n-1]
			what, pa, pz := "mirrored partition", a.mirrored, z.mirrored
			if b.o.mirrorExclude != "" {
				// Served, not mirrored: the slope is the partitions'.
				what, pa, pz = "partition served (not mirrored)", a.partitions, z.partitions
			}
			if dp := pz - pa; dp > 0 {
				kib := func(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/1024/float64(dp)) }
				fmt.Fprintf(&sb, "\nPer %s, from %d to %d: RSS %s, Go heap %s, idle CPU %.3f %% of a core per 1,000.\n",
					what, pa, pz, kib(z.rss-a.rss), kib(z.heap-a.heap),
					100*(z.idleCPU-a.idleCPU)/float64(dp)*1000)
			}
		}
	}
	if c := b.idleConns; c != nil {
		fmt.Fprintf(&sb, "\n%d idle client connections (each asked ApiVersions, then nothing), opened from 64 goroutines at the first shape: %v (%.0f a second); the member's RSS %s → %s, %s per connection (Go heap %s), %.1f goroutines per connection.\n",
			c.n, c.took.Round(time.Millisecond), float64(c.n)/c.took.Seconds(), benchutil.HumanBytes(c.rssBefore), benchutil.HumanBytes(c.rssAfter),
			benchutil.HumanBytes(c.rssPer), benchutil.HumanBytes(c.heapPer), c.goroutinesPer)
	}
	fmt.Fprintf(&sb, "\nEach planned switch's steps, as it answered them:\n\n")
	for _, r := range b.shapes {
		for i, s := range r.steps {
			fmt.Fprintf(&sb, "- %v, round %d: %s\n", r.shape, i+1, s)
		}
	}
	fmt.Fprint(w, sb.String())
	if b.o.out != "" {
		return os.WriteFile(b.o.out, []byte(sb.String()), 0o644)
	}
	return nil
}

// idleConnsResult is what opening many idle client connections cost.
type idleConnsResult struct {
	n                   int
	took                time.Duration // opening them, ApiVersions answered on each
	rssPer, heapPer     int64
	goroutinesPer       float64
	rssBefore, rssAfter int64
}

// measureIdleConns opens n client connections to the member, each asking
// ApiVersions as a client does first (from 64 goroutines), keeps them open
// and idle, and reads the member's memory before and after.
func (b *bench) measureIdleConns(ctx context.Context, n int) (*idleConnsResult, error) {
	r := &idleConnsResult{n: n}
	before, err := b.memory()
	if err != nil {
		return nil, err
	}
	r.rssBefore = before.rss
	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("switchbench-idle"))
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName, req.ClientSoftwareVersion = "switchbench", "1"
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	t0 := time.Now()
	for range 64 {
		wg.Go(func() {
			d := net.Dialer{Timeout: 10 * time.Second}
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				c, err := d.DialContext(ctx, "tcp", b.addr)
				if err == nil {
					conns[i] = c
					c.SetDeadline(time.Now().Add(30 * time.Second))
					_, err = c.Write(frame.AppendRequest(nil, req, 1))
				}
				if err == nil {
					var size [4]byte
					if _, err = io.ReadFull(c, size[:]); err == nil {
						_, err = io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(size[:])))
					}
					c.SetDeadline(time.Time{})
				}
				if err != nil {
					select {
					case errs <- fmt.Errorf("connection %d: %w", i, err):
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	r.took = time.Since(t0)
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	time.Sleep(3 * time.Second) // settled
	after, err := b.memory()
	if err != nil {
		return nil, err
	}
	r.rssAfter = after.rss
	r.rssPer = (after.rss - before.rss) / int64(n)
	r.heapPer = (after.heap - before.heap) / int64(n)
	r.goroutinesPer = float64(after.goroutines-before.goroutines) / float64(n)
	step("%d idle client connections: opened (ApiVersions answered) in %v, %.0f/s; member RSS %s → %s, %s per connection (Go heap %s), %.1f goroutines per connection",
		n, r.took.Round(time.Millisecond), float64(n)/r.took.Seconds(), benchutil.HumanBytes(r.rssBefore), benchutil.HumanBytes(r.rssAfter),
		benchutil.HumanBytes(r.rssPer), benchutil.HumanBytes(r.heapPer), r.goroutinesPer)
	return r, nil
}
