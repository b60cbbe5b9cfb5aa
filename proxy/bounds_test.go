package proxy

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// fakeClock is a settable clock for txnRemaps.now.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestTxnMappingsNeverDropALiveFence: with the table of transactional IDs
// seen since the switch full, an entry whose producer is still
// transacting is never dropped for another, so a zombie of the earlier
// generation stays fenced (INVALID_PRODUCER_EPOCH) instead of being mapped
// (which would re-initialise the transactional ID and fence the live
// producer). A new transactional ID is refused, retriable, while no entry
// has been idle past txnRemapIdle; idle ones are dropped for new ones,
// oldest first, each counted.
func TestTxnMappingsNeverDropALiveFence(t *testing.T) {
	const gen = idGen
	clock := &fakeClock{}
	evicted := prometheus.NewCounter(prometheus.CounterOpts{Name: "evicted"})
	var full atomic.Int32
	r := &txnRemaps{now: clock.now, evicted: evicted, full: func(int16) { full.Add(1) }}
	zombie := routing.VirtualPID(gen-1, 42)

	// The live producer initialised its transactional ID after the
	// switch; as many others follow at once and fill the table.
	if !r.own(gen, "live") {
		t.Fatal("the first transactional ID was refused")
	}
	for i := range maxTxnRemaps - 1 {
		if !r.own(gen, fmt.Sprint("early-", i)) {
			t.Fatalf("transactional ID %d of %d refused before the table was full", i+2, maxTxnRemaps)
		}
	}
	// Many more within the idle bound: every one refused, none dropped.
	for i := range 2 * maxTxnRemaps {
		if r.own(gen, fmt.Sprint("late-", i)) {
			t.Fatalf("transactional ID late-%d was given room in a table full of entries used within %v: one was dropped", i, txnRemapIdle)
		}
	}
	if _, _, _, code := r.produce(gen, "stale-new", routing.VirtualPID(gen-1, 9), 0, "t-0", 0); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("a produce needing a new mapping in a full table got %v, want NOT_LEADER_OR_FOLLOWER (retried)", kerr.ErrorForCode(code))
	}
	if n := testutil.ToFloat64(evicted); n != 0 {
		t.Fatalf("%v entries evicted while none was idle", n)
	}
	if full.Load() != 1 {
		t.Fatalf("%d produce refusals counted, want 1", full.Load())
	}
	if _, _, _, code := r.produce(gen, "live", zombie, 3, "t-0", 0); code != kerr.InvalidProducerEpoch.Code {
		t.Fatalf("the zombie's produce got %v, want INVALID_PRODUCER_EPOCH (fenced)", kerr.ErrorForCode(code))
	}

	// The live producer goes on transacting; the others stop. Past the
	// idle bound the others make room, oldest first; the live one's
	// fence stays.
	clock.advance(txnRemapIdle * 2 / 3)
	r.touch(gen, "live")
	clock.advance(txnRemapIdle/2 + time.Second)
	for i := range maxTxnRemaps - 1 {
		if !r.own(gen, fmt.Sprint("next-", i)) {
			t.Fatalf("transactional ID next-%d refused with %d idle entries left", i, maxTxnRemaps-1-i)
		}
	}
	if n := testutil.ToFloat64(evicted); n != maxTxnRemaps-1 {
		t.Fatalf("%v entries evicted, want %d (the idle ones)", n, maxTxnRemaps-1)
	}
	if r.own(gen, "one-more") {
		t.Fatal("the live producer's entry was dropped for a new one")
	}
	if _, _, _, code := r.produce(gen, "live", zombie, 3, "t-0", 0); code != kerr.InvalidProducerEpoch.Code {
		t.Fatalf("after the idle entries went, the zombie's produce got %v, want INVALID_PRODUCER_EPOCH (fenced)", kerr.ErrorForCode(code))
	}
}

// TestTxnMappingsFullRefusedRetriably: through Ferry, with the table full
// of transactional IDs in use, a new transactional ID's InitProducerId and
// a producer of the earlier generation's AddPartitionsToTxn are answered
// COORDINATOR_LOAD_IN_PROGRESS (every client retries it), counted in
// ferry_refusals_total{reason="txn_mappings_full"}; once entries are idle
// the same InitProducerId succeeds and the eviction is counted.
func TestTxnMappingsFullRefusedRetriably(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})))
	clock := &fakeClock{}
	s.txns.mu.Lock()
	s.txns.now = clock.now
	s.txns.mu.Unlock()
	for i := range maxTxnRemaps {
		if !s.txns.own(idGen, fmt.Sprint("in-use-", i)) {
			t.Fatalf("transactional ID %d refused before the table was full", i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// AddPartitionsToTxn v3: a client's (v4+ is the brokers').
	cl := newClient(t, addr, kgo.MaxVersions(kversion.V3_5_0()))
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// One connection, no client-side retries: the answer as sent.
	b := cl.Broker(0)
	initTxn := func() int16 {
		t.Helper()
		txnID := "new-txn"
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = &txnID
		req.TransactionTimeoutMillis = 30000
		req.ProducerID, req.ProducerEpoch = -1, -1
		resp, err := b.Request(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.(*kmsg.InitProducerIDResponse).ErrorCode
	}
	if code := initTxn(); code != kerr.CoordinatorLoadInProgress.Code {
		t.Fatalf("InitProducerId of a new transactional ID in a full table: %v, want COORDINATOR_LOAD_IN_PROGRESS", kerr.ErrorForCode(code))
	}
	add := kmsg.NewPtrAddPartitionsToTxnRequest()
	add.Version = 3
	add.TransactionalID, add.ProducerID, add.ProducerEpoch = "stale-txn", stalePID, 0
	add.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "t", Partitions: []int32{0}}}
	resp, err := b.Request(ctx, add)
	if err != nil {
		t.Fatal(err)
	}
	answered := 0
	for _, tp := range resp.(*kmsg.AddPartitionsToTxnResponse).Topics {
		for _, p := range tp.Partitions {
			answered++
			if p.ErrorCode != kerr.CoordinatorLoadInProgress.Code {
				t.Fatalf("AddPartitionsToTxn of an earlier generation's producer in a full table: %v, want COORDINATOR_LOAD_IN_PROGRESS", kerr.ErrorForCode(p.ErrorCode))
			}
		}
	}
	if answered != 1 {
		t.Fatalf("AddPartitionsToTxn v%d answered %d partitions, want 1", resp.GetVersion(), answered)
	}
	for _, api := range []string{"InitProducerID", "AddPartitionsToTxn"} {
		if n := testutil.ToFloat64(s.metrics.refusals.WithLabelValues(api, reasonTxnMappingsFull)); n != 1 {
			t.Errorf("ferry_refusals_total{api=%s,reason=txn_mappings_full} = %v, want 1", api, n)
		}
	}

	clock.advance(txnRemapIdle + time.Second)
	if code := initTxn(); code != 0 {
		t.Fatalf("InitProducerId once the table's entries are idle: %v, want success", kerr.ErrorForCode(code))
	}
	if n := testutil.ToFloat64(s.metrics.evictions.WithLabelValues(stateTxnMappings)); n != 1 {
		t.Errorf("ferry_state_evictions_total{table=txn_mappings} = %v, want 1", n)
	}
}

// TestTxnTimeoutsBounded: the transaction timeouts remembered for Ferry's
// own init of a transactional ID after a switch are the most recent
// maxTxnTimeouts; older ones fall back to Kafka's default, counted.
func TestTxnTimeoutsBounded(t *testing.T) {
	kf := newKfake(t, 1)
	s, _ := startFerry(t, kf.ListenAddrs())
	const extra = 100
	for i := range maxTxnTimeouts + extra {
		s.noteTxnTimeout(fmt.Sprint("txn-", i), int32(1000+i%1000))
	}
	if n := s.txnTimeouts.Len(); n != maxTxnTimeouts {
		t.Fatalf("%d transaction timeouts held, want %d", n, maxTxnTimeouts)
	}
	if n := testutil.ToFloat64(s.metrics.evictions.WithLabelValues(stateTxnTimeouts)); n != extra {
		t.Fatalf("ferry_state_evictions_total{table=txn_timeouts} = %v, want %d", n, extra)
	}
	if got := s.txnTimeout("txn-0"); got != defaultTxnTimeout {
		t.Errorf("the oldest transactional ID's timeout = %d, want the default %d", got, defaultTxnTimeout)
	}
	last := maxTxnTimeouts + extra - 1
	if got := s.txnTimeout(fmt.Sprint("txn-", last)); got != int32(1000+last%1000) {
		t.Errorf("the newest transactional ID's timeout = %d, want %d", got, 1000+last%1000)
	}
}

// TestCoordinatorCacheBounded: FindCoordinator for more distinct keys than
// the cache holds (a client can name any group) is answered in full, and
// the cache keeps the most recently used maxCoordinators, the others
// dropped and counted, so the walk of it at a switch stays bounded.
func TestCoordinatorCacheBounded(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t, addr, kgo.MaxVersions(nil))
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	const extra, batch = 100, 5000
	total := upstream.MaxCoordinators + extra
	for start := 0; start < total; start += batch {
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.Version = 4
		for i := start; i < min(start+batch, total); i++ {
			req.CoordinatorKeys = append(req.CoordinatorKeys, fmt.Sprint("group-", i))
		}
		resp, err := cl.Broker(0).Request(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got := resp.(*kmsg.FindCoordinatorResponse).Coordinators
		if len(got) != len(req.CoordinatorKeys) {
			t.Fatalf("%d coordinators answered for %d keys", len(got), len(req.CoordinatorKeys))
		}
		for _, c := range got {
			if c.ErrorCode != 0 {
				t.Fatalf("%s: %v", c.Key, kerr.ErrorForCode(c.ErrorCode))
			}
		}
	}
	u := s.cluster("a")
	n := len(u.CoordinatorKeys())
	oldest := u.CachedCoordinator(0, "group-0")
	newest := u.CachedCoordinator(0, fmt.Sprint("group-", total-1))
	if n != upstream.MaxCoordinators || oldest || !newest {
		t.Fatalf("%d coordinators cached (want %d), the first key cached %v (want false), the last %v (want true)", n, upstream.MaxCoordinators, oldest, newest)
	}
	if n := testutil.ToFloat64(s.metrics.evictions.WithLabelValues(stateCoordinators)); n != extra {
		t.Fatalf("ferry_state_evictions_total{table=coordinators} = %v, want %d", n, extra)
	}
}

// TestTxnFenceKeptForAProducerStillTransacting: through Ferry, a producer
// that initialised its transactional ID after the switch and keeps
// transacting keeps its entry while the table, full, drops idle ones for
// new transactional IDs: a zombie of the earlier generation writing under
// that transactional ID is fenced (INVALID_PRODUCER_EPOCH), never mapped.
func TestTxnFenceKeptForAProducerStillTransacting(t *testing.T) {
	const txnID = "live-txn"
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})))
	clock := &fakeClock{}
	s.txns.mu.Lock()
	s.txns.now = clock.now
	s.txns.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr, kgo.MaxVersions(kversion.V3_5_0()))
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	b := cl.Broker(0)
	id := txnID
	initReq := kmsg.NewPtrInitProducerIDRequest()
	initReq.TransactionalID, initReq.TransactionTimeoutMillis = &id, 30000
	initReq.ProducerID, initReq.ProducerEpoch = -1, -1
	resp, err := b.Request(ctx, initReq)
	if err != nil {
		t.Fatal(err)
	}
	ip := resp.(*kmsg.InitProducerIDResponse)
	if ip.ErrorCode != 0 {
		t.Fatalf("the live producer's InitProducerId: %v", kerr.ErrorForCode(ip.ErrorCode))
	}
	addPartition := func(pid int64, epoch int16) int16 {
		t.Helper()
		add := kmsg.NewPtrAddPartitionsToTxnRequest()
		add.TransactionalID, add.ProducerID, add.ProducerEpoch = txnID, pid, epoch
		add.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "t", Partitions: []int32{0}}}
		resp, err := b.Request(ctx, add)
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range resp.(*kmsg.AddPartitionsToTxnResponse).Topics {
			for _, p := range tp.Partitions {
				return p.ErrorCode
			}
		}
		t.Fatalf("AddPartitionsToTxn v%d answered no partition", resp.GetVersion())
		return 0
	}
	for i := range maxTxnRemaps - 1 {
		if !s.txns.own(idGen, fmt.Sprint("other-", i)) {
			t.Fatalf("transactional ID %d refused before the table was full", i)
		}
	}
	clock.advance(txnRemapIdle * 2 / 3)
	// The live producer transacts (what kfake answers does not matter
	// here: its producer IDs are random, above the 2^48 a virtual ID
	// carries, where Kafka's count up from 0).
	addPartition(ip.ProducerID, ip.ProducerEpoch)
	clock.advance(txnRemapIdle/2 + time.Second)
	for i := range maxTxnRemaps - 1 {
		if !s.txns.own(idGen, fmt.Sprint("new-", i)) {
			t.Fatalf("new transactional ID %d refused with idle entries left", i)
		}
	}
	if code := addPartition(stalePID, 0); code != kerr.InvalidProducerEpoch.Code {
		t.Fatalf("the zombie's AddPartitionsToTxn: %v, want INVALID_PRODUCER_EPOCH (fenced)", kerr.ErrorForCode(code))
	}
}

// TestIdempotentMappingsKeepTheActive: the producer IDs allocated for
// idempotent producers writing with an ID of an earlier generation are
// bounded, and the one dropped for a new producer is the least recently
// used, counted: a producer still writing keeps its ID (one dropped would
// be allocated anew, and a batch retried across that written twice).
func TestIdempotentMappingsKeepTheActive(t *testing.T) {
	evicted := prometheus.NewCounter(prometheus.CounterOpts{Name: "evicted"})
	r := &remappedPIDs{evicted: evicted}
	ctx := context.Background()
	var allocs atomic.Int64
	alloc := func(context.Context) (int64, error) { return allocs.Add(1), nil }
	const gen = idGen
	active := routing.VirtualPID(gen-1, 1)
	first, err := r.physicalBy(ctx, gen, active, alloc)
	if err != nil {
		t.Fatal(err)
	}
	const extra = 1000
	for i := range int64(3*maxRemapped + extra) {
		if _, err := r.physicalBy(ctx, gen, routing.VirtualPID(gen-1, 100+i), alloc); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			// The active producer writes on.
			if got, _ := r.physicalBy(ctx, gen, active, alloc); got != first {
				t.Fatalf("after %d other producers the active one's ID is %d, was %d: its mapping was dropped", i, got, first)
			}
		}
	}
	if n := testutil.ToFloat64(evicted); n != 3*maxRemapped+extra+1-maxRemapped {
		t.Fatalf("ferry_state_evictions_total{table=pid_mappings} = %v, want %d", n, 3*maxRemapped+extra+1-maxRemapped)
	}
	r.mu.Lock()
	n := r.m.Len()
	r.mu.Unlock()
	if n != maxRemapped {
		t.Fatalf("%d mappings held, want %d", n, maxRemapped)
	}
}
