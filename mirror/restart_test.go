package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// In-process clusters (kfake) for the tests that need no real broker.

func fakeCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func fakeClient(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// runFakeMirror runs a Mirror from a to b until the test ends (or the
// returned stop is called).
func runFakeMirror(t *testing.T, a, b *kfake.Cluster, reg prometheus.Registerer, opts ...Option) (*Mirror, func()) {
	t.Helper()
	base := []Option{Source(a.ListenAddrs()...), Target(b.ListenAddrs()...), SyncInterval(200 * time.Millisecond),
		FetchMaxWait(100 * time.Millisecond), Logger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))), Registerer(reg)}
	m, err := New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = m.Run(context.Background())
	}()
	stop := func() {
		m.Close()
		<-done
	}
	t.Cleanup(stop)
	return m, stop
}

func produceFake(t *testing.T, cl *kgo.Client, topic string, partition int32, values ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: partition, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %s to %s[%d]: %v", v, topic, partition, err)
		}
	}
}

// fakeRecords reads a partition of c from its start up to its end, as
// "offset=value" (read_committed: fillers and aborted records aside, so
// the real records at their offsets).
func fakeRecords(t *testing.T, c *kfake.Cluster, topic string, partition int32) []string {
	t.Helper()
	end := fakeEnd(t, c, topic, partition)
	cl := fakeClient(t, c, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	for next := int64(0); next < end; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s[%d]: read up to %d of %d: %v", topic, partition, next, end, out)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !bytesHasFillerKey(r.Key) {
				out = append(out, fmt.Sprintf("%d=%s", r.Offset, r.Value))
			}
			next = r.Offset + 1
		})
		if next < end && fs.NumRecords() == 0 {
			// Only markers and aborted records left.
			if e := fakeEnd(t, c, topic, partition); e == end {
				lso := fakeStable(t, c, topic, partition)
				if lso >= end {
					break
				}
			}
		}
	}
	return out
}

func bytesHasFillerKey(k []byte) bool { return string(k) == "\x00ferry.filler" }

// fakeEnd is a partition's end offset on c, -1 when the partition is not
// there (yet).
func fakeEnd(t *testing.T, c *kfake.Cluster, topic string, partition int32) int64 {
	t.Helper()
	ends, err := kadm.NewClient(fakeClient(t, c)).ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := ends.Lookup(topic, partition)
	if !ok || o.Err != nil {
		return -1
	}
	return o.Offset
}

func fakeStable(t *testing.T, c *kfake.Cluster, topic string, partition int32) int64 {
	t.Helper()
	ends, err := kadm.NewClient(fakeClient(t, c)).ListCommittedOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	o, _ := ends.Lookup(topic, partition)
	return o.Offset
}

func partitionStatus(m *Mirror, topic string, partition int32) (PartitionStatus, bool) {
	for _, st := range m.Status() {
		if st.Topic == topic && st.Partition == partition {
			return st, true
		}
	}
	return PartitionStatus{}, false
}

// TestRestartHalted: a partition halted by a diverged standby stays halted
// and appends nothing; Restart replaces its writer with a new one, which
// runs the start-up checks again and halts again with the same reason while
// the cause is there; once the standby topic is deleted (and recreated by
// the sync loop) a restart copies the partition from offset 0 at the
// source's offsets. Partitions that are not halted, not known, or written
// by another member are refused with the matching error.
func TestRestartHalted(t *testing.T) {
	a, b := fakeCluster(t), fakeCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const topic = "restart"
	acl, bcl := fakeClient(t, a), fakeClient(t, b)
	if _, err := kadm.NewClient(acl).CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	produceFake(t, acl, topic, 0, numbered("a", 0, 10)...)
	// Partition 1 is another member's: this member never writes it.
	own := newSwitchboard(func(_ string, p int32) int { return int(p) }, 0).member(0)
	_, stop := runFakeMirror(t, a, b, nil, Topics([]string{topic}, nil), WithOwnership(own))
	standbyEndReaches(t, b, topic, 0, 10, "partition 0 mirrored")
	stop()

	// Something writes to the standby directly: it and the source now
	// differ at offset 10.
	produceFake(t, bcl, topic, 0, "intruder")
	produceFake(t, acl, topic, 0, "a10")
	reg := prometheus.NewRegistry()
	m, _ := runFakeMirror(t, a, b, reg, Topics([]string{topic}, nil), WithOwnership(own))
	halted := func(what string) PartitionStatus {
		t.Helper()
		var st PartitionStatus
		testwait.Eventually(t, 30*time.Second, what, func() error {
			var ok bool
			if st, ok = partitionStatus(m, topic, 0); !ok || st.State != StateHalted {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
		if !errors.Is(st.Err, ErrDiverged) {
			t.Fatalf("%s: halted with %v, want ErrDiverged", what, st.Err)
		}
		return st
	}
	halted("halted on the diverged tail")

	// While halted, nothing is appended however much the source gets.
	produceFake(t, acl, topic, 0, "a11", "a12", "a13")
	time.Sleep(time.Second)
	if e := fakeEnd(t, b, topic, 0); e != 11 {
		t.Fatalf("the standby moved to %d while the partition was halted, want 11", e)
	}

	// Refusals.
	if _, err := m.Restart(topic, 1); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("Restart of another member's partition: %v, want ErrNotOwned", err)
	}
	if _, err := m.Restart(topic, 7); !errors.Is(err, ErrUnknownPartition) {
		t.Fatalf("Restart of a partition that does not exist: %v, want ErrUnknownPartition", err)
	}
	if _, err := m.Restart("nope", 0); !errors.Is(err, ErrUnknownPartition) {
		t.Fatalf("Restart of a topic not mirrored: %v, want ErrUnknownPartition", err)
	}

	// A restart with the cause still there: a new writer, the same halt.
	was, err := m.Restart(topic, 0)
	if err != nil || !errors.Is(was.Err, ErrDiverged) {
		t.Fatalf("Restart: %v (was %+v)", err, was)
	}
	if st, _ := partitionStatus(m, topic, 0); st.State == StateHalted {
		t.Fatalf("just after Restart the partition still shows the old halt: %+v", st)
	}
	halted("halted again after the restart")
	if n := metricValue(t, reg, "ferry_mirror_halts_total", "reason", "diverged"); n != 2 {
		t.Fatalf("ferry_mirror_halts_total{reason=diverged} = %v, want 2 (the first halt and the one after the restart)", n)
	}
	if n := metricValue(t, reg, "ferry_mirror_partition_halted", "topic", topic, "partition", "0", "reason", "diverged"); n != 1 {
		t.Fatalf("ferry_mirror_partition_halted = %v, want 1", n)
	}
	if e := fakeEnd(t, b, topic, 0); e != 11 {
		t.Fatalf("the restarted writer appended: standby end %d, want 11", e)
	}

	// The repair: the standby topic deleted while halted; the sync loop
	// creates it again, empty.
	if _, err := kadm.NewClient(bcl).DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, "the standby topic created again by the sync loop", func() error {
		td, err := kadm.NewClient(fakeClient(t, b)).ListTopics(ctx, topic)
		if err != nil || !td.Has(topic) || td[topic].Err != nil || len(td[topic].Partitions) != 2 {
			return fmt.Errorf("topics %v %v", td, err)
		}
		return nil
	})
	if st, _ := partitionStatus(m, topic, 0); st.State != StateHalted {
		t.Fatalf("the partition left its halt without a restart: %+v", st)
	}
	if e := fakeEnd(t, b, topic, 0); e != 0 {
		t.Fatalf("the recreated standby topic has end %d before the restart, want 0", e)
	}
	if _, err := m.Restart(topic, 0); err != nil {
		t.Fatal(err)
	}
	want := []string{}
	for i := range 14 {
		want = append(want, fmt.Sprintf("%d=a%d", i, i))
	}
	testwait.Eventually(t, 30*time.Second, "the restarted writer copying from 0", func() error {
		st, _ := partitionStatus(m, topic, 0)
		if st.State != StateCaughtUp || st.Mirrored != 14 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	if got := fakeRecords(t, b, topic, 0); !slices.Equal(got, want) {
		t.Fatalf("the standby holds %v, want the source's %v", got, want)
	}
	if n := metricValue(t, reg, "ferry_mirror_partition_halted", "topic", topic, "partition", "0"); n != 0 {
		t.Fatalf("ferry_mirror_partition_halted still %v after the repair", n)
	}
	// Running: not halted, refused.
	if _, err := m.Restart(topic, 0); !errors.Is(err, ErrNotHalted) {
		t.Fatalf("Restart of a running partition: %v, want ErrNotHalted", err)
	}
}

// TestHaltOnRequest: Halt stops a partition's writer as a fault would —
// nothing reaches the standby from it afterwards while the others go on —
// keeps the reason of a partition already halted, refuses what is not
// mirrored, and Restart gives the partition a writer again, which copies
// what the source got meanwhile at its offsets.
func TestHaltOnRequest(t *testing.T) {
	a, b := fakeCluster(t), fakeCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const topic = "halt"
	acl := fakeClient(t, a)
	if _, err := kadm.NewClient(acl).CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	produceFake(t, acl, topic, 0, "a0", "a1", "a2")
	reg := prometheus.NewRegistry()
	m, _ := runFakeMirror(t, a, b, reg, Topics([]string{topic}, nil))
	standbyEndReaches(t, b, topic, 0, 3, "partition 0 mirrored")
	was, err := m.Halt(topic, 0)
	if err != nil || was.State == StateHalted {
		t.Fatalf("Halt: %v (was %v)", err, was.State)
	}
	st := statusOf(t, m, topic, 0)
	if st.State != StateHalted || !errors.Is(st.Err, ErrHaltedOnRequest) || HaltReason(st.Err) != "requested" {
		t.Fatalf("after Halt: %v %v", st.State, st.Err)
	}
	// Partition 1 is copied, partition 0 not.
	produceFake(t, acl, topic, 0, "a3", "a4")
	produceFake(t, acl, topic, 1, "b0")
	standbyEndReaches(t, b, topic, 1, 1, "partition 1 mirrored")
	if e := fakeEnd(t, b, topic, 0); e != 3 {
		t.Fatalf("the halted partition's standby end moved from 3 to %d", e)
	}
	if was, err := m.Halt(topic, 0); err != nil || was.State != StateHalted || HaltReason(was.Err) != "requested" {
		t.Fatalf("Halt of a halted partition: %v, was %v %v", err, was.State, was.Err)
	}
	if _, err := m.Halt(topic, 9); !errors.Is(err, ErrUnknownPartition) {
		t.Fatalf("Halt of a partition not mirrored: %v, want ErrUnknownPartition", err)
	}
	if _, err := m.Restart(topic, 0); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	standbyEndReaches(t, b, topic, 0, 5, "partition 0 mirrored again")
}

// standbyEndReaches waits until the standby's end of topic's partition is
// end: the mirror copied that far.
func standbyEndReaches(t *testing.T, b *kfake.Cluster, topic string, partition int32, end int64, what string) {
	t.Helper()
	testwait.Eventually(t, 30*time.Second, what, func() error {
		if e := fakeEnd(t, b, topic, partition); e != end {
			return fmt.Errorf("standby end %d", e)
		}
		return nil
	})
}

// numbered is prefix followed by from, from+1, ... (n values).
func numbered(prefix string, from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, from+i)
	}
	return out
}

// statusOf is the status of one partition's writer in m.
func statusOf(t *testing.T, m *Mirror, topic string, partition int32) PartitionStatus {
	t.Helper()
	for _, st := range m.Status() {
		if st.Topic == topic && st.Partition == partition {
			return st
		}
	}
	t.Fatalf("no writer for %s[%d]", topic, partition)
	return PartitionStatus{}
}

// TestHaltSaysWhereTheStandbyParts: a writer that finds the standby's
// tail different from the source looks for where the two logs part and
// reports it as its mirrored offset (what a forced switch then counts as
// lost from), not the standby's end and not nothing.
func TestHaltSaysWhereTheStandbyParts(t *testing.T) {
	a, b := fakeCluster(t), fakeCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic = "parts"
	acl, bcl := fakeClient(t, a), fakeClient(t, b)
	if _, err := kadm.NewClient(acl).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	produceFake(t, acl, topic, 0, numbered("a", 0, 37)...)
	_, stop := runFakeMirror(t, a, b, nil, Topics([]string{topic}, nil))
	standbyEndReaches(t, b, topic, 0, 37, "mirrored")
	stop()

	// Three batches written to the standby directly, five more to the
	// source: they part at 37, and the standby ends at 40.
	produceFake(t, bcl, topic, 0, "x37", "x38", "x39")
	produceFake(t, acl, topic, 0, numbered("a", 37, 5)...)
	m, _ := runFakeMirror(t, a, b, nil, Topics([]string{topic}, nil))
	var st PartitionStatus
	testwait.Eventually(t, 30*time.Second, "halted", func() error {
		var ok bool
		if st, ok = partitionStatus(m, topic, 0); !ok || st.State != StateHalted {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	if !errors.Is(st.Err, ErrDiverged) || !Parted(st.Err) {
		t.Fatalf("halted with %v, want ErrDiverged", st.Err)
	}
	if st.Mirrored != 37 {
		t.Fatalf("halted with mirrored offset %d, want 37 (where the standby parts from the source): %v", st.Mirrored, st.Err)
	}
	if !strings.Contains(st.Err.Error(), "below 37") {
		t.Fatalf("the halt does not say where the logs part: %v", st.Err)
	}
}

// TestStandbyEndsShared: writers starting together read the standby's high
// watermarks in one ListOffsets per broker (m.dstEnds), each getting its own
// partition's end; a partition the standby does not have is an error for
// its writer alone. The first reading is held at the broker while 200 more
// are asked: they go out in one request, not 200.
func TestStandbyEndsShared(t *testing.T) {
	a, b := fakeCluster(t), fakeCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topics, parts = 20, 10
	bcl := fakeClient(t, b)
	for i := range topics {
		topic := fmt.Sprintf("ends-%02d", i)
		if _, err := kadm.NewClient(bcl).CreateTopic(ctx, parts, 1, nil, topic); err != nil {
			t.Fatal(err)
		}
		for p := range int32(parts) {
			// Partition p of topic i holds (i+p)%4 records.
			for r := range (i + int(p)) % 4 {
				produceFake(t, bcl, topic, p, fmt.Sprint(r))
			}
		}
	}
	m, _ := runFakeMirror(t, a, b, nil, Topics([]string{"none"}, nil))

	requests, held, release := holdFirst(b, kmsg.ListOffsets)
	first := make(chan error, 1)
	go func() {
		_, err := m.endOf(ctx, m.dstEnds, "ends-00", 0)
		first <- err
	}()
	<-held
	var wg sync.WaitGroup
	errs := make(chan error, topics*parts+1)
	for i := range topics {
		for p := range int32(parts) {
			topic := fmt.Sprintf("ends-%02d", i)
			wg.Go(func() {
				hw, err := m.endOf(ctx, m.dstEnds, topic, p)
				if want := int64((i + int(p)) % 4); err != nil || hw != want {
					errs <- fmt.Errorf("%s[%d]: end %d, %v; want %d", topic, p, hw, err, want)
				}
			})
		}
	}
	wg.Go(func() {
		if _, err := m.endOf(ctx, m.dstEnds, "ends-00", parts); !errors.Is(err, kerr.UnknownTopicOrPartition) {
			errs <- fmt.Errorf("a partition the standby lacks: %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
		}
	})
	// Every reading queued behind the held one before it is answered.
	testwait.Eventually(t, 10*time.Second, "201 readings queued", func() error {
		if n := m.dstEnds.queued(); n != topics*parts+1 {
			return fmt.Errorf("%d queued", n)
		}
		return nil
	})
	releaseAll(t, release, &wg, errs)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("%d ListOffsets requests at the standby for %d readings, want 2 (the held one, then one for the rest)", n, topics*parts+2)
	}
}

// TestSourceEpochEndsShared: the writers' leader epoch checks (checkEpoch)
// share one OffsetForLeaderEpoch per source leader (m.srcEpochs), and each
// writer judges its own partition by its answer: a standby that holds no
// more than the source's epoch ends there passes, one that holds an offset
// more halts with ErrSourceTruncated.
func TestSourceEpochEndsShared(t *testing.T) {
	a, b := fakeCluster(t), fakeCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const parts = 40
	acl := fakeClient(t, a)
	if _, err := kadm.NewClient(acl).CreateTopic(ctx, parts, 1, nil, "epochs"); err != nil {
		t.Fatal(err)
	}
	for p := range int32(parts) {
		for r := range int(p) % 3 {
			produceFake(t, acl, "epochs", p, fmt.Sprint(r))
		}
	}
	m, _ := runFakeMirror(t, a, b, nil, Topics([]string{"none"}, nil))
	// The first request is held at the broker until every other check
	// is queued behind it.
	requests, held, release := holdFirst(a, kmsg.OffsetForLeaderEpoch)
	var wg sync.WaitGroup
	errs := make(chan error, parts)
	checks := 0
	for p := range int32(parts) {
		end := int64(p % 3)
		if end == 0 {
			continue // nothing mirrored: nothing to check
		}
		// Odd partitions: the standby one offset past the source.
		next := end + int64(p%2)
		w := &writer{m: m, topic: "epochs", partition: p, epoch: 0, next: next}
		wg.Go(func() {
			err := w.checkEpoch(ctx)
			switch {
			case p%2 == 0 && err != nil:
				errs <- fmt.Errorf("partition %d (standby at the source's end %d): %v", p, end, err)
			case p%2 == 1 && !errors.Is(err, ErrSourceTruncated):
				errs <- fmt.Errorf("partition %d (standby at %d, source epoch 0 ends at %d): %v, want ErrSourceTruncated", p, next, end, err)
			}
		})
		if checks++; checks == 1 {
			<-held
		}
	}
	testwait.Eventually(t, 10*time.Second, "every other check queued", func() error {
		if n := m.srcEpochs.queued(); n != checks-1 {
			return fmt.Errorf("%d of %d queued", n, checks-1)
		}
		return nil
	})
	releaseAll(t, release, &wg, errs)
	if n := requests.Load(); n != 2 {
		t.Errorf("%d OffsetForLeaderEpoch requests for %d partitions' checks, want 2 (the held one, then one for the rest)", n, checks)
	}
}

// holdFirst counts c's requests of key and holds the first at the broker
// until release is closed; held is closed when it arrives.
func holdFirst(c *kfake.Cluster, key kmsg.Key) (requests *atomic.Int32, held, release chan struct{}) {
	requests = new(atomic.Int32)
	held, release = make(chan struct{}), make(chan struct{})
	c.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if requests.Add(1) == 1 {
			close(held)
			<-release
		}
		return nil, nil, false
	})
	return requests, held, release
}

// releaseAll lets the held request go, waits for the asks of wg and
// reports what they sent to errs.
func releaseAll(t *testing.T, release chan struct{}, wg *sync.WaitGroup, errs chan error) {
	t.Helper()
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
