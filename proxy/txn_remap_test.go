package proxy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
)

// staleTxnClient speaks as kafkajs does after a switch: transactional ID
// txnID, the producer ID and epoch of generation 1 it got at connect
// (stalePID, epoch), EndTxn v1, AddPartitionsToTxn v3, and its own
// per-partition sequences, which it never resets.
type staleTxnClient struct {
	t    *testing.T
	s    *Server
	conn net.Conn
	// pconn, when set, carries the produce requests (another member of
	// a fleet: the partitions' leader, not the coordinator).
	pconn net.Conn
	corr  int32
	txnID string
	epoch int16
	seq   map[int32]int32
	// clientID is sent in each request header ("raw" when empty).
	clientID string
}

func (k *staleTxnClient) call(r kmsg.Request) kmsg.Response {
	k.t.Helper()
	k.corr++
	if k.clientID == "" {
		return rawCall(k.t, k.conn, r, k.corr)
	}
	b := protocol.AppendSize(nil)
	b = protocol.AppendRequestHeader(b, r, k.corr, k.clientID)
	b = r.AppendTo(b)
	protocol.FinishSize(b, 0)
	k.conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := k.conn.Write(b); err != nil {
		k.t.Fatal(err)
	}
	resp := r.ResponseKind()
	resp.SetVersion(r.GetVersion())
	if err := resp.ReadFrom(readResp(k.t, k.conn)[protocol.ResponseHeaderSize(r.Key(), r.GetVersion()):]); err != nil {
		k.t.Fatal(err)
	}
	return resp
}

// addPartitions answers AddPartitionsToTxn for partitions of "t".
func (k *staleTxnClient) addPartitions(parts ...int32) int16 {
	k.t.Helper()
	r := kmsg.NewPtrAddPartitionsToTxnRequest()
	r.Version = 3
	r.TransactionalID, r.ProducerID, r.ProducerEpoch = k.txnID, stalePID, k.epoch
	r.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "t", Partitions: parts}}
	for _, t := range k.call(r).(*kmsg.AddPartitionsToTxnResponse).Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return p.ErrorCode
			}
		}
	}
	return 0
}

// produce sends one record to each partition named in vals (one
// request), each at the partition's next sequence, and returns each
// partition's answer; the sequences advance on success only, as kafkajs
// rolls them back on an error.
func (k *staleTxnClient) produce(vals map[int32]string) map[int32]kmsg.ProduceResponseTopicPartition {
	k.t.Helper()
	p := kmsg.NewPtrProduceRequest()
	p.Version = min(maxVersion(k.t, k.s, kmsg.Produce), 7) // kafkajs's
	p.TransactionID = &k.txnID
	p.Acks, p.TimeoutMillis = -1, 5000
	pt := kmsg.ProduceRequestTopic{Topic: "t"}
	for part, v := range vals {
		pt.Partitions = append(pt.Partitions, kmsg.ProduceRequestTopicPartition{Partition: part, Records: valueBatch(stalePID, k.epoch, k.seq[part], true, v)})
	}
	p.Topics = []kmsg.ProduceRequestTopic{pt}
	out := map[int32]kmsg.ProduceResponseTopicPartition{}
	conn := k.conn
	if k.pconn != nil {
		conn = k.pconn
	}
	k.corr++
	for _, t := range rawCall(k.t, conn, p, k.corr).(*kmsg.ProduceResponse).Topics {
		for _, rp := range t.Partitions {
			out[rp.Partition] = rp
			if rp.ErrorCode == 0 {
				k.seq[rp.Partition]++
			}
		}
	}
	return out
}

func (k *staleTxnClient) endTxn(commit bool) int16 {
	k.t.Helper()
	r := kmsg.NewPtrEndTxnRequest()
	r.Version = 1
	r.TransactionalID, r.ProducerID, r.ProducerEpoch, r.Commit = k.txnID, stalePID, k.epoch, commit
	return k.call(r).(*kmsg.EndTxnResponse).ErrorCode
}

// txnFixture: idFixture with the fake cluster itself.
func txnFixture(t *testing.T) (*Server, string, *kfake.Cluster, *upstreamLog) {
	t.Helper()
	kf := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	log := &upstreamLog{}
	log.watch(kf)
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})))
	return s, addr, kf, log
}

// readCommitted reads every committed value of "t" directly from the
// cluster, per partition.
func readCommitted(t *testing.T, kf *kfake.Cluster) map[int32][]string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kf.ListenAddrs()...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"t": {0: kgo.NewOffset().AtStart(), 1: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lso := map[int32]int64{}
	offs, err := kadm.NewClient(cl).ListEndOffsets(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	offs.Each(func(o kadm.ListedOffset) { lso[o.Partition] = o.Offset })
	out := map[int32][]string{}
	next := map[int32]int64{}
	for {
		done := true
		for p, end := range lso {
			done = done && next[p] >= end
		}
		if done {
			return out
		}
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading t: %v (read %v of ends %v)", err, next, lso)
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, r := range p.Records {
				out[r.Partition] = append(out[r.Partition], string(r.Value))
			}
			// Markers and aborted records are skipped: the high
			// watermark says how far the fetch got.
			next[p.Partition] = max(next[p.Partition], p.HighWatermark)
			if len(p.Records) > 0 {
				next[p.Partition] = max(next[p.Partition], p.Records[len(p.Records)-1].Offset+1)
			}
		})
	}
}

// upstreamBatches lists what the cluster received in transactional
// batches of "t" since the request count before: partition, producer ID,
// epoch, base sequence.
func upstreamBatches(up *upstreamLog, before int) []string {
	var out []string
	for _, r := range up.of(kmsg.Produce)[before:] {
		for _, t := range r.(*kmsg.ProduceRequest).Topics {
			for _, p := range t.Partitions {
				protocol.WalkBatches(p.Records, func(b protocol.Batch) error {
					out = append(out, fmt.Sprintf("p%d pid %d epoch %d seq %d", p.Partition, b.ProducerID(), b.ProducerEpoch(), b.BaseSequence()))
					return nil
				})
			}
		}
	}
	return out
}

// TestStaleTransactionalProducerCarriesOn: a transactional producer that
// never learns a new producer ID (kafkajs) keeps the generation-1 ID under
// generation 2. Its transactional ID held state on this cluster before (a
// failback): its own producer ID there, with sequences on both
// partitions. It gets one abortable error; then its transactions commit
// and abort under the ID and epoch Ferry initialised, each partition's
// sequences sent from 0 (the broker wants 0 from a new epoch), a retried
// batch is not written twice, and a read_committed reader sees exactly the
// committed records.
func TestStaleTransactionalProducerCarriesOn(t *testing.T) {
	s, addr, kf, up := txnFixture(t)
	staleTransactionalProducerCarriesOn(t, s, addr, addr, kf, up)
}

// TestStaleTransactionalProducerAcrossMembers is the same through a fleet of
// two members: the coordinator requests reach the member the transactional
// ID hashes to, the produce requests the other one, which asks the first
// for the mapping (txn_fleet.go). Kept by each member on its own, the
// mapping was initialised twice, each init fencing the other's, and every
// transaction failed.
func TestStaleTransactionalProducerAcrossMembers(t *testing.T) {
	const txnID = "kjs"
	kf := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	up := &upstreamLog{}
	up.watch(kf)
	fleet, members, addrs := twoMembers(t, kf)
	owner := fleet.Owner("coordinator\x00" + txnID)
	other := 1 - owner
	staleTransactionalProducerCarriesOn(t, members[owner], addrs[owner], addrs[other], kf, up)
	if n := members[other].txnsHeld(); n != 0 {
		t.Fatalf("the member that only saw produce requests holds %d mappings, want none (the owner keeps them)", n)
	}
}

// twoMembers starts a fleet of two members in front of kf, under
// generation idGen, each reaching the other through inProcessPeers.
func twoMembers(t *testing.T, kf *kfake.Cluster) (*routing.StaticBrokerSet, map[int32]*Server, map[int32]string) {
	t.Helper()
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1}, routing.Broker{NodeID: 1, Host: "127.0.0.1", Port: 2})
	members := map[int32]*Server{}
	addrs := map[int32]string{}
	for id := range int32(2) {
		members[id], addrs[id] = startFerry(t, kf.ListenAddrs(), WithBrokerSet(fleet),
			WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})),
			WithPeers(inProcessPeers{self: id, members: members}))
	}
	return fleet, members, addrs
}

// inProcessPeers calls the other members' HandleTxnCall directly.
type inProcessPeers struct {
	self    int32
	members map[int32]*Server
}

func (p inProcessPeers) Self() int32 { return p.self }

// Unreachable: every member of the map is reachable.
func (p inProcessPeers) Unreachable() []int32 { return nil }

func (p inProcessPeers) Call(ctx context.Context, to int32, kind string, body []byte) ([]byte, error) {
	if kind != TxnCallKind {
		return nil, fmt.Errorf("no handler for %q", kind)
	}
	return p.members[to].HandleTxnCall(ctx, p.self, body)
}

// txnsHeld is how many transactional IDs this member holds a mapping for.
func (s *Server) txnsHeld() int {
	s.txns.mu.Lock()
	defer s.txns.mu.Unlock()
	if s.txns.m == nil {
		return 0
	}
	return s.txns.m.Len()
}

// staleTransactionalProducerCarriesOn: the client sends its coordinator
// requests to coordAddr and its produce requests to produceAddr; s serves
// coordAddr.
func staleTransactionalProducerCarriesOn(t *testing.T, s *Server, coordAddr, produceAddr string, kf *kfake.Cluster, up *upstreamLog) {
	const txnID = "kjs"

	// Before the switches: the transactional ID wrote on this cluster.
	direct, err := kgo.NewClient(kgo.SeedBrokers(kf.ListenAddrs()...), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic("t"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := direct.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i, p := range []int32{0, 0, 1} {
		if err := direct.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte(fmt.Sprintf("before-%d", i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := direct.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	direct.Close()
	beforeBatches := upstreamBatches(up, 0)
	if len(beforeBatches) == 0 {
		t.Fatal("the direct producer's batches were not seen")
	}
	var oldEpoch int16
	for _, r := range up.of(kmsg.Produce) {
		protocol.WalkBatches(r.(*kmsg.ProduceRequest).Topics[0].Partitions[0].Records, func(b protocol.Batch) error {
			oldEpoch = b.ProducerEpoch()
			return nil
		})
	}

	k := &staleTxnClient{t: t, s: s, conn: dialRaw(t, coordAddr), txnID: txnID, epoch: 4, seq: map[int32]int32{0: 57, 1: 12}}
	if produceAddr != coordAddr {
		k.pconn = dialRaw(t, produceAddr)
	}
	nInit, nAdd, nProduce, nEnd := len(up.of(kmsg.InitProducerID)), len(up.of(kmsg.AddPartitionsToTxn)), len(up.of(kmsg.Produce)), len(up.of(kmsg.EndTxn))

	// The first transaction after the switch: refused, abortable.
	if code := k.addPartitions(0, 1); code != kerr.UnknownProducerID.Code {
		t.Fatalf("first AddPartitionsToTxn: %v, want UNKNOWN_PRODUCER_ID", kerr.ErrorForCode(code))
	}
	if n := len(up.of(kmsg.AddPartitionsToTxn)) - nAdd; n != 0 {
		t.Fatalf("%d AddPartitionsToTxn reached the cluster, want none", n)
	}
	// kafkajs aborts a transaction with no partition added without a
	// request, and begins the next one.

	// Transaction 1: committed.
	if code := k.addPartitions(0, 1); code != 0 {
		t.Fatalf("AddPartitionsToTxn after the error: %v", kerr.ErrorForCode(code))
	}
	inits := up.of(kmsg.InitProducerID)[nInit:]
	if len(inits) != 1 {
		t.Fatalf("%d InitProducerId reached the cluster, want 1", len(inits))
	}
	if r := inits[0].(*kmsg.InitProducerIDRequest); r.TransactionalID == nil || *r.TransactionalID != txnID || r.ProducerID != -1 {
		t.Fatalf("the cluster got InitProducerId %+v, want a fresh init of %q", r, txnID)
	}
	adds := up.of(kmsg.AddPartitionsToTxn)[nAdd:]
	if len(adds) != 1 {
		t.Fatalf("%d AddPartitionsToTxn reached the cluster, want 1", len(adds))
	}
	physPID, physEpoch := adds[0].(*kmsg.AddPartitionsToTxnRequest).ProducerID, adds[0].(*kmsg.AddPartitionsToTxnRequest).ProducerEpoch
	if physEpoch <= oldEpoch {
		t.Fatalf("the mapping's epoch %d is not above the transactional ID's epoch before, %d", physEpoch, oldEpoch)
	}
	for part, v := range []string{"a1", "b1"} {
		if p := k.produce(map[int32]string{int32(part): v})[int32(part)]; p.ErrorCode != 0 {
			t.Fatalf("produce %s: %v", v, kerr.ErrorForCode(p.ErrorCode))
		}
	}
	a2 := k.produce(map[int32]string{0: "a2"})[0]
	if a2.ErrorCode != 0 {
		t.Fatalf("produce a2: %v", kerr.ErrorForCode(a2.ErrorCode))
	}
	// A retry of a2 (the answer lost): the same sequence, the same record.
	k.seq[0]--
	if p := k.produce(map[int32]string{0: "a2"})[0]; p.ErrorCode != 0 || p.BaseOffset != a2.BaseOffset {
		t.Fatalf("retried a2: %v at offset %d, want none at %d", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset, a2.BaseOffset)
	}
	if code := k.endTxn(true); code != 0 {
		t.Fatalf("commit: %v", kerr.ErrorForCode(code))
	}

	// Transaction 2: aborted on purpose.
	if code := k.addPartitions(0); code != 0 {
		t.Fatalf("AddPartitionsToTxn: %v", kerr.ErrorForCode(code))
	}
	if p := k.produce(map[int32]string{0: "a3"})[0]; p.ErrorCode != 0 {
		t.Fatalf("produce a3: %v", kerr.ErrorForCode(p.ErrorCode))
	}
	if code := k.endTxn(false); code != 0 {
		t.Fatalf("abort: %v", kerr.ErrorForCode(code))
	}

	// Transaction 3: committed.
	if code := k.addPartitions(0); code != 0 {
		t.Fatalf("AddPartitionsToTxn: %v", kerr.ErrorForCode(code))
	}
	if p := k.produce(map[int32]string{0: "a4"})[0]; p.ErrorCode != 0 {
		t.Fatalf("produce a4: %v", kerr.ErrorForCode(p.ErrorCode))
	}
	if code := k.endTxn(true); code != 0 {
		t.Fatalf("commit: %v", kerr.ErrorForCode(code))
	}

	// What the cluster got: the mapping's ID and epoch throughout, and
	// each partition's sequences from 0.
	want := []string{}
	for _, b := range [][2]int32{{0, 0}, {1, 0}, {0, 1}, {0, 1}, {0, 2}, {0, 3}} {
		want = append(want, fmt.Sprintf("p%d pid %d epoch %d seq %d", b[0], physPID, physEpoch, b[1]))
	}
	if got := upstreamBatches(up, nProduce); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the cluster got batches\n%q\nwant\n%q", got, want)
	}
	ends := up.of(kmsg.EndTxn)[nEnd:]
	if len(ends) != 3 {
		t.Fatalf("%d EndTxn reached the cluster, want 3", len(ends))
	}
	for _, r := range ends {
		if r := r.(*kmsg.EndTxnRequest); r.ProducerID != physPID || r.ProducerEpoch != physEpoch {
			t.Fatalf("the cluster got EndTxn for %d/%d, want %d/%d", r.ProducerID, r.ProducerEpoch, physPID, physEpoch)
		}
	}

	got := readCommitted(t, kf)
	if fmt.Sprint(got[0]) != "[before-0 before-1 a1 a2 a4]" || fmt.Sprint(got[1]) != "[before-2 b1]" {
		t.Fatalf("read_committed: partition 0 %q, 1 %q; want [before-0 before-1 a1 a2 a4] and [before-2 b1]", got[0], got[1])
	}

	// An older epoch of the same ID is fenced, never mapped.
	nAdd = len(up.of(kmsg.AddPartitionsToTxn))
	zombie := &staleTxnClient{t: t, s: s, conn: k.conn, pconn: k.pconn, corr: 1000, txnID: txnID, epoch: 3, seq: map[int32]int32{}}
	if code := zombie.addPartitions(0); code != kerr.InvalidProducerEpoch.Code {
		t.Fatalf("AddPartitionsToTxn with an older epoch: %v, want INVALID_PRODUCER_EPOCH", kerr.ErrorForCode(code))
	}
	// A new producer of the transactional ID initialises it: the old one
	// is fenced from then on.
	init := kmsg.NewPtrInitProducerIDRequest()
	init.Version = maxVersion(t, s, kmsg.InitProducerID)
	init.TransactionalID = &k.txnID
	init.TransactionTimeoutMillis = 30000
	if resp := k.call(init).(*kmsg.InitProducerIDResponse); resp.ErrorCode != 0 {
		t.Fatalf("InitProducerId: %v", kerr.ErrorForCode(resp.ErrorCode))
	}
	if code := k.addPartitions(0); code != kerr.InvalidProducerEpoch.Code {
		t.Fatalf("AddPartitionsToTxn after a new producer's init: %v, want INVALID_PRODUCER_EPOCH", kerr.ErrorForCode(code))
	}
	if p := k.produce(map[int32]string{0: "late"})[0]; p.ErrorCode != kerr.InvalidProducerEpoch.Code {
		t.Fatalf("produce after a new producer's init: %v, want INVALID_PRODUCER_EPOCH", kerr.ErrorForCode(p.ErrorCode))
	}
	if n := len(up.of(kmsg.AddPartitionsToTxn)) - nAdd; n != 0 {
		t.Fatalf("%d fenced AddPartitionsToTxn reached the cluster, want none", n)
	}
	if leaks := up.leaks(); len(leaks) > 0 {
		t.Fatalf("identities of generation 1 reached the cluster: %v", leaks)
	}
}

// TestStaleTransactionHeldAcrossSwitch: a transaction the client began
// before the switch (its partition added then) cannot go on: its produce
// is refused, and so is anything but an abort until it aborts; the abort
// is answered by Ferry; the next transaction commits. The commit is
// refused UNKNOWN_PRODUCER_ID, but INVALID_PRODUCER_EPOCH to a Kafka
// Streams producer (known by its client ID), which Streams takes as a task
// migration where UNKNOWN_PRODUCER_ID would end its thread.
func TestStaleTransactionHeldAcrossSwitch(t *testing.T) {
	for _, c := range []struct {
		name, clientID, txnID string
		commit                int16 // the commit's answer
	}{
		{"kafkajs", "", "kjs-open", kerr.UnknownProducerID.Code},
		{"Kafka Streams", "streams-app-9b1c-StreamThread-1-producer", "streams-app-0-1", kerr.InvalidProducerEpoch.Code},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, addr, kf, up := txnFixture(t)
			k := &staleTxnClient{t: t, s: s, conn: dialRaw(t, addr), txnID: c.txnID, epoch: 4, seq: map[int32]int32{0: 5, 1: 9}, clientID: c.clientID}
			nUp := func() int {
				return len(up.of(kmsg.AddPartitionsToTxn)) + len(up.of(kmsg.Produce)) + len(up.of(kmsg.EndTxn))
			}
			before := nUp()
			if p := k.produce(map[int32]string{0: "lost"})[0]; p.ErrorCode != kerr.UnknownProducerID.Code || p.LogStartOffset != -2 {
				t.Fatalf("produce of the transaction held across: %v log start %d, want UNKNOWN_PRODUCER_ID, -2", kerr.ErrorForCode(p.ErrorCode), p.LogStartOffset)
			}
			// A client that carries on regardless.
			if code := k.addPartitions(1); code != kerr.UnknownProducerID.Code {
				t.Fatalf("AddPartitionsToTxn before the abort: %v, want UNKNOWN_PRODUCER_ID", kerr.ErrorForCode(code))
			}
			if code := k.endTxn(true); code != c.commit {
				t.Fatalf("commit of the transaction held across: %v, want %v", kerr.ErrorForCode(code), kerr.ErrorForCode(c.commit))
			}
			if code := k.endTxn(false); code != 0 {
				t.Fatalf("abort: %v, want none", kerr.ErrorForCode(code))
			}
			if n := nUp() - before; n != 0 {
				t.Fatalf("%d requests reached the cluster, want none", n)
			}
			if code := k.addPartitions(0); code != 0 {
				t.Fatalf("AddPartitionsToTxn after the abort: %v", kerr.ErrorForCode(code))
			}
			if p := k.produce(map[int32]string{0: "kept"})[0]; p.ErrorCode != 0 {
				t.Fatalf("produce: %v", kerr.ErrorForCode(p.ErrorCode))
			}
			if code := k.endTxn(true); code != 0 {
				t.Fatalf("commit: %v", kerr.ErrorForCode(code))
			}
			if got := readCommitted(t, kf); fmt.Sprint(got[0]) != "[kept]" || len(got[1]) != 0 {
				t.Fatalf("read_committed: %q; want [kept] on partition 0 only", got)
			}
		})
	}
}

// TestStreamsProducerClientIDs: the client IDs Kafka Streams gives its
// producers (<client.id>-StreamThread-<n>-producer) and no others.
func TestStreamsProducerClientIDs(t *testing.T) {
	for _, id := range []string{"app-7f3e-StreamThread-1-producer", "my-client-StreamThread-12-producer"} {
		if !streamsProducer(id) {
			t.Errorf("%q not taken for a Streams producer", id)
		}
	}
	for _, id := range []string{"app-StreamThread-1-consumer", "producer-1", "StreamThread-producer", "app-StreamThread-1-producer-x", ""} {
		if streamsProducer(id) {
			t.Errorf("%q taken for a Streams producer", id)
		}
	}
}

// TestStaleIdempotentProducerAcrossMembers: an idempotent producer writing
// under a producer ID of the generation before a switch (the Java producer
// never asks for a new one) has a batch written through one member, and
// retried through the other (the first died with the answer in flight, and
// the partition's leader moved). Both members write it under the one
// physical ID the client's ID hashes to, so the broker knows the retry by
// its sequence and writes it once. Allocated by each member on its own,
// the IDs differed and the retry was written a second time.
func TestStaleIdempotentProducerAcrossMembers(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	_, _, addrs := twoMembers(t, kf)
	produce := func(member int32, corr int32) kmsg.ProduceResponseTopicPartition {
		t.Helper()
		p := kmsg.NewPtrProduceRequest()
		p.Version = 7
		p.Acks, p.TimeoutMillis = -1, 5000
		p.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: valueBatch(stalePID, 0, 0, false, "once")}}}}
		return rawCall(t, dialRaw(t, addrs[member]), p, corr).(*kmsg.ProduceResponse).Topics[0].Partitions[0]
	}
	first := produce(0, 1)
	if first.ErrorCode != 0 {
		t.Fatalf("produce through member 0: %v", kerr.ErrorForCode(first.ErrorCode))
	}
	retry := produce(1, 2)
	if retry.ErrorCode != 0 && retry.ErrorCode != kerr.DuplicateSequenceNumber.Code {
		t.Fatalf("the retry through member 1: %v", kerr.ErrorForCode(retry.ErrorCode))
	}
	if o := endOffset(t, kf, "t"); o != 1 {
		t.Fatalf("the partition holds %d records after a batch and its retry through another member, want 1", o)
	}
}

// TestIdempotentBatchRefusedKeepsItsPlace: an idempotent producer of the
// generation before a switch has a batch refused because its physical ID
// could not be had yet (the member its ID hashes to had not taken the
// generation); the next batch, in flight behind it, must not be written
// first. It was: the broker takes any first sequence from an ID it holds
// no state for, so the second batch set the sequence, the refused one met
// OUT_OF_ORDER_SEQUENCE_NUMBER until the next switch's fresh ID took it,
// and the Java producer's partition held it hundreds of offsets late
// (TestFleetSwitchoverClients, "order broken").
func TestIdempotentBatchRefusedKeepsItsPlace(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1}, routing.Broker{NodeID: 1, Host: "127.0.0.1", Port: 2})
	members := map[int32]*Server{}
	addrs := map[int32]string{}
	var refuse atomic.Int32
	refuse.Store(1)
	for id := range int32(2) {
		members[id], addrs[id] = startFerry(t, kf.ListenAddrs(), WithBrokerSet(fleet),
			WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})),
			WithPeers(refusingPeers{inProcessPeers{self: id, members: members}, &refuse}))
	}
	// A partition that held records: the broker takes any first sequence
	// from a producer ID it holds no state for (kfake, as Kafka).
	seedPartition(t, kf)
	// Through the member that asks another for the client's ID.
	owner, _ := members[0].peerOwner("pid\x00" + strconv.FormatInt(stalePID, 10))
	produce := staleProduce(t, addrs[1-owner])
	if code := produce(5, "first"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the batch whose producer ID could not be had: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	if code := produce(6, "second"); code != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("the batch after the refused one: %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", kerr.ErrorForCode(code))
	}
	resendInOrder(t, kf, produce)
}

// refusingPeers refuses the first n calls allocating a producer ID.
type refusingPeers struct {
	inProcessPeers
	n *atomic.Int32
}

func (p refusingPeers) Call(ctx context.Context, to int32, kind string, body []byte) ([]byte, error) {
	if bytes.Contains(body, []byte(`"op":"pid"`)) && p.n.Add(-1) >= 0 {
		return nil, fmt.Errorf("member %d: %w (%d, asked under %d)", to, errOtherGeneration, idGen-1, idGen)
	}
	return p.inProcessPeers.Call(ctx, to, kind, body)
}

// A batch of an idempotent producer of another generation answered
// without being written — held by a switch longer than heldAnswerAfter,
// as when the write lease lapsed with the active cluster's broker down —
// keeps its place too: the batch after it, sent on the same connection
// once writes flow again, would otherwise be the first the broker sees
// under the freshly allocated ID and set its sequence there, leaving the
// held one refused OUT_OF_ORDER_SEQUENCE_NUMBER for good (seen in
// TestChaos: the Java producer retried it for minutes).
func TestIdempotentBatchHeldTooLongKeepsItsPlace(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	table := routing.NewTable(routing.State{Generation: idGen, Active: "a", Phase: routing.PhaseDraining})
	_, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(table), WithHeldAnswerAfter(200*time.Millisecond))
	seedPartition(t, kf)
	produce := staleProduce(t, addr)
	if code := produce(5, "first"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the held batch: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	st := table.Current()
	st.Phase = routing.PhaseServing
	table.Update(st)
	if code := produce(6, "second"); code != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("the batch after the held one: %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", kerr.ErrorForCode(code))
	}
	resendInOrder(t, kf, produce)
}

// So does one the broker answered with an error: the batches after it
// wait until it is sent again.
func TestIdempotentBatchFailedUpstreamKeepsItsPlace(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	_, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})))
	seedPartition(t, kf)
	// The broker refuses the next produce to the partition.
	refuseNextProduce(kf, 0)
	produce := staleProduce(t, addr)
	if code := produce(5, "first"); code != kerr.NotEnoughReplicas.Code {
		t.Fatalf("the batch the broker refused: %v, want NOT_ENOUGH_REPLICAS", kerr.ErrorForCode(code))
	}
	if code := produce(6, "second"); code != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("the batch after the refused one: %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", kerr.ErrorForCode(code))
	}
	resendInOrder(t, kf, produce)
}

// refuseNextProduce makes kf answer the next Produce NOT_ENOUGH_REPLICAS
// on every partition, after taking delay over it (other connections are
// served meanwhile, the same one waits).
func refuseNextProduce(kf *kfake.Cluster, delay time.Duration) {
	var failOnce atomic.Bool
	failOnce.Store(true)
	kf.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if !failOnce.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		if delay > 0 {
			kf.SleepControl(func() { time.Sleep(delay) })
		}
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// seedPartition writes "before" to t[0] directly: the broker takes any
// first sequence from a producer ID it holds no state for (kfake, as
// Kafka), on a partition that held records.
func seedPartition(t *testing.T, kf *kfake.Cluster) {
	t.Helper()
	seed := newClient(t, kf.ListenAddrs()[0], kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := seed.ProduceSync(ctx, &kgo.Record{Topic: "t", Partition: 0, Value: []byte("before")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// staleProduce returns a call producing one batch (seq, v) to t[0] through
// Ferry at addr, under an idempotent producer ID of another generation,
// and answering the partition's error code.
func staleProduce(t *testing.T, addr string) func(seq int32, v string) int16 {
	via := dialRaw(t, addr)
	via.SetDeadline(time.Now().Add(30 * time.Second))
	corr := int32(0)
	return func(seq int32, v string) int16 {
		t.Helper()
		p := kmsg.NewPtrProduceRequest()
		p.Version = 7
		p.Acks, p.TimeoutMillis = -1, 5000
		p.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: valueBatch(stalePID, 0, seq, false, v)}}}}
		corr++
		return rawCall(t, via, p, corr).(*kmsg.ProduceResponse).Topics[0].Partitions[0].ErrorCode
	}
}

// resendInOrder resends batches 5 ("first") and 6 ("second") and checks
// that t[0] holds them after "before", in order.
func resendInOrder(t *testing.T, kf *kfake.Cluster, produce func(int32, string) int16) {
	t.Helper()
	for _, b := range []struct {
		seq int32
		v   string
	}{{5, "first"}, {6, "second"}} {
		if code := produce(b.seq, b.v); code != 0 {
			t.Fatalf("resending %s: %v", b.v, kerr.ErrorForCode(code))
		}
	}
	if got := readCommitted(t, kf); fmt.Sprint(got[0]) != "[before first second]" {
		t.Fatalf("partition 0 holds %q; want [before first second]", got[0])
	}
}

// A batch refused under one generation keeps its place under the next: a
// switch between the refusal and the client's resend allocates a fresh
// ID, and the batch behind the refused one must not set its sequence.
// The gaps were dropped with each generation's IDs, and the Java
// producer's partition held the refused batch ~1,100 records late (the
// 30-minute chaos run, "4/56410 holds 338161 after 339255").
func TestIdempotentBatchRefusedKeepsItsPlaceAcrossSwitch(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	table := routing.NewTable(routing.State{Generation: idGen, Active: "a", Phase: routing.PhaseDraining})
	_, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(table), WithHeldAnswerAfter(200*time.Millisecond))
	seedPartition(t, kf)
	produce := staleProduce(t, addr)
	if code := produce(5, "first"); code != kerr.NotLeaderForPartition.Code {
		t.Fatalf("the held batch: %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(code))
	}
	table.Update(routing.State{Generation: idGen + 1, Active: "a", Phase: routing.PhaseServing})
	if code := produce(6, "second"); code != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("the batch after the held one, a switch later: %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", kerr.ErrorForCode(code))
	}
	resendInOrder(t, kf, produce)
}

// The batch behind the first one written under a fresh ID, sent on the
// same connection before the broker answered the first, waits for that
// answer: had the broker refused the first, the second would have set
// the ID's sequence and the first been written after it.
func TestIdempotentBatchBehindUnansweredFirstWaits(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	_, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})))
	seedPartition(t, kf)
	// The broker takes its time over the next produce, then refuses it.
	refuseNextProduce(kf, 500*time.Millisecond)
	// Both batches on one connection, the second sent before the first
	// is answered, as a client with several requests in flight does.
	c := dialRaw(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	for i, b := range []struct {
		seq int32
		v   string
	}{{5, "first"}, {6, "second"}} {
		p := kmsg.NewPtrProduceRequest()
		p.Version = 7
		p.Acks, p.TimeoutMillis = -1, 5000
		p.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: valueBatch(stalePID, 0, b.seq, false, b.v)}}}}
		writeReq(t, c, p, int32(i+1))
	}
	want := []int16{kerr.NotEnoughReplicas.Code, kerr.NotLeaderForPartition.Code}
	for i := range want {
		b := readResp(t, c)
		resp := kmsg.NewPtrProduceResponse()
		resp.Version = 7
		if err := resp.ReadFrom(b[protocol.ResponseHeaderSize(int16(kmsg.Produce), 7):]); err != nil {
			t.Fatal(err)
		}
		if code := resp.Topics[0].Partitions[0].ErrorCode; code != want[i] {
			t.Fatalf("batch %d sent before the first was answered: %v, want %v", i+1, kerr.ErrorForCode(code), kerr.ErrorForCode(want[i]))
		}
	}
	resendInOrder(t, kf, staleProduce(t, addr))
}

// The member a producer's ID hashes to restarts and has lost the physical
// ID it allocated; another member still writes that producer under it.
// The restarted member takes the same ID, so a batch written through the
// other member and retried through it is known by the broker for a retry.
// Allocating afresh, it wrote the batch a second time (and, had the retry
// been a later batch, could have put it ahead of an earlier one).
func TestStaleIdempotentProducerOwnerRestarted(t *testing.T) {
	kf := newKfake(t, 1, kfake.SeedTopics(1, "t"))
	fleet := routing.NewStaticBrokerSet(routing.Broker{NodeID: 0, Host: "127.0.0.1", Port: 1}, routing.Broker{NodeID: 1, Host: "127.0.0.1", Port: 2})
	peers := &lockedPeers{members: map[int32]*Server{}}
	start := func(id int32) (*Server, string) {
		s, addr := startFerry(t, kf.ListenAddrs(), WithBrokerSet(fleet),
			WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})),
			WithPeers(peerAs{peers, id}))
		peers.set(id, s)
		return s, addr
	}
	addrs := map[int32]string{}
	members := map[int32]*Server{}
	for id := range int32(2) {
		members[id], addrs[id] = start(id)
	}
	seedPartition(t, kf)
	owner, _ := members[0].peerOwner("pid\x00" + strconv.FormatInt(stalePID, 10))
	if code := staleProduce(t, addrs[1-owner])(5, "first"); code != 0 {
		t.Fatalf("produce through the member not owning the ID: %v", kerr.ErrorForCode(code))
	}
	members[owner].Close()
	_, addrs[owner] = start(owner)
	produce := staleProduce(t, addrs[owner])
	if code := produce(5, "first"); code != 0 && code != kerr.DuplicateSequenceNumber.Code {
		t.Fatalf("the retry through the restarted member: %v", kerr.ErrorForCode(code))
	}
	if code := produce(6, "second"); code != 0 {
		t.Fatalf("the next batch through the restarted member: %v", kerr.ErrorForCode(code))
	}
	if got := readCommitted(t, kf); fmt.Sprint(got[0]) != "[before first second]" {
		t.Fatalf("partition 0 holds %q; want [before first second]", got[0])
	}
}

// lockedPeers is inProcessPeers whose members can be replaced (restarted)
// while others call them.
type lockedPeers struct {
	mu          sync.Mutex
	members     map[int32]*Server
	silent      map[int32]bool    // calls to these members fail
	unreachable map[int32][]int32 // the members each member cannot ask
}

// silence makes calls to member id fail (it is paused, or cut off) or,
// with off false, answer again.
func (p *lockedPeers) silence(id int32, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.silent == nil {
		p.silent = map[int32]bool{}
	}
	p.silent[id] = on
}

func (p *lockedPeers) set(id int32, s *Server) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.members[id] = s
}

// peerAs is lockedPeers as member self sees them.
type peerAs struct {
	*lockedPeers
	self int32
}

func (p peerAs) Self() int32 { return p.self }

func (p peerAs) Unreachable() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int32(nil), p.unreachable[p.self]...)
}

func (p peerAs) Call(ctx context.Context, to int32, kind string, body []byte) ([]byte, error) {
	if kind != TxnCallKind {
		return nil, fmt.Errorf("no handler for %q", kind)
	}
	p.mu.Lock()
	s, silent := p.members[to], p.silent[to]
	p.mu.Unlock()
	if silent {
		return nil, fmt.Errorf("member %d does not answer", to)
	}
	return s.HandleTxnCall(ctx, p.self, body)
}
