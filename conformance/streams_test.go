package conformance

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// A Kafka Streams application, exactly_once_v2, through Ferry across a
// planned switch and back and a forced switch, and restarted from nothing
// after the last switch (clients/streams/StreamsApp.java: input re-keyed
// through a repartition topic, aggregated per key into a RocksDB store with
// a changelog, every update written to an output topic).

const (
	streamsKeys       = 12 // k-0 … k-11
	streamsPartitions = 3
	// streamsBatch records every streamsTick: 200 input records a second.
	streamsBatch = 10
	streamsTick  = 50 * time.Millisecond
	// streamsProgress is how many input records the application must
	// process between two steps of the test.
	streamsProgress = 300
	// streamsVersion is kafka-streams' version in
	// conformance/maven-streams/pom.xml.
	streamsVersion = "4.4.0"
)

// TestStreamsExactlyOnceSwitch runs StreamsApp through `ferry serve` while
// an idempotent franz-go producer writes input through Ferry, across a
// planned switch primary → standby, a planned switch back, and a forced
// switch to the standby taken once the application had processed its input
// and the mirror and the group offset sync had caught up; then the
// application is restarted with an empty state directory (its store is
// rebuilt from the changelog the mirror copied) and processes more input.
// The forced switch reports no lost range. Read read_committed from each
// cluster directly at the end:
//   - the input holds every acknowledged record once, at its offset;
//   - the output holds, for each key, the counts 1, 2, …, n in offset order,
//     n the key's input records, each input record named once: every input
//     record counted exactly once, across the switches and the restore;
//   - the changelog's last value for each key is its final count;
//   - the repartition topic's log start (moved by Streams' purges,
//     DeleteRecords through Ferry) is the same on both clusters, above 0 in
//     every partition that received records;
//   - the group's committed offsets are the same on both clusters.
//
// The application never reaches ERROR. docs/STREAMS.md has the argument.
func TestStreamsExactlyOnceSwitch(t *testing.T) { streamsExactlyOnceSwitch(t, "classic") }

// TestStreamsGroupProtocolSwitch is TestStreamsExactlyOnceSwitch with the
// application in a streams group (group.protocol=streams, KIP-1071: the
// group coordinator assigns the tasks over StreamsGroupHeartbeat, which
// Ferry routes to it; after a switch the member rejoins the new cluster's
// group, which the mirror's offsets made an empty classic group and the
// member's first heartbeat makes a streams group).
func TestStreamsGroupProtocolSwitch(t *testing.T) { streamsExactlyOnceSwitch(t, "streams") }

func streamsExactlyOnceSwitch(t *testing.T, protocol string) {
	if testing.Short() {
		t.Skip("conformance: real Kafka and client programs are not run in -short mode")
	}
	begin := time.Now()
	var cp string
	var cpErr error
	compiled := make(chan struct{})
	kafkaJars := kafkatest.JarDir(t)
	go func() { defer close(compiled); cp, cpErr = streamsClassPath(kafkaJars) }()
	bin, primary, standby := startPair(t, "streams-primary", "streams-standby")
	<-compiled
	if cpErr != nil {
		t.Fatalf("building StreamsApp: %v", cpErr)
	}
	// Streams purges its repartition topics with DeleteRecords, which
	// Ferry's policy refuses unless allowed.
	f := startFerryWith(t, bin, primary, standby, nil, "policy: {allow: [records_delete]}\n")
	t.Logf("clusters, ferry, StreamsApp compiled: %v", time.Since(begin).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sfx := randomSuffix()
	app := "ferry-streams-" + sfx
	input, output := "streams-in-"+sfx, "streams-out-"+sfx
	repartition, changelog := app+"-rekey-repartition", app+"-counts-changelog"
	clusters := map[string]*kafkatest.Cluster{"primary": primary, "standby": standby}

	createStreamsTopics(ctx, t, f.addr, input, output)
	prod := newStreamsProducer(t, f.addr, input)
	defer prod.stop(t)
	apps := []*streamsApp{startStreamsApp(ctx, t, cp, f.addr, app, input, output, protocol)}
	defer func() {
		if t.Failed() {
			for i, a := range apps {
				a.mu.Lock()
				t.Logf("StreamsApp %d: states %v, uncaught %q, stderr:\n%s", i, a.states, a.uncaught, tail(a.stderr.String(), 4000))
				keepLog(t, fmt.Sprintf("streams-app-%d.stderr", i), a.stderr.String())
				a.mu.Unlock()
			}
		}
	}()
	apps[0].waitState(t, "RUNNING", 90*time.Second)
	t.Logf("StreamsApp running: %v", time.Since(begin).Round(time.Millisecond))

	active := "primary"
	// progress waits until the application has written streamsProgress
	// more output records on the active cluster than when asked.
	outputs := func() int {
		return len(readCommitted(t, ctx, clusters[active], []string{output})[output])
	}
	progress := func(what string) {
		t.Helper()
		start := time.Now()
		want := outputs() + streamsProgress
		testwait.Eventually(t, 90*time.Second, what, func() error {
			if n := outputs(); n < want {
				time.Sleep(400 * time.Millisecond) // each poll reads the topic afresh
				return fmt.Errorf("%d output records on %s, want %d; app states %v", n, active, want, apps[len(apps)-1].stateList())
			}
			return nil
		})
		t.Logf("%s: %v", what, time.Since(start).Round(time.Millisecond))
	}
	// caughtUp waits until the application has counted every input
	// record: each key's highest count on the active cluster reached its
	// number of input records (checkStreamsCounts says whether each was
	// counted once).
	caughtUp := func(what string) {
		t.Helper()
		start := time.Now()
		testwait.Eventually(t, 90*time.Second, what, func() error {
			got := readCommitted(t, ctx, clusters[active], []string{input, output})
			short := streamsShort(got[input], got[output])
			if len(short) > 0 {
				time.Sleep(400 * time.Millisecond)
				return fmt.Errorf("keys counted short of their input on %s (key: counted/input): %v", active, short)
			}
			return nil
		})
		t.Logf("%s: %v", what, time.Since(start).Round(time.Millisecond))
	}

	prod.start()
	progress("processing through Ferry")
	for i, to := range []string{"standby", "primary"} {
		start := time.Now()
		d := f.switchover(t, ctx, to, uint32(i+1))
		active = to
		t.Logf("planned switch to %s: %s by Ferry's account, %v answered", to, d, time.Since(start).Round(time.Millisecond))
		progress("processing after the planned switch to " + to)
	}
	if protocol == "streams" {
		// Switching back, the primary still had the application's
		// member from before the first switch (the brokers' streams
		// session is 20 s here): the switch removed it, so that the
		// group took the offsets copied to it.
		b, _ := os.ReadFile(f.log)
		if !bytes.Contains(b, []byte("removed stale members from a group on the standby before copying its offsets")) {
			t.Errorf("the switch back did not remove the streams group's member left on the primary (ferry log %s)", f.log)
		}
	}

	// The forced switch: once the input stopped, the application counted
	// all of it, the mirror copied everything and the group's offsets were
	// synced to the standby. Nothing may be lost then.
	prod.stop(t)
	caughtUp("every input record counted before the forced switch")
	f.waitMirrorCaughtUp(t, 60*time.Second)
	waitGroupSynced(t, ctx, app, primary, standby)
	a, code, body := f.askSwitchMode(ctx, "standby", "forced", time.Minute)
	if code != http.StatusOK || a.Generation != 3 || a.Active != "standby" || a.LastSwitch == nil || a.LastSwitch.Outcome != "switched" {
		t.Fatalf("forced switch to standby: %d %s", code, body)
	}
	for _, l := range a.LastSwitch.Lost {
		if l.To != l.From {
			t.Errorf("forced switch after the mirror caught up reported lost %s[%d] [%d, %d)", l.Topic, l.Partition, l.From, l.To)
		}
	}
	active = "standby"
	t.Logf("forced switch to standby: %s", a.LastSwitch.Duration)
	prod.start()
	progress("processing after the forced switch")

	// A new instance with an empty state directory rebuilds its store
	// from the changelog on the standby, where the mirror wrote most of
	// it, and counts on from there.
	apps[0].stop(t)
	apps = append(apps, startStreamsApp(ctx, t, cp, f.addr, app, input, output, protocol))
	apps[1].waitState(t, "RUNNING", 90*time.Second)
	progress("processing after a restart with an empty state directory")
	prod.stop(t)
	caughtUp("every input record counted")
	apps[1].stop(t)
	for i, a := range apps {
		a.mu.Lock()
		t.Logf("StreamsApp %d: states %v, uncaught exceptions %d %q", i, a.states, len(a.uncaught), a.uncaught)
		if slices.Contains(a.states, "ERROR") {
			t.Errorf("StreamsApp %d states %v: went to ERROR", i, a.states)
		}
		a.mu.Unlock()
	}

	f.waitMirrorCaughtUp(t, 60*time.Second)
	acked, perr := prod.result()
	if perr != nil {
		t.Errorf("input producer through Ferry: %v", perr)
	}
	t.Logf("%d input records acknowledged", len(acked))
	for _, name := range []string{"standby", "primary"} {
		c := clusters[name]
		got := readCommitted(t, ctx, c, []string{input, output, changelog})
		checkStreamsCounts(t, name, acked, got[input], got[output], got[changelog])
	}
	waitGroupSynced(t, ctx, app, standby, primary)
	// Streams purges the repartition topic (DeleteRecords through Ferry
	// on the active cluster) as it commits; the mirror raises the other
	// cluster's log start to the same offset.
	testwait.Eventually(t, 30*time.Second, "the repartition topic's log start the same on both clusters", func() error {
		starts, ends := map[string]kadm.ListedOffsets{}, map[string]kadm.ListedOffsets{}
		for name, c := range clusters {
			adm := admin(t, c)
			s, err := adm.ListStartOffsets(ctx, repartition)
			if err == nil {
				err = s.Error()
			}
			e, eerr := adm.ListEndOffsets(ctx, repartition)
			if err == nil {
				err = cmp.Or(eerr, e.Error())
			}
			if err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			starts[name], ends[name] = s, e
		}
		var diff []string
		used := 0 // partitions any key went to
		starts["standby"].Each(func(s kadm.ListedOffset) {
			p, _ := starts["primary"].Lookup(s.Topic, s.Partition)
			e, _ := ends["standby"].Lookup(s.Topic, s.Partition)
			if e.Offset > 0 {
				used++
			}
			if s.Offset != p.Offset || e.Offset > 0 && s.Offset <= 0 {
				diff = append(diff, fmt.Sprintf("%d: standby %d, primary %d (end %d)", s.Partition, s.Offset, p.Offset, e.Offset))
			}
		})
		if len(diff) > 0 || used == 0 {
			return fmt.Errorf("repartition log starts differ or were never raised: %v", diff)
		}
		t.Logf("repartition log starts: %v, ends %v", byPartition(starts["standby"]), byPartition(ends["standby"]))
		return nil
	})
	t.Logf("total %v", time.Since(begin).Round(time.Millisecond))
}

func byPartition(l kadm.ListedOffsets) map[int32]int64 {
	m := map[int32]int64{}
	l.Each(func(o kadm.ListedOffset) { m[o.Partition] = o.Offset })
	return m
}

// waitGroupSynced waits until the group's committed offsets on to equal
// those on from, both read directly: the mirror's group sync copies them
// once no member of the group is left on to.
func waitGroupSynced(t *testing.T, ctx context.Context, group string, from, to *kafkatest.Cluster) {
	t.Helper()
	testwait.Eventually(t, 60*time.Second, "group "+group+"'s offsets synced", func() error {
		src, err := admin(t, from).FetchOffsets(ctx, group)
		if err != nil {
			return err
		}
		dst, err := admin(t, to).FetchOffsets(ctx, group)
		if err != nil {
			return err
		}
		if len(src) == 0 {
			return fmt.Errorf("no offsets committed on %s", from.Bootstrap())
		}
		var diff []string
		src.Each(func(o kadm.OffsetResponse) {
			d, ok := dst.Lookup(o.Topic, o.Partition)
			if !ok || d.At != o.At {
				diff = append(diff, fmt.Sprintf("%s[%d] %d vs %d", o.Topic, o.Partition, o.At, d.At))
			}
		})
		if len(diff) > 0 {
			return fmt.Errorf("offsets differ: %v", diff)
		}
		return nil
	})
}

// createStreamsTopics creates the application's input and output topics
// through Ferry at addr.
func createStreamsTopics(ctx context.Context, t *testing.T, addr string, topics ...string) {
	t.Helper()
	viaFerry, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer viaFerry.Close()
	for _, tp := range topics {
		createReadyTopic(ctx, t, kadm.NewClient(viaFerry), tp, streamsPartitions, 1)
	}
}

// checkStreamsCounts checks what the cluster holds, read read_committed:
// every acknowledged input record once at its offset; for each key, output
// counts 1…n in offset order naming each of the key's n input records once;
// the changelog's last value per key its final count.
func checkStreamsCounts(t *testing.T, cluster string, acked map[int]partOff, in, out, changelog map[partOff]string) {
	t.Helper()
	keyOf := map[int]string{} // input record number → its key
	perKey := map[string]int{}
	for at, v := range in {
		k, n, err := streamsValue(v)
		if err != nil {
			t.Errorf("%s: input at %v: %v", cluster, at, err)
			continue
		}
		if _, dup := keyOf[n]; dup {
			t.Errorf("%s: input record %d twice", cluster, n)
		}
		keyOf[n] = k
		perKey[k]++
	}
	for n, at := range acked {
		if v, ok := in[at]; !ok || v != streamsInput(n) {
			t.Errorf("%s: acknowledged input record %d at %v, there: %q", cluster, n, at, v)
		}
	}

	type update struct {
		at    partOff
		count int
		n     int
	}
	updates := map[string][]update{}
	for at, v := range out {
		c, n, err := streamsOutput(v)
		if err != nil {
			t.Errorf("%s: output at %v: %v", cluster, at, err)
			continue
		}
		k, ok := keyOf[n]
		if !ok {
			t.Errorf("%s: output at %v counts record %d, not in the input", cluster, at, n)
			continue
		}
		updates[k] = append(updates[k], update{at, c, n})
	}
	bad := 0
	for k, want := range perKey {
		us := updates[k]
		sort.Slice(us, func(i, j int) bool {
			if us[i].at.p != us[j].at.p {
				return us[i].at.p < us[j].at.p
			}
			return us[i].at.o < us[j].at.o
		})
		seen := map[int]bool{}
		for i, u := range us {
			if u.count != i+1 || seen[u.n] {
				if bad++; bad <= 10 {
					t.Errorf("%s: key %s output %d at %v is count %d of record %d (seen before: %v), want count %d",
						cluster, k, i, u.at, u.count, u.n, seen[u.n], i+1)
				}
			}
			seen[u.n] = true
		}
		if len(us) != want {
			t.Errorf("%s: key %s has %d output records (the last: %s), %d input records", cluster, k, len(us), lastOf(us), want)
		}
	}
	if bad > 10 {
		t.Errorf("%s: %d output records out of sequence in all", cluster, bad)
	}

	last := map[string]partOff{}
	final := map[string]int{}
	for at, v := range changelog {
		c, n, err := streamsOutput(v)
		if err != nil {
			t.Errorf("%s: changelog at %v: %v", cluster, at, err)
			continue
		}
		k := keyOf[n]
		if l, ok := last[k]; !ok || at.o > l.o {
			last[k], final[k] = at, c
		}
	}
	for k, want := range perKey {
		if final[k] != want {
			t.Errorf("%s: changelog's last count of key %s is %d, want %d", cluster, k, final[k], want)
		}
	}
	t.Logf("%s: %d input records over %d keys, %d output records, %d changelog records", cluster, len(in), len(perKey), len(out), len(changelog))
}

// streamsShort returns the keys whose highest count in out is below their
// number of input records in in, with both.
func streamsShort(in, out map[partOff]string) map[string]string {
	keyOf := map[int]string{}
	want := map[string]int{}
	for _, v := range in {
		if k, n, err := streamsValue(v); err == nil {
			keyOf[n] = k
			want[k]++
		}
	}
	got := map[string]int{}
	for _, v := range out {
		if c, n, err := streamsOutput(v); err == nil {
			k := keyOf[n]
			got[k] = max(got[k], c)
		}
	}
	short := map[string]string{}
	for k, w := range want {
		if got[k] < w {
			short[k] = fmt.Sprintf("%d/%d", got[k], w)
		}
	}
	return short
}

func lastOf[T any](us []T) string {
	if len(us) == 0 {
		return "none"
	}
	return fmt.Sprintf("%+v", us[len(us)-1])
}

// streamsInput is input record n's value: its key and its number.
func streamsInput(n int) string { return fmt.Sprintf("k-%d %d", n%streamsKeys, n) }

func streamsValue(v string) (key string, n int, err error) {
	k, num, ok := strings.Cut(v, " ")
	if !ok {
		return "", 0, fmt.Errorf("value %q", v)
	}
	n, err = strconv.Atoi(num)
	return k, n, err
}

// streamsOutput parses an output or changelog value "COUNT NUMBER".
func streamsOutput(v string) (count, n int, err error) {
	c, num, ok := strings.Cut(v, " ")
	if !ok {
		return 0, 0, fmt.Errorf("value %q", v)
	}
	if count, err = strconv.Atoi(c); err == nil {
		n, err = strconv.Atoi(num)
	}
	return count, n, err
}

// streamsProducer writes input records through Ferry at a steady pace,
// idempotent, record n keyed by its number (so a key's records spread over
// the partitions and only the repartition topic brings them together).
type streamsProducer struct {
	cl    *kgo.Client
	topic string

	mu    sync.Mutex
	next  int
	acked map[int]partOff
	err   error
	quit  chan struct{}
	done  chan struct{}
}

func newStreamsProducer(t *testing.T, addr, topic string) *streamsProducer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic),
		kgo.RecordDeliveryTimeout(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &streamsProducer{cl: cl, topic: topic, acked: map[int]partOff{}}
}

func (p *streamsProducer) start() {
	p.quit, p.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.done)
		tick := time.NewTicker(streamsTick)
		defer tick.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
			for range streamsBatch {
				p.mu.Lock()
				n := p.next
				p.next++
				p.mu.Unlock()
				r := &kgo.Record{Key: []byte("r-" + strconv.Itoa(n)), Value: []byte(streamsInput(n))}
				p.cl.Produce(context.Background(), r, func(r *kgo.Record, err error) {
					p.mu.Lock()
					defer p.mu.Unlock()
					if err != nil {
						if p.err == nil {
							p.err = fmt.Errorf("record %d: %w", n, err)
						}
						return
					}
					p.acked[n] = partOff{r.Partition, r.Offset}
				})
			}
		}
	}()
}

// stop ends the production and waits for every record to be answered.
func (p *streamsProducer) stop(t *testing.T) {
	t.Helper()
	if p.quit == nil {
		return
	}
	close(p.quit)
	<-p.done
	p.quit = nil
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.cl.Flush(ctx); err != nil {
		t.Errorf("flushing the input producer: %v", err)
	}
}

func (p *streamsProducer) result() (map[int]partOff, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acked, p.err
}

// streamsApp is one StreamsApp process.
type streamsApp struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu       sync.Mutex
	states   []string
	uncaught []string
	other    []string // lines that are neither
	stderr   bytes.Buffer
	exited   chan struct{}
	err      error
}

func startStreamsApp(ctx context.Context, t *testing.T, cp, bootstrap, appID, input, output, protocol string) *streamsApp {
	t.Helper()
	// JavaCmd's class path is Kafka's; the java launcher takes the last
	// -cp given, so this one, followed by the main class, replaces it.
	a := &streamsApp{exited: make(chan struct{})}
	// Made before the command, so that it is removed after the process
	// is killed (cleanups run last first).
	stateDir := t.TempDir()
	a.cmd = kafkatest.JavaCmd(ctx, t, "-cp", cp, "StreamsApp", bootstrap, appID, input, output, stateDir, protocol)
	stdout, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if a.stdin, err = a.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	a.cmd.Stderr = &lockedWriter{mu: &a.mu, w: &a.stderr}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("StreamsApp: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var e struct {
				State    string `json:"state"`
				Uncaught string `json:"uncaught"`
			}
			err := json.Unmarshal(sc.Bytes(), &e)
			a.mu.Lock()
			switch {
			case err == nil && e.State != "":
				a.states = append(a.states, e.State)
			case err == nil && e.Uncaught != "":
				a.uncaught = append(a.uncaught, e.Uncaught)
			default:
				a.other = append(a.other, sc.Text())
			}
			a.mu.Unlock()
		}
		err := a.cmd.Wait()
		a.mu.Lock()
		a.err = err
		a.mu.Unlock()
		close(a.exited)
	}()
	return a
}

func (a *streamsApp) stateList() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.states...)
}

// waitState waits until the application's last state is state.
func (a *streamsApp) waitState(t *testing.T, state string, timeout time.Duration) {
	t.Helper()
	testwait.Eventually(t, timeout, "StreamsApp "+state, func() error {
		select {
		case <-a.exited:
			t.Fatalf("StreamsApp exited (%v), states %v", a.err, a.stateList())
		default:
		}
		if s := a.stateList(); len(s) == 0 || s[len(s)-1] != state {
			return fmt.Errorf("states %v", s)
		}
		return nil
	})
}

// stop ends the application's input, which closes it, and wants it to
// exit 0 within a minute.
func (a *streamsApp) stop(t *testing.T) {
	t.Helper()
	a.stdin.Close()
	select {
	case <-a.exited:
	case <-time.After(time.Minute):
		t.Fatalf("StreamsApp did not exit a minute after its input closed; states %v", a.stateList())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		t.Errorf("StreamsApp exited: %v", a.err)
	}
}

var streamsBuild struct {
	once sync.Once
	cp   string
	err  error
}

// streamsClassPath resolves the Kafka Streams jars into <cache>/streams-
// <version> (conformance/maven-streams/pom.xml), compiles StreamsApp.java
// against them and Kafka's jars into a directory named by a hash of the
// source and the pom, once per process, and returns the program's class
// path: its classes, the Streams jars, Kafka's jars.
func streamsClassPath(kafkaJars string) (string, error) {
	streamsBuild.once.Do(func() { streamsBuild.cp, streamsBuild.err = buildStreamsApp(kafkaJars) })
	return streamsBuild.cp, streamsBuild.err
}

func buildStreamsApp(kafkaJars string) (string, error) {
	root, err := kafkatest.RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := kafkatest.CacheDir()
	if err != nil {
		return "", err
	}
	pom := filepath.Join(root, "conformance", "maven-streams", "pom.xml")
	jars := filepath.Join(cache, "streams-"+streamsVersion)
	if err := kafkatest.ResolveJars(pom, jars, "Kafka Streams", streamsVersion, "kafka-streams-"+streamsVersion+".jar"); err != nil {
		return "", err
	}
	libs := jars + "/*:" + kafkaJars + "/*"
	src := filepath.Join(root, "conformance", "clients", "streams", "StreamsApp.java")
	text, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	pomText, err := os.ReadFile(pom)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(append(append(text, pomText...), kafkatest.Version()...))
	parent := filepath.Join(cache, "clients")
	dir := filepath.Join(parent, "streams-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dir, "StreamsApp.class")); err == nil {
		return dir + ":" + libs, nil
	}
	javac, err := exec.LookPath("javac")
	if err != nil {
		return "", fmt.Errorf("%w; %s", err, installHint)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(parent, ".streams-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if out, err := exec.Command(javac, "-encoding", "UTF-8", "-cp", libs, "-d", tmp, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("javac: %v\n%s", err, out)
	}
	// Test binaries compiling at once: the first rename wins.
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "StreamsApp.class")); statErr != nil {
			return "", err
		}
	}
	return dir + ":" + libs, nil
}
