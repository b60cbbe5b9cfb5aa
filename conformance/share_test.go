package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// shareEvent is one line of the Java client's share-consume mode.
type shareEvent struct {
	Ev            string `json:"ev"`
	Consumer      int    `json:"consumer"`
	Partition     int32  `json:"partition"`
	Offset        int64  `json:"offset"`
	Value         string `json:"value"`
	DeliveryCount *int   `json:"delivery_count"`
	Records       int    `json:"records"`
	Error         string `json:"error"`

	window int32 // switches done when the test read the line
}

// shareProc is the Java client's share-consume mode running: K share
// consumers in one share group, until stdin ends.
type shareProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	window atomic.Int32
	mu     sync.Mutex
	events []shareEvent
	bad    []string
	stderr bytes.Buffer
	exited chan struct{}
	err    error
}

func startShareConsumers(t *testing.T, bootstrap, topic, group string, consumers int) *shareProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	p := &shareProc{exited: make(chan struct{})}
	p.cmd = javaCommand(ctx, t, "share-consume", "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--consumers", fmt.Sprint(consumers))
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var e shareEvent
			err := json.Unmarshal(sc.Bytes(), &e)
			e.window = p.window.Load()
			p.mu.Lock()
			if err != nil || e.Ev == "" {
				p.bad = append(p.bad, sc.Text())
			} else {
				p.events = append(p.events, e)
			}
			p.mu.Unlock()
		}
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill()
		}
	})
	return p
}

// snapshot is the events read so far.
func (p *shareProc) snapshot() []shareEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]shareEvent(nil), p.events...)
}

// delivered is the distinct values delivered so far.
func delivered(es []shareEvent) map[string]bool {
	out := map[string]bool{}
	for _, e := range es {
		if e.Ev == "rec" {
			out[e.Value] = true
		}
	}
	return out
}

// waitDelivered waits until every value in want was delivered.
func (p *shareProc) waitDelivered(t *testing.T, want map[string]partOff, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := delivered(p.snapshot())
		missing := 0
		for v := range want {
			if !got[v] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		select {
		case <-p.exited:
			t.Fatalf("the share consumers exited (%v) with %d of %d records undelivered; stderr:\n%s", p.err, missing, len(want), p.stderrText())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records not delivered within %v; stderr:\n%s", missing, len(want), timeout, p.stderrText())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p *shareProc) stderrText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return head(p.stderr.String(), 4000)
}

// stop ends stdin and waits for the consumers to close.
func (p *shareProc) stop(t *testing.T) {
	t.Helper()
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("the share consumers did not stop; stderr:\n%s", p.stderrText())
	}
	if p.err != nil {
		t.Fatalf("the share consumers failed: %v\n%s", p.err, p.stderrText())
	}
	if len(p.bad) > 0 {
		t.Fatalf("lines that are no events: %q", p.bad)
	}
}

// produceValues produces n records with values prefix-0 … prefix-(n-1)
// through bootstrap and returns where each landed.
func produceValues(ctx context.Context, t *testing.T, bootstrap, topic, prefix string, n int) map[string]partOff {
	t.Helper()
	// Spread over the partitions, in turn.
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bootstrap, ",")...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	out := map[string]partOff{}
	var mu sync.Mutex
	for i := range n {
		v := fmt.Sprintf("%s-%d", prefix, i)
		cl.Produce(ctx, &kgo.Record{Value: []byte(v)}, func(r *kgo.Record, err error) {
			if err != nil {
				t.Errorf("producing %s: %v", v, err)
				return
			}
			mu.Lock()
			out[v] = partOff{r.Partition, r.Offset}
			mu.Unlock()
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(out) != n {
		t.Fatalf("%d of %d records produced", len(out), n)
	}
	return out
}

// setShareGroupConfig sets a share group config through bootstrap.
func setShareGroupConfig(ctx context.Context, t *testing.T, bootstrap, group, name, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bootstrap, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = name, kmsg.StringPtr(value)
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("setting %s=%s on share group %s: %v", name, value, group, err)
	}
}

// shareStarts reads a share group's start offsets of topic, by partition.
func shareStarts(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32]int64, error) {
	offs, err := shareOffsets(ctx, adm, group, topic)
	out := map[int32]int64{}
	for p, o := range offs {
		out[p] = o.StartOffset
	}
	return out, err
}

// shareOffsets reads a share group's offsets of topic (start offset and
// lag), by partition.
func shareOffsets(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32]kadm.ShareOffset, error) {
	d, err := adm.DescribeShareGroupOffsets(ctx, group)
	if err == nil {
		err = d.Error()
	}
	if err != nil {
		return nil, err
	}
	out := map[int32]kadm.ShareOffset{}
	for p, o := range d[group].Offsets[topic] {
		if o.Err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, o.Err)
		}
		out[p] = o
	}
	return out, nil
}

// checkDeliveries fails the test for a record delivered at another
// place than it was produced, or without its delivery count, or an error
// the consumers reported (errOK: the errors expected).
func checkDeliveries(t *testing.T, es []shareEvent, produced map[string]partOff, errOK func(shareEvent) bool) {
	t.Helper()
	for _, e := range es {
		switch e.Ev {
		case "rec":
			w, ok := produced[e.Value]
			if !ok || w.p != e.Partition || w.o != e.Offset {
				t.Errorf("record %q delivered at %d/%d, produced at %v", e.Value, e.Partition, e.Offset, w)
			}
			if e.DeliveryCount == nil || *e.DeliveryCount < 1 {
				t.Errorf("record %q delivered with delivery count %v", e.Value, e.DeliveryCount)
			}
		case "error", "ack_error":
			if errOK == nil || !errOK(e) {
				t.Errorf("consumer %d reported %s: %s", e.Consumer, e.Ev, e.Error)
			}
		}
	}
}

// TestShareGroupJava: two Java KafkaShareConsumers in one share group
// read a three-partition topic of the 3-broker cluster through Ferry and
// acknowledge every record: between them they get every record produced,
// where it was produced, and the share fetches reach Ferry on the lanes
// of the partitions' leaders (the clients follow Ferry's virtual
// leaders). Once they are done, the group's start offsets read through
// Ferry (DescribeShareGroupOffsets) are the partitions' end offsets, as
// read from the cluster directly.
func TestShareGroupJava(t *testing.T) {
	c := sharedCluster(t)
	f := ferrytest.Start(t, c.Bootstrap())
	adm := admin(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	topic := createTopic(t, adm, "share")
	group := "share-" + randomSuffix()
	setShareGroupConfig(ctx, t, f.Addr, group, "share.auto.offset.reset", "earliest")
	const n = 300
	produced := produceValues(ctx, t, f.Addr, topic, "v", n)

	p := startShareConsumers(t, f.Addr, topic, group, 2)
	p.waitDelivered(t, produced, 60*time.Second)
	p.stop(t)
	checkDeliveries(t, p.snapshot(), produced, nil)

	// Every partition's leader's lane served share fetches.
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	leaders := map[int32]bool{}
	for _, pd := range md.Topics[topic].Partitions {
		leaders[pd.Leader] = true
	}
	rep, err := f.Server.Connz(connstats.Query{State: "all", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	lanes := map[int]uint64{}
	for _, ci := range rep.Connections {
		if n := ci.Requests["ShareFetch"]; n > 0 {
			lanes[ci.Lane] += n
		}
	}
	if len(lanes) != len(leaders) {
		t.Errorf("share fetches reached lanes %v; the topic's partitions have %d leaders", lanes, len(leaders))
	}

	// The start offsets read through Ferry are the cluster's, each
	// within the partition's records. (Not the end: a broker persists a
	// share partition's start offset one acknowledgement behind, and a
	// partition's records acknowledged in one write leave it at 0;
	// TestShareGroupSwitchover makes the write that moves it.)
	ferryAdm := viaTarget(t, f.Addr)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	via, err := shareStarts(ctx, ferryAdm, group, topic)
	if err != nil {
		t.Fatalf("start offsets through Ferry: %v", err)
	}
	direct, err := shareStarts(ctx, adm, group, topic)
	if err != nil {
		t.Fatalf("start offsets read directly: %v", err)
	}
	t.Logf("start offsets through Ferry %v, directly %v, end offsets %v", via, direct, ends)
	ends.Each(func(e kadm.ListedOffset) {
		v, ok := via[e.Partition]
		if !ok || v != direct[e.Partition] || v < 0 || v > e.Offset {
			t.Errorf("partition %d: start offset through Ferry %d (%v), directly %d, end %d", e.Partition, v, ok, direct[e.Partition], e.Offset)
		}
	})
}

// TestShareGroupSwitchover: two Java share consumers read through `ferry
// serve` while it switches, planned, to the standby. Before the switch
// they have acknowledged part of the records; after it they carry on,
// through the same Ferry connections, on the standby, and records
// produced after the switch are delivered too. Checked:
//   - every record, before and after the switch, is delivered at least
//     once: none is skipped;
//   - no record below the start offset the group had before the switch
//     (read on the old cluster directly) is delivered after the switch;
//   - every record whose acknowledgement a broker refused (the
//     acknowledgements that reached the new cluster for records acquired
//     on the old) is delivered again;
//   - the start offsets on the new cluster, read directly at once after
//     the switch, are at least those read before it and at most those
//     the old cluster ended with (its end offset where it reports lag 0);
//   - switched back once every record is finished (lag 0), the start
//     offsets copied are the ends, not one acknowledgement behind;
//   - a first lot of records, every one acknowledged before the switch
//     and followed by a marker record on each partition, acknowledged
//     too, is behind the start offsets read before the switch, so not
//     delivered after it: delivery resumes where the group acknowledged.
//     (A broker persists a share partition's start offset with the state
//     write of its next acknowledgement, one write behind what it holds
//     in memory; the marker's acknowledgement makes that write. What a
//     switch copies is the persisted one: the records of a partition's
//     last acknowledgement before it are delivered again.)
func TestShareGroupSwitchover(t *testing.T) {
	if testing.Short() {
		t.Skip("conformance: real Kafka and client programs are not run in -short mode")
	}
	bin, primary, standby := startPair(t, "share-primary", "share-standby")
	ferry := startFerryServe(t, bin, primary, standby)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pAdm, sAdm := admin(t, primary), admin(t, standby)
	topic := "share-switch"
	createReadyTopic(ctx, t, viaTarget(t, ferry.addr), topic, 3, 1)
	group := "share-switch-" + randomSuffix()
	setShareGroupConfig(ctx, t, ferry.addr, group, "share.auto.offset.reset", "earliest")
	const n0, n1, n2 = 150, 300, 100
	produced := produceValues(ctx, t, ferry.addr, topic, "first", n0)

	p := startShareConsumers(t, ferry.addr, topic, group, 2)
	ackedAtLeast := func(what string, n int) {
		t.Helper()
		testwait.Until(t, 60*time.Second, what, func() bool {
			acked := 0
			for _, e := range p.snapshot() {
				if e.Ev == "acked" {
					acked += e.Records
				}
			}
			return acked >= n
		})
	}
	// The first lot, all acknowledged, then a marker on each partition.
	ackedAtLeast("the first lot delivered and acknowledged", n0)
	firstEnds, err := pAdm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	markers := produceValues(ctx, t, ferry.addr, topic, "marker", 3)
	onParts := map[int32]bool{}
	for v, po := range markers {
		produced[v], onParts[po.p] = po, true
	}
	if len(onParts) != 3 {
		t.Fatalf("the markers went to partitions %v, want one on each of 3", onParts)
	}
	ackedAtLeast("the markers delivered and acknowledged", n0+3)
	// Then a lot of which part is acknowledged before the switch.
	for v, po := range produceValues(ctx, t, ferry.addr, topic, "before", n1) {
		produced[v] = po
	}
	ackedAtLeast("a third of the next lot delivered and acknowledged", n0+3+n1/3)
	ferry.waitMirrorCaughtUp(t, 30*time.Second)
	before, err := shareStarts(ctx, pAdm, group, topic)
	if err != nil {
		t.Fatalf("start offsets on the primary before the switch: %v", err)
	}
	firstEnds.Each(func(e kadm.ListedOffset) {
		if before[e.Partition] < e.Offset {
			t.Errorf("partition %d: start offset %d before the switch, below the end %d of the first lot, every record of which was acknowledged (and a marker after it)", e.Partition, before[e.Partition], e.Offset)
		}
	})
	// From here on, records delivered and errors reported count as
	// after the switch: the primary delivers nothing below before either.
	p.window.Store(1)
	took := ferry.switchover(t, ctx, "standby", 1)
	copied, err := shareStarts(ctx, sAdm, group, topic)
	if err != nil {
		t.Fatalf("start offsets on the standby after the switch: %v", err)
	}
	after, err := shareOffsets(ctx, pAdm, group, topic)
	if err != nil {
		t.Fatalf("start offsets on the primary after the switch: %v", err)
	}
	primaryEnds, err := pAdm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("switch took %s; start offsets: primary before %v, standby just after %v, primary after %v", took, before, copied, after)
	for part := range int32(3) {
		// At most the primary's start offset after the switch, or,
		// where it reports every record finished (lag 0), its end.
		most := after[part].StartOffset
		if end, ok := primaryEnds.Lookup(topic, part); ok && after[part].Lag == 0 {
			most = max(most, end.Offset)
		}
		if copied[part] < before[part] || copied[part] > most {
			t.Errorf("partition %d: the standby's start offset %d after the switch is not between the primary's %d before and %d after it (lag %d)", part, copied[part], before[part], most, after[part].Lag)
		}
	}

	for v, po := range produceValues(ctx, t, ferry.addr, topic, "after", n2) {
		produced[v] = po
	}
	p.waitDelivered(t, produced, 60*time.Second)
	// Acknowledgements refused are redelivered: wait for the last ones,
	// and for every commit in flight to be answered (a commit can fail
	// after the records it covered were all delivered once, and its
	// records are then redelivered only once their acquisition lock
	// expires). Refused here means failed by the Java client itself: it
	// completes acknowledgements of records from a share session the
	// switch ended with NetworkException ("The server disconnected before
	// a response was received") when it opens the new session, since a
	// session's first ShareFetch cannot carry them; Ferry closes nothing.
	p.waitSettled(t, nil)

	// Every record finished: lag 0 on every partition of the standby.
	// Switched back now, the switch copies the end, not the start offset
	// the standby persisted, one acknowledgement behind
	// (mirror.resumeEnds). (The primary's brokers may still hold the
	// share partitions as they were before the first switch: they deliver
	// from there once, until their first state write is refused, the copy
	// having moved the state epoch, and they load the copied start offset;
	// records between are delivered again, counted below, never skipped.)
	testwait.Until(t, 60*time.Second, "lag 0 on every partition of the standby", func() bool {
		offs, err := shareOffsets(ctx, sAdm, group, topic)
		if err != nil || len(offs) != 3 {
			return false
		}
		for _, o := range offs {
			if o.Lag != 0 {
				return false
			}
		}
		return true
	})
	ends, err := sAdm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	finished := map[int32]int64{} // partition → the standby's end, every record below it finished
	ends.Each(func(e kadm.ListedOffset) { finished[e.Partition] = e.Offset })
	p.window.Store(2)
	took2 := ferry.switchover(t, ctx, "primary", 2)
	back, err := shareStarts(ctx, pAdm, group, topic)
	if err != nil {
		t.Fatalf("start offsets on the primary after the switch back: %v", err)
	}
	t.Logf("switch back took %s; the standby's ends with lag 0 %v, the primary's start offsets after %v", took2, finished, back)
	for part, end := range finished {
		if back[part] < end {
			t.Errorf("partition %d: start offset %d on the primary after the switch back, below the standby's end %d, every record under which was finished", part, back[part], end)
		}
	}
	for v, po := range produceValues(ctx, t, ferry.addr, topic, "back", 30) {
		produced[v] = po
	}
	p.waitDelivered(t, produced, 60*time.Second)
	p.waitSettled(t, finished)
	p.stop(t)
	es := p.snapshot()
	again := 0
	for _, e := range es {
		if end, ok := finished[e.Partition]; e.Ev == "rec" && e.window == 2 && ok && e.Offset < end {
			again++
		}
	}
	t.Logf("after the switch back, %d deliveries of records below the ends where every record was finished (the primary brokers' share partitions from before the first switch)", again)
	checkDeliveries(t, es, produced, func(e shareEvent) bool {
		// Acknowledging, after the switch, records acquired from the
		// old cluster: refused, and redelivered (checked below).
		return e.Ev == "ack_error" && e.window > 0 || e.Ev == "error" && e.window > 0
	})
	redelivered, counts := 0, map[int]int{}
	seen := map[string]bool{}
	for _, e := range es {
		if e.Ev != "rec" {
			continue
		}
		if e.window > 0 && e.Offset < before[e.Partition] {
			t.Errorf("record %q at %d/%d delivered after the switch, below the start offset %d the group had before it", e.Value, e.Partition, e.Offset, before[e.Partition])
		}
		if seen[e.Value] {
			redelivered++
			counts[*e.DeliveryCount]++
		}
		seen[e.Value] = true
	}
	if left := refusedNotRedelivered(es, finished); len(left) > 0 {
		t.Errorf("records whose acknowledgement was refused and that were not delivered again: %v; errors reported:\n%s", left, refusals(es))
	}
	t.Logf("%d deliveries of %d records; %d redeliveries, by delivery count %v", countEv(es, "rec"), len(produced), redelivered, counts)
}

// refusedNotRedelivered lists the records a consumer's refused
// acknowledgement covered (the records it got since its last commit, on
// the partition named; every partition when the commit failed as a
// whole) that no later delivery brought again.
// Records below finished (partition → offset; nil for none) are left
// out: every record there was finished before, and the group starts
// above them.
func refusedNotRedelivered(es []shareEvent, finished map[int32]int64) []string {
	pending := map[int][]int{} // consumer → its records since its last commit, by index
	var refused []int
	for i, e := range es {
		switch e.Ev {
		case "rec":
			pending[e.Consumer] = append(pending[e.Consumer], i)
		case "ack_error":
			for _, ri := range pending[e.Consumer] {
				if e.Partition < 0 || es[ri].Partition == e.Partition {
					refused = append(refused, ri)
				}
			}
		case "acked": // every commit ends with one
			pending[e.Consumer] = nil
		}
	}
	var out []string
	for _, ri := range refused {
		if es[ri].Offset < finished[es[ri].Partition] {
			continue // finished before: below the start offset now, not delivered again
		}
		again := false
		for _, e := range es[ri+1:] {
			again = again || e.Ev == "rec" && e.Value == es[ri].Value
		}
		if !again {
			out = append(out, fmt.Sprintf("%s@%d/%d", es[ri].Value, es[ri].Partition, es[ri].Offset))
		}
	}
	sort.Strings(out)
	return out
}

// waitSettled waits, up to 90 s, until every commit is answered and every
// record whose acknowledgement was refused delivered again (those below
// finished aside, as refusedNotRedelivered has it), and fails the test
// with the refusals otherwise. A refused record comes back once its
// acquisition lock (30 s) expires.
func (p *shareProc) waitSettled(t *testing.T, finished map[int32]int64) {
	t.Helper()
	testwait.Eventually(t, 90*time.Second, "every commit answered and every record whose acknowledgement was refused delivered again", func() error {
		es := p.snapshot()
		inFlight, left := commitsInFlight(es), refusedNotRedelivered(es, finished)
		if !inFlight && len(left) == 0 {
			return nil
		}
		return fmt.Errorf("commits in flight %v; refused and not delivered again %v; errors reported:\n%s", inFlight, left, refusals(es))
	})
}

// refusals lists the errors the consumers reported, with when, a line
// each.
func refusals(es []shareEvent) string {
	var b strings.Builder
	for i, e := range es {
		if e.Ev == "ack_error" || e.Ev == "error" {
			fmt.Fprintf(&b, "event %d (after %d switches): %s consumer %d partition %d: %s\n", i, e.window, e.Ev, e.Consumer, e.Partition, e.Error)
		}
	}
	return b.String()
}

// commitsInFlight reports whether a consumer has delivered records whose
// commit has not been answered yet (no "acked" line after them).
func commitsInFlight(es []shareEvent) bool {
	pending := map[int]bool{}
	for _, e := range es {
		switch e.Ev {
		case "rec":
			pending[e.Consumer] = true
		case "acked":
			pending[e.Consumer] = false
		}
	}
	for _, p := range pending {
		if p {
			return true
		}
	}
	return false
}

func countEv(es []shareEvent, ev string) int {
	n := 0
	for _, e := range es {
		if e.Ev == ev {
			n++
		}
	}
	return n
}
