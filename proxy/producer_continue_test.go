package proxy

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// producerState is a producer's state in a partition as DescribeProducers
// answers it.
type producerState struct {
	pid   int64
	epoch int16
	last  int32
}

// producersAnswer makes kf answer DescribeProducers for t[0] with the
// producers' states states() gives (those with a negative ID skipped), as a
// broker does for every producer it holds state for (kfake lists
// transactional ones only). It counts the calls.
func producersAnswer(kf *kfake.Cluster, states func() []producerState) *atomic.Int32 {
	var calls atomic.Int32
	kf.ControlKey(int16(kmsg.DescribeProducers), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		calls.Add(1)
		req := kr.(*kmsg.DescribeProducersRequest)
		resp := req.ResponseKind().(*kmsg.DescribeProducersResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewDescribeProducersResponseTopic()
			st.Topic = rt.Topic
			for _, p := range rt.Partitions {
				sp := kmsg.NewDescribeProducersResponseTopicPartition()
				sp.Partition = p
				for _, ps := range states() {
					if rt.Topic != "t" || p != 0 || ps.pid < 0 {
						continue
					}
					ap := kmsg.NewDescribeProducersResponseTopicPartitionActiveProducer()
					ap.ProducerID, ap.ProducerEpoch, ap.LastSequence = ps.pid, int32(ps.epoch), ps.last
					sp.ActiveProducers = append(sp.ActiveProducers, ap)
				}
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return &calls
}

// produceAs returns a call producing one batch (seq, v) of producer pid,
// epoch 0, to t[0] through Ferry at addr, answering the partition's code.
func produceAs(t *testing.T, addr string, pid int64) func(seq int32, v string) int16 {
	p := produceAsEpoch(t, addr, pid)
	return func(seq int32, v string) int16 { t.Helper(); return p(0, seq, v) }
}

// produceAsEpoch is produceAs with the batch's epoch.
func produceAsEpoch(t *testing.T, addr string, pid int64) func(epoch int16, seq int32, v string) int16 {
	p := produceAnswered(t, addr, pid)
	return func(epoch int16, seq int32, v string) int16 { t.Helper(); return p(epoch, seq, v).ErrorCode }
}

// produceAnswered is produceAsEpoch answering the partition's whole answer.
func produceAnswered(t *testing.T, addr string, pid int64) func(epoch int16, seq int32, v string) kmsg.ProduceResponseTopicPartition {
	var via net.Conn = dialRaw(t, addr)
	via.SetDeadline(time.Now().Add(30 * time.Second))
	corr := int32(0)
	return func(epoch int16, seq int32, v string) kmsg.ProduceResponseTopicPartition {
		t.Helper()
		p := kmsg.NewPtrProduceRequest()
		p.Version = 7
		p.Acks, p.TimeoutMillis = -1, 5000
		p.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: valueBatch(pid, epoch, seq, false, v)}}}}
		corr++
		return rawCall(t, via, p, corr).(*kmsg.ProduceResponse).Topics[0].Partitions[0]
	}
}

// A batch sent again after a planned switch at or below where its producer
// stopped on the cluster taken over from (DescribeProducers' last
// sequence) is answered DUPLICATE_SEQUENCE_NUMBER only when that cluster
// holds it where the new one does, at its offset. A producer issued two
// generations back wrote v4 and v5 on a under the ID allocated for it
// there, its first batch at sequence 4 (the broker takes any first
// sequence from an ID it does not know), while v3 was outstanding
// elsewhere: a's last sequence for it is 5, yet v3 was never written.
// Before, v3 sent again after the switch was answered
// DUPLICATE_SEQUENCE_NUMBER and lost (the chaos run in CI on 2026-12-03:
// ten records acknowledged so were on neither cluster). A second producer's
// w1 landed on a past where the switch stopped the mirror (its fence): not
// on b, so it is written there.
func TestIdempotentRetryBelowTheLastSequenceLookedUp(t *testing.T) {
	prevGen := uint32(idGen - 1)
	virt, virt2 := routing.VirtualPID(idGen-2, 9), routing.VirtualPID(idGen-2, 10)
	a := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	b := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	table := routing.NewTable(routing.State{Generation: prevGen, Active: "a"})
	s, addr := startFerry(t, a.ListenAddrs(), WithRoutingTable(table),
		WithClusters(upstream.Config{Name: "a", Bootstrap: a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: b.ListenAddrs()}))
	seedPartition(t, a) // a: "before" at 0
	p, q := produceAnswered(t, addr, virt), produceAnswered(t, addr, virt2)
	for _, w := range []struct {
		p   func(int16, int32, string) kmsg.ProduceResponseTopicPartition
		seq int32
		v   string
		at  int64
	}{{p, 4, "v4", 1}, {p, 5, "v5", 2}, {q, 0, "w0", 3}, {q, 1, "w1", 4}} {
		if r := w.p(0, w.seq, w.v); r.ErrorCode != 0 || r.BaseOffset != w.at {
			t.Fatalf("%s under generation %d: %v at %d, want written at %d", w.v, prevGen, kerr.ErrorForCode(r.ErrorCode), r.BaseOffset, w.at)
		}
	}
	old, old2 := s.remapped.held(prevGen, virt), s.remapped.held(prevGen, virt2)
	if old < 0 || old2 < 0 || old == old2 {
		t.Fatalf("IDs allocated under generation %d: %d and %d", prevGen, old, old2)
	}
	producersAnswer(a, func() []producerState { return []producerState{{old, 0, 5}, {old2, 0, 1}} })

	// The switch stopped the mirror at 4: b holds a's offsets 0..3.
	seedPartition(t, b)
	from := prevGen
	table.Update(routing.State{Generation: idGen, Active: "b",
		Last:   &routing.Switch{Mode: routing.Planned, From: "a", To: "b", FromGeneration: &from, Outcome: routing.OutcomeSwitched},
		Fences: []routing.Fence{{Generation: prevGen, Ends: map[string][]int64{"t": {4}}}}})
	if r := p(0, 4, "v4"); r.ErrorCode != kerr.DuplicateSequenceNumber.Code || r.BaseOffset != 1 {
		t.Fatalf("v4, written on a at 1 before the switch: %v at %d, want DUPLICATE_SEQUENCE_NUMBER at 1", kerr.ErrorForCode(r.ErrorCode), r.BaseOffset)
	}
	if r := p(0, 3, "v3"); r.ErrorCode != 0 {
		t.Fatalf("v3, never written: %v, want written", kerr.ErrorForCode(r.ErrorCode))
	}
	if r := q(0, 1, "w1"); r.ErrorCode != 0 {
		t.Fatalf("w1, on a past the fence only: %v, want written", kerr.ErrorForCode(r.ErrorCode))
	}
	if got := readCommitted(t, b); fmt.Sprint(got[0]) != "[before v3 w1]" {
		t.Fatalf("b's t[0] holds %q; want [before v3 w1]", got[0])
	}
}

// An idempotent producer's first batch under a new generation continues
// where the producer stopped on the cluster the switch took over from,
// whichever member it comes through. A producer issued two generations
// back writes v0..v4 through one member of three, under an ID allocated
// for it on cluster a; a planned switch moves the fleet to b. Batch 5 is
// outstanding on that member (cut off from the fleet, or paused: the
// 30-minute chaos run's "2/53258 holds 305788 after 306303") when batch 6
// comes through a member that never saw the producer: it is refused
// (retried in place), or the broker would take 6 as the first of the
// fresh ID, and 5, sent again, would only meet OUT_OF_ORDER_SEQUENCE_NUMBER
// and be written after it under a new epoch. Batch 3, written before the
// switch (its answer lost), is answered DUPLICATE_SEQUENCE_NUMBER, not
// written twice. Once 5 is written through the first member, 6 goes
// through the other: b holds v5 v6 v7 after what was there, in order,
// once each.
func TestIdempotentFirstBatchContinuesAcrossMembers(t *testing.T) {
	prevGen := uint32(idGen - 1)
	virt := routing.VirtualPID(idGen-2, 9)
	f := startThree(t, prevGen)
	a, b, members, addrs := f.a, f.b, f.members, f.addrs
	// The member writing before the switch is not the one allocating
	// the producer's IDs; the third knows nothing of the producer.
	owner, writer, third, old := f.writeBefore(t, virt, 5)
	if members[third].remapped.held(prevGen, virt) >= 0 {
		t.Fatal("the third member holds the producer's ID: it must learn it from the others")
	}
	// On cluster a the producer stopped at sequence 4 (what a broker
	// answers; kfake lists transactional producers only). On b, the ID
	// allocated under the new generation holds state once v5 is written.
	// A second producer, of the first generation, stopped at epoch 3.
	bumped := routing.VirtualPID(prevGen, 12)
	olds := producersAnswer(a, func() []producerState { return []producerState{{old, 0, 4}, {12, 3, 9}, {14, 0, 4}} })
	var v5 atomic.Bool
	producersAnswer(b, func() []producerState {
		if !v5.Load() {
			return nil
		}
		return []producerState{{members[owner].remapped.held(idGen, virt), 0, 5}}
	})

	// What the mirror copied to b (KAFKA-15591: a partition that never
	// held a record takes only sequence 0 from a producer it does not
	// know).
	seedPartition(t, b)
	f.switchTo(idGen, "b")
	m, o := produceAs(t, addrs[third], virt), produceAs(t, addrs[writer], virt)
	if code := m(6, "v6"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("v6 with v5 outstanding, through another member: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	if code := m(3, "v3"); code != kerr.DuplicateSequenceNumber.Code {
		t.Fatalf("v3, written before the switch: %v, want DUPLICATE_SEQUENCE_NUMBER", kerr.ErrorForCode(code))
	}
	if code := o(5, "v5"); code != 0 {
		t.Fatalf("v5 sent again through the member it waited on: %v", kerr.ErrorForCode(code))
	}
	v5.Store(true)
	if code := m(6, "v6"); code != 0 {
		t.Fatalf("v6 after v5 was written: %v", kerr.ErrorForCode(code))
	}
	if code := m(7, "v7"); code != 0 {
		t.Fatalf("v7: %v", kerr.ErrorForCode(code))
	}
	// A batch of an epoch older than the one the producer wrote last
	// (kept by a member through the client's epoch bump) is refused,
	// retriable: written, it would land after the newer epoch's batches.
	z := produceAsEpoch(t, addrs[third], bumped)
	if code := z(2, 0, "z-old"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("a batch of epoch 2 after epoch 3: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	if code := z(3, 10, "z10"); code != 0 {
		t.Fatalf("the next batch of epoch 3: %v", kerr.ErrorForCode(code))
	}
	// A producer that bumped its epoch since it last wrote on a starts
	// the new epoch at sequence 0 in every partition: a later batch of
	// the new epoch waits for that one, which may be outstanding on
	// another member (written first, it would set the fresh ID's
	// sequence ahead of it).
	bumper := produceAsEpoch(t, addrs[third], routing.VirtualPID(prevGen, 14))
	if code := bumper(1, 1, "f1"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("sequence 1 of a new epoch before its 0: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	for seq := range int32(2) {
		if code := bumper(1, seq, fmt.Sprintf("f%d", seq)); code != 0 {
			t.Fatalf("sequence %d of the new epoch, in order: %v", seq, kerr.ErrorForCode(code))
		}
	}
	if got := readCommitted(t, b); fmt.Sprint(got[0]) != "[before v5 v6 v7 z10 f0 f1]" {
		t.Fatalf("b's t[0] holds %q; want [before v5 v6 v7 z10 f0 f1]", got[0])
	}
	if got := readCommitted(t, a); fmt.Sprint(got[0]) != "[v0 v1 v2 v3 v4]" {
		t.Fatalf("a's t[0] holds %q; want [v0 v1 v2 v3 v4]", got[0])
	}
	// Read once per member and generation, not per batch.
	if n := olds.Load(); n > 2 {
		t.Errorf("cluster a was asked for t[0]'s producers %d times; want once per member that checked", n)
	}
}

// A batch of a producer of the current generation refused unwritten by
// Ferry (here: held by a switch longer than a client waits) keeps its
// place too: for an ID the broker holds no state for in the partition —
// the producer's first batch there — the broker takes any first sequence,
// and the batch sent behind the refused one would be written first (the
// 30-minute chaos run: the VerifiableProducer's first batch to a partition
// held by a switch at the start, its second written at offset 0, the first
// 2,063 records later). The next batch is refused
// OUT_OF_ORDER_SEQUENCE_NUMBER until the refused one comes again.
func TestIdempotentBatchOfThisGenerationRefusedKeepsItsPlace(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	table := routing.NewTable(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseDraining})
	_, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(table), WithHeldAnswerAfter(200*time.Millisecond))
	seedPartition(t, kf)
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.TransactionTimeoutMillis = 60000
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := ip.RequestWith(ctx, newClient(t, kf.ListenAddrs()[0]))
	if err != nil || resp.ErrorCode != 0 {
		t.Fatalf("InitProducerId: %v, %v", err, kerr.ErrorForCode(resp.ErrorCode))
	}
	produce := produceAsEpoch(t, addr, resp.ProducerID)
	epoch := resp.ProducerEpoch
	if code := produce(epoch, 0, "first"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the held batch: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	table.Update(routing.State{Generation: 0, Active: "a", Phase: routing.PhaseServing}) // rolled back
	if code := produce(epoch, 1, "second"); code != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("the batch after the held one: %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", kerr.ErrorForCode(code))
	}
	for _, b := range []struct {
		seq int32
		v   string
	}{{0, "first"}, {1, "second"}} {
		if code := produce(epoch, b.seq, b.v); code != 0 {
			t.Fatalf("resending %s: %v", b.v, kerr.ErrorForCode(code))
		}
	}
	if got := readCommitted(t, kf); fmt.Sprint(got[0]) != "[before first second]" {
		t.Fatalf("partition 0 holds %q; want [before first second]", got[0])
	}
}

// Once a read of the cluster taken over from fails as a whole (it is
// unreachable, or slow), no other is tried for prevReadRetry: each would
// stall a client's connection for the read's bound. Then it is read
// again: one failure must not leave every first batch of the generation
// unchecked. A topic read once is not read again.
func TestPreviousClusterReadOncePerGeneration(t *testing.T) {
	var r remappedPIDs
	reads := 0
	ok := func(context.Context) (map[int32]map[int64]prodState, error) {
		reads++
		return map[int32]map[int64]prodState{0: {7: {epoch: 1, last: 4}}}, nil
	}
	down := func(context.Context) (map[int32]map[int64]prodState, error) {
		reads++
		return nil, context.DeadlineExceeded
	}
	ctx := context.Background()
	for range 2 {
		if parts, err := r.producersOf(ctx, 3, "a", ok); err != nil || parts[0][7].last != 4 {
			t.Fatalf("topic a: %v, %v", parts, err)
		}
	}
	if _, err := r.producersOf(ctx, 3, "b", down); err == nil {
		t.Fatal("topic b: the failed read answered no error")
	}
	if _, err := r.producersOf(ctx, 3, "c", ok); err == nil || reads != 2 {
		t.Fatalf("topic c after a failed read: %v, %d reads; want the failure and no read", err, reads)
	}
	r.mu.Lock()
	r.oldsDownAt = r.oldsDownAt.Add(-prevReadRetry)
	r.mu.Unlock()
	if parts, err := r.producersOf(ctx, 3, "b", ok); err != nil || reads != 3 || parts[0][7].last != 4 {
		t.Fatalf("topic b once prevReadRetry passed: %v, %v, %d reads; want it read again", parts, err, reads)
	}
	// A new generation reads again.
	if _, err := r.producersOf(ctx, 4, "c", ok); err != nil || reads != 4 {
		t.Fatalf("topic c under the next generation: %v, %d reads", err, reads)
	}
}

// A topic the cluster taken over from answers with an error for (missing
// there, say) leaves only its own first batches unchecked: the read is
// not a failure of the cluster, which would stop every topic's checks
// for the generation.
func TestDescribeProducersPartitionErrorIsNotTheClusters(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	s, _ := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	parts, err := describeProducers(ctx, s.cluster("a"), "not-there", []int32{0, 1})
	if err != nil || len(parts) != 0 {
		t.Fatalf("a topic missing on the cluster: %v, %v; want no partition and no error", parts, err)
	}
	parts, err = describeProducers(ctx, s.cluster("a"), "t", []int32{0})
	if _, ok := parts[0]; err != nil || !ok {
		t.Fatalf("a topic there: %v, %v; want partition 0", parts, err)
	}
}

// A member that does not answer may hold what another asks it for: it is
// never taken to hold nothing. Allocating a producer's ID while a member
// that writes under one is silent would give the producer two IDs in one
// generation, each taking any first sequence (a batch retried through the
// other member written twice, or a later one first); asking where the
// producer stopped on the cluster taken over from, its batch would be
// written unchecked. Both are refused, retriable, until the member
// answers.
func TestSilentMemberIsNotTakenToHoldNothing(t *testing.T) {
	prevGen := uint32(idGen - 1)
	virt := routing.VirtualPID(idGen-2, 9)
	f := startThree(t, prevGen)
	a, b, peers, members, addrs := f.a, f.b, f.peers, f.members, f.addrs
	owner, writer, third, held := f.writeBefore(t, virt, 3)

	// The third member taking over the allocation (the owner gone, or
	// cut off) while the members holding the ID are silent: no second ID.
	peers.silence(writer, true)
	peers.silence(owner, true)
	ctx := context.Background()
	if phys, err := members[third].ownerPID(ctx, members[third].cluster("a"), prevGen, virt); err == nil {
		t.Fatalf("allocating with the members holding the ID silent: ID %d, no error; they hold %d", phys, held)
	}
	peers.silence(owner, false)
	if phys, err := members[third].ownerPID(ctx, members[third].cluster("a"), prevGen, virt); err != nil || phys != held {
		t.Fatalf("allocating with the owner answering: ID %d, %v; want the one it holds, %d", phys, err, held)
	}
	peers.silence(writer, false)
	if phys, err := members[third].ownerPID(ctx, members[third].cluster("a"), prevGen, virt); err != nil || phys != held {
		t.Fatalf("allocating with the writer answering: ID %d, %v; want the one it holds, %d", phys, err, held)
	}

	// A planned switch to b. The third member does not know the ID the
	// producer wrote under on a; the members that do are silent.
	olds := producersAnswer(a, func() []producerState { return []producerState{{held, 0, 2}} })
	seedPartition(t, b)
	f.switchTo(idGen, "b")
	peers.silence(writer, true)
	peers.silence(owner, true)
	m := produceAs(t, addrs[third], virt)
	if code := m(4, "v4"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("v4 (v3 outstanding) while where the producer stopped is unknown: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	peers.silence(writer, false)
	peers.silence(owner, false)
	if code := m(4, "v4"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("v4 (v3 outstanding) once known: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	if olds.Load() == 0 {
		t.Fatal("cluster a was never asked where the producer stopped")
	}
	if code := m(3, "v3"); code != 0 {
		t.Fatalf("v3, the next: %v", kerr.ErrorForCode(code))
	}
	if got := readCommitted(t, b); fmt.Sprint(got[0]) != "[before v3]" {
		t.Fatalf("b's t[0] holds %q; want [before v3]", got[0])
	}
}

// A member cut off from the others' gossip sees itself alone: asking
// "every other live member" whether one holds the producer's ID asks
// nobody, and nobody answering was taken for nobody holding one. Under the
// generation after a planned switch it then wrote a producer's later
// batch first, under an ID of its own, while the batch before it was
// still to come through another member: the 30-minute chaos run on
// dfeb31b ("4/43588 holds 212324 after 212838", a member cut off through
// a planned switch). The members it cannot ask may hold the ID: its
// batch is refused, retriable, until it can ask them.
func TestCutOffMemberIsNotTakenToHoldNothing(t *testing.T) {
	prevGen := uint32(idGen - 1)
	virt := routing.VirtualPID(idGen-2, 9)
	f := startThree(t, prevGen)
	_, _, third, held := f.writeBefore(t, virt, 3)
	olds := producersAnswer(f.a, func() []producerState { return []producerState{{held, 0, 2}} })
	seedPartition(t, f.b)
	f.switchTo(idGen, "b")

	f.cutOff(third, true)
	m := produceAs(t, f.addrs[third], virt)
	code := m(4, "v4") // v3 outstanding
	if err := kerr.ErrorForCode(code); code == 0 || !kerr.IsRetriable(err) {
		t.Fatalf("v4 (v3 outstanding) through a member cut off from the others: %v, want a retriable refusal", err)
	}
	f.cutOff(third, false)
	if code := m(4, "v4"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("v4 (v3 outstanding) once the member sees the others: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	if olds.Load() == 0 {
		t.Fatal("cluster a was never asked where the producer stopped")
	}
	if code := m(3, "v3"); code != 0 {
		t.Fatalf("v3, the next: %v", kerr.ErrorForCode(code))
	}
	if code := m(4, "v4"); code != 0 {
		t.Fatalf("v4 after v3: %v", kerr.ErrorForCode(code))
	}
	if got := readCommitted(t, f.b); fmt.Sprint(got[0]) != "[before v3 v4]" {
		t.Fatalf("b's t[0] holds %q; want [before v3 v4]", got[0])
	}
}

// A Produce refused after its batch headers were rewritten to physical
// IDs (a forced switch refusing what the old cluster answered) leaves its
// gaps under the IDs the client sends, so that its next batches meet
// them. They were noted under the physical IDs, which no client sends,
// and the 30-minute forced chaos run wrote a producer's batch first under
// a fresh ID while the one before it, refused so, was still to come.
func TestRefusedAfterRewriteKeepsTheClientsID(t *testing.T) {
	var r remappedPIDs
	gen := uint32(idGen)
	native := routing.VirtualPID(gen, 41)
	stale := routing.VirtualPID(gen-1, 9) // written under 77, allocated for it
	in := kmsg.NewPtrProduceRequest()
	in.Acks = -1
	in.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{
		{Partition: 0, Records: valueBatch(41, 0, 3, false, "n3")},
		{Partition: 1, Records: valueBatch(77, 0, 5, false, "s5")},
	}}}
	req := &request{state: routing.State{Generation: gen}, physicalIDs: true,
		remaps: []remapBatch{{key: gapKey{virt: stale, topic: "t", partition: 1}, phys: 77, seq: 5}}}
	r.refuseUnwritten(gen, req, in, kerr.OutOfOrderSequenceNumber.Code, func(int, int32) bool { return true })
	if r.blocks(gen, gapKey{virt: native, topic: "t", partition: 0}, 0, 4) != kerr.OutOfOrderSequenceNumber.Code {
		t.Error("the native producer's next batch does not wait for the refused one")
	}
	if r.blocks(gen, gapKey{virt: stale, topic: "t", partition: 1}, 0, 6) != kerr.OutOfOrderSequenceNumber.Code {
		t.Error("the remapped producer's next batch does not wait for the refused one")
	}
}

// three is a fleet of three members over clusters a (active) and b, under
// a generation, asking each other through peers.
type three struct {
	a, b    *kfake.Cluster
	peers   *lockedPeers
	members [3]*Server
	addrs   [3]string
	tables  [3]*routing.Table
	fleets  [3]*routing.StaticBrokerSet // each member's view
	gen     uint32
}

// threeBrokers are the members of a three.
var threeBrokers = []routing.Broker{{NodeID: 0, Host: "127.0.0.1", Port: 1},
	{NodeID: 1, Host: "127.0.0.1", Port: 2}, {NodeID: 2, Host: "127.0.0.1", Port: 3}}

func startThree(t *testing.T, gen uint32) *three {
	f := &three{gen: gen, peers: &lockedPeers{members: map[int32]*Server{}}}
	f.a = newKfake(t, 1, kfake.SeedTopics(1, "t"))
	f.b = newKfake(t, 1, kfake.SeedTopics(1, "t"))
	for id := range int32(3) {
		f.tables[id] = routing.NewTable(routing.State{Generation: gen, Active: "a"})
		f.fleets[id] = routing.NewStaticBrokerSet(threeBrokers...)
		f.members[id], f.addrs[id] = startFerry(t, f.a.ListenAddrs(), WithBrokerSet(f.fleets[id]),
			WithClusters(upstream.Config{Name: "a", Bootstrap: f.a.ListenAddrs()}, upstream.Config{Name: "b", Bootstrap: f.b.ListenAddrs()}),
			WithRoutingTable(f.tables[id]), WithPeers(peerAs{f.peers, id}))
		f.peers.set(id, f.members[id])
	}
	return f
}

// cutOff makes member id see itself alone, the others suspected (gossip
// cut), or, with on false, all three again.
func (f *three) cutOff(id int32, on bool) {
	f.peers.mu.Lock()
	defer f.peers.mu.Unlock()
	if f.peers.unreachable == nil {
		f.peers.unreachable = map[int32][]int32{}
	}
	if !on {
		f.fleets[id].Set(threeBrokers)
		f.peers.unreachable[id] = nil
		return
	}
	f.fleets[id].Set([]routing.Broker{threeBrokers[id]})
	f.peers.unreachable[id] = []int32{(id + 1) % 3, (id + 2) % 3}
}

// switchTo moves every member to generation gen, a planned switch from a
// to active.
func (f *three) switchTo(gen uint32, active string) {
	from := f.gen
	next := routing.State{Generation: gen, Active: active, Last: &routing.Switch{
		Mode: routing.Planned, From: "a", To: active, FromGeneration: &from, Outcome: routing.OutcomeSwitched}}
	for _, tb := range f.tables {
		tb.Update(next)
	}
}

// writeBefore writes v0..v(n-1) of producer virt, of an earlier
// generation, through a member other than the one allocating its IDs
// (owner); third is the member left. held is the ID written under.
func (f *three) writeBefore(t *testing.T, virt int64, n int32) (owner, writer, third int32, held int64) {
	t.Helper()
	owner, _ = f.members[0].peerOwner("pid\x00" + strconv.FormatInt(virt, 10))
	writer, third = (owner+1)%3, (owner+2)%3
	before := produceAs(t, f.addrs[writer], virt)
	for seq := range n {
		if code := before(seq, fmt.Sprintf("v%d", seq)); code != 0 {
			t.Fatalf("v%d under generation %d: %v", seq, f.gen, kerr.ErrorForCode(code))
		}
	}
	if held = f.members[writer].remapped.held(f.gen, virt); held < 0 {
		t.Fatal("no ID was allocated for the producer under the first generation")
	}
	return owner, writer, third, held
}

// A partition Ferry refused before sending keeps the client's own IDs in
// its batch headers even when the request rewrote its other partitions:
// its gap is noted under the ID as it stands. Mapped back as a rewritten
// one, a stale ID of generation 0 (the form of a physical ID) would be
// taken for this generation's and noted under an ID no client sends.
func TestRefusedBeforeRewriteKeepsTheClientsID(t *testing.T) {
	var r remappedPIDs
	gen := uint32(idGen)
	const stale = 9 // issued under generation 0; written under 77 now
	in := kmsg.NewPtrProduceRequest()
	in.Acks = -1
	in.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{
		{Partition: 0, Records: valueBatch(77, 0, 3, false, "rewritten")},
		{Partition: 1, Records: valueBatch(stale, 0, 5, false, "refused")},
	}}}
	req := &request{state: routing.State{Generation: gen}, physicalIDs: true,
		remaps: []remapBatch{{key: gapKey{virt: stale, topic: "t", partition: 0}, phys: 77, seq: 3}}}
	r.refuseUnwritten(gen, nil, in, kerr.OutOfOrderSequenceNumber.Code, func(_ int, p int32) bool { return p == 1 })
	if r.blocks(gen, gapKey{virt: stale, topic: "t", partition: 1}, 0, 6) != kerr.OutOfOrderSequenceNumber.Code {
		t.Error("the batch after the one refused before sending does not wait for it")
	}
	r.refuseUnwritten(gen, req, in, kerr.OutOfOrderSequenceNumber.Code, func(_ int, p int32) bool { return p == 0 })
	if r.blocks(gen, gapKey{virt: stale, topic: "t", partition: 0}, 0, 4) != kerr.OutOfOrderSequenceNumber.Code {
		t.Error("the batch after the one refused after sending does not wait for it")
	}
}
