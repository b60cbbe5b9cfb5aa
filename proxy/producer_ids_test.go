package proxy

import (
	"encoding/binary"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
)

// Under generation 2, a client holding identities of generation 1.
const (
	idGen        = 2
	stalePhysPID = 777777
	stalePhysEp  = 77
)

var (
	stalePID   = routing.VirtualPID(idGen-1, stalePhysPID)
	staleEpoch = routing.VirtualEpoch(idGen-1, stalePhysEp)
)

// upstreamLog records every request the fake cluster receives.
type upstreamLog struct {
	mu   sync.Mutex
	reqs []kmsg.Request
}

func (l *upstreamLog) watch(c *kfake.Cluster) {
	c.Control(func(kr kmsg.Request) (kmsg.Response, error, bool) {
		l.mu.Lock()
		l.reqs = append(l.reqs, kr)
		l.mu.Unlock()
		return nil, nil, false
	})
}

// of returns the requests of key received so far.
func (l *upstreamLog) of(key kmsg.Key) []kmsg.Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []kmsg.Request
	for _, r := range l.reqs {
		if r.Key() == int16(key) {
			out = append(out, r)
		}
	}
	return out
}

// leaks lists every producer ID or leader epoch of generation 1 that
// reached the cluster, as it was sent or as its physical part alone.
func (l *upstreamLog) leaks() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		name := kmsg.NameForKey(r.Key())
		walkFields(r, func(field string, f reflect.Value) {
			switch {
			case field == "ProducerID" && f.Kind() == reflect.Int64:
				if v := f.Int(); v == stalePID || v == stalePhysPID {
					out = append(out, name+"."+field)
				}
			case field == "ProducerIDFilters":
				for _, v := range f.Interface().([]int64) {
					if v == stalePID || v == stalePhysPID {
						out = append(out, name+"."+field)
					}
				}
			case (field == "LeaderEpoch" || field == "CurrentLeaderEpoch" || field == "LastFetchedEpoch") && f.Kind() == reflect.Int32:
				if v := int32(f.Int()); v == staleEpoch || v == stalePhysEp {
					out = append(out, name+"."+field)
				}
			case field == "Records" && f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Uint8:
				protocol.WalkBatches(f.Bytes(), func(b protocol.Batch) error {
					if v := b.ProducerID(); v == stalePID || v == stalePhysPID {
						out = append(out, name+".Records.ProducerID")
					}
					return nil
				})
			}
		})
	}
	return out
}

// idFixture: a one-broker fake cluster with topic "t" (2 partitions), a
// Ferry in front of it at generation 2, and a log of what reached the
// cluster.
func idFixture(t *testing.T) (*Server, string, *upstreamLog) {
	t.Helper()
	kf := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	log := &upstreamLog{}
	log.watch(kf)
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(routing.NewTable(routing.State{Generation: idGen, Active: "a"})))
	return s, addr, log
}

// recordBatch is one v2 batch of one record ("v") from producer pid.
func recordBatch(pid int64, epoch int16, seq int32, transactional bool) []byte {
	return valueBatch(pid, epoch, seq, transactional, "v")
}

// valueBatch is one v2 batch of one record of value v from producer pid.
func valueBatch(pid int64, epoch int16, seq int32, transactional bool, v string) []byte {
	return batchOf(pid, epoch, seq, transactional, nil, []string{v})
}

// batchOf is one uncompressed v2 batch of producer pid holding values,
// keyed by keys (nil: every key null).
func batchOf(pid int64, epoch int16, seq int32, transactional bool, keys, values []string) []byte {
	var payload []byte
	for i, v := range values {
		var body []byte
		body = append(body, 0)                     // attributes
		body = binary.AppendVarint(body, 0)        // timestamp delta
		body = binary.AppendVarint(body, int64(i)) // offset delta
		if keys == nil {
			body = binary.AppendVarint(body, -1) // key
		} else {
			body = binary.AppendVarint(body, int64(len(keys[i])))
			body = append(body, keys[i]...)
		}
		body = binary.AppendVarint(body, int64(len(v)))
		body = append(body, v...)
		body = binary.AppendVarint(body, 0) // headers
		payload = binary.AppendVarint(payload, int64(len(body)))
		payload = append(payload, body...)
	}
	var attrs int16
	if transactional {
		attrs = protocol.BatchAttrTransactional
	}
	now := time.Now().UnixMilli()
	kb := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1, Magic: 2, Attributes: attrs, FirstTimestamp: now, MaxTimestamp: now, LastOffsetDelta: int32(len(values) - 1),
		ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq, NumRecords: int32(len(values)), Records: payload,
	}
	kb.Length = int32(protocol.BatchHeaderSize - 12 + len(payload))
	b := protocol.Batch(kb.AppendTo(nil))
	b.UpdateCRC()
	return b
}

// maxVersion is the highest version of key Ferry advertises.
func maxVersion(t *testing.T, s *Server, key kmsg.Key) int16 {
	t.Helper()
	r, ok := s.Versions()[int16(key)]
	if !ok {
		t.Fatalf("%s is not advertised", kmsg.NameForKey(int16(key)))
	}
	return r.Max
}

func produceReq(s *Server, t *testing.T, txn *string, batch []byte) *kmsg.ProduceRequest {
	p := kmsg.NewPtrProduceRequest()
	p.Version = min(maxVersion(t, s, kmsg.Produce), 12) // by name
	p.TransactionID = txn
	p.Acks = -1
	p.TimeoutMillis = 5000
	p.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: batch}}}}
	return p
}

// TestOtherGenerationProducerIDs: for each request that can carry a
// producer ID of generation 1 under generation 2, the answer the client
// gets and what reached the cluster; no such ID ever reaches it.
func TestOtherGenerationProducerIDs(t *testing.T) {
	s, addr, up := idFixture(t)
	conn := dialRaw(t, addr)
	corr := int32(0)
	call := func(r kmsg.Request) kmsg.Response {
		corr++
		return rawCall(t, conn, r, corr)
	}
	txnID := "tx"

	// A fresh transactional producer under generation 2, for contrast.
	init := kmsg.NewPtrInitProducerIDRequest()
	init.Version = maxVersion(t, s, kmsg.InitProducerID)
	init.TransactionalID = &txnID
	init.TransactionTimeoutMillis = 30000
	fresh := call(init).(*kmsg.InitProducerIDResponse)
	if fresh.ErrorCode != 0 {
		t.Fatalf("InitProducerId: %v", kerr.ErrorForCode(fresh.ErrorCode))
	}
	if _, ok := routing.PhysicalPID(idGen, fresh.ProducerID); !ok {
		t.Fatalf("InitProducerId answered producer ID %d, not one of generation %d", fresh.ProducerID, idGen)
	}

	t.Run("InitProducerId bump is a fresh init", func(t *testing.T) {
		before := len(up.of(kmsg.InitProducerID))
		r := kmsg.NewPtrInitProducerIDRequest()
		r.Version = maxVersion(t, s, kmsg.InitProducerID)
		r.TransactionalID = &txnID
		r.TransactionTimeoutMillis = 30000
		r.ProducerID, r.ProducerEpoch = stalePID, 4
		resp := call(r).(*kmsg.InitProducerIDResponse)
		if resp.ErrorCode != 0 {
			t.Fatalf("answer %v, want none", kerr.ErrorForCode(resp.ErrorCode))
		}
		if _, ok := routing.PhysicalPID(idGen, resp.ProducerID); !ok {
			t.Fatalf("answered producer ID %d, not one of generation %d", resp.ProducerID, idGen)
		}
		sent := up.of(kmsg.InitProducerID)[before:]
		if len(sent) != 1 {
			t.Fatalf("%d InitProducerId reached the cluster, want 1", len(sent))
		}
		if got := sent[0].(*kmsg.InitProducerIDRequest); got.ProducerID != -1 || got.ProducerEpoch != -1 {
			t.Fatalf("the cluster got producer ID %d epoch %d, want -1 -1", got.ProducerID, got.ProducerEpoch)
		}
	})

	local := func(name string, key kmsg.Key, r kmsg.Request, want int16) {
		t.Run(name, func(t *testing.T) {
			before := len(up.of(key))
			resp := call(r)
			codes := errorCodes(resp)
			if len(codes) == 0 {
				t.Fatal("answer has no error code")
			}
			// Every code is want, but a top-level one the
			// version does not carry (decoded as 0).
			seen := false
			for _, c := range codes {
				seen = seen || c == want
				if c != want && c != 0 {
					t.Fatalf("answer codes %v, want %v", codes, kerr.ErrorForCode(want))
				}
			}
			if !seen {
				t.Fatalf("answer codes %v, want %v", codes, kerr.ErrorForCode(want))
			}
			if n := len(up.of(key)) - before; n != 0 {
				t.Fatalf("%d requests reached the cluster, want none", n)
			}
		})
	}
	// Each transactional request below is the first to carry its
	// transactional ID with an ID of generation 1.
	apt := kmsg.NewPtrAddPartitionsToTxnRequest()
	apt.Version = 3
	apt.TransactionalID, apt.ProducerID, apt.ProducerEpoch = "tx-apt", stalePID, 4
	apt.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "t", Partitions: []int32{0, 1}}}
	local("AddPartitionsToTxn", kmsg.AddPartitionsToTxn, apt, kerr.UnknownProducerID.Code)

	aot := kmsg.NewPtrAddOffsetsToTxnRequest()
	aot.Version = maxVersion(t, s, kmsg.AddOffsetsToTxn)
	aot.TransactionalID, aot.ProducerID, aot.ProducerEpoch, aot.Group = "tx-aot", stalePID, 4, "g"
	local("AddOffsetsToTxn", kmsg.AddOffsetsToTxn, aot, 0)

	toc := kmsg.NewPtrTxnOffsetCommitRequest()
	toc.Version = maxVersion(t, s, kmsg.TxnOffsetCommit)
	toc.TransactionalID, toc.ProducerID, toc.ProducerEpoch, toc.Group = "tx-toc", stalePID, 4, "g"
	toc.Generation, toc.MemberID = -1, ""
	toc.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1, LeaderEpoch: staleEpoch}}}}
	local("TxnOffsetCommit", kmsg.TxnOffsetCommit, toc, kerr.UnknownMemberID.Code)

	// A transaction that adds its offsets first across the switch (as
	// Kafka Streams' commit does): the add answered, the offsets refused
	// as the group's (abortable everywhere, a task migration for Streams),
	// the commit refused, the abort answered.
	aot2 := kmsg.NewPtrAddOffsetsToTxnRequest()
	aot2.Version = maxVersion(t, s, kmsg.AddOffsetsToTxn)
	aot2.TransactionalID, aot2.ProducerID, aot2.ProducerEpoch, aot2.Group = "tx-offsets", stalePID, 4, "g"
	local("offsets first: AddOffsetsToTxn", kmsg.AddOffsetsToTxn, aot2, 0)
	toc2 := kmsg.NewPtrTxnOffsetCommitRequest()
	toc2.Version = maxVersion(t, s, kmsg.TxnOffsetCommit)
	toc2.TransactionalID, toc2.ProducerID, toc2.ProducerEpoch, toc2.Group = "tx-offsets", stalePID, 4, "g"
	toc2.Generation, toc2.MemberID = -1, ""
	toc2.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1, LeaderEpoch: staleEpoch}}}}
	local("offsets first: TxnOffsetCommit", kmsg.TxnOffsetCommit, toc2, kerr.UnknownMemberID.Code)
	commit2 := kmsg.NewPtrEndTxnRequest()
	commit2.Version = maxVersion(t, s, kmsg.EndTxn)
	commit2.TransactionalID, commit2.ProducerID, commit2.ProducerEpoch, commit2.Commit = "tx-offsets", stalePID, 4, true
	local("offsets first: EndTxn commit", kmsg.EndTxn, commit2, kerr.UnknownProducerID.Code)
	abort2 := kmsg.NewPtrEndTxnRequest()
	abort2.Version = 1
	abort2.TransactionalID, abort2.ProducerID, abort2.ProducerEpoch = "tx-offsets", stalePID, 4
	local("offsets first: EndTxn abort", kmsg.EndTxn, abort2, 0)

	commit := kmsg.NewPtrEndTxnRequest()
	commit.Version = maxVersion(t, s, kmsg.EndTxn)
	commit.TransactionalID, commit.ProducerID, commit.ProducerEpoch, commit.Commit = "tx-commit", stalePID, 4, true
	local("EndTxn commit", kmsg.EndTxn, commit, kerr.UnknownProducerID.Code)

	// The transactional ID was initialised under generation 2 (fresh):
	// any ID of generation 1 naming it is fenced, as a broker fences an
	// older epoch.
	fenced := kmsg.NewPtrAddPartitionsToTxnRequest()
	fenced.Version = 3
	fenced.TransactionalID, fenced.ProducerID, fenced.ProducerEpoch = txnID, stalePID, 4
	fenced.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: "t", Partitions: []int32{0}}}
	local("fenced once initialised", kmsg.AddPartitionsToTxn, fenced, kerr.InvalidProducerEpoch.Code)

	t.Run("EndTxn abort v5 initialises afresh", func(t *testing.T) {
		if maxVersion(t, s, kmsg.EndTxn) < 5 {
			t.Skip("EndTxn v5 is not advertised")
		}
		beforeEnd, beforeInit := len(up.of(kmsg.EndTxn)), len(up.of(kmsg.InitProducerID))
		abort := kmsg.NewPtrEndTxnRequest()
		abort.Version = maxVersion(t, s, kmsg.EndTxn)
		abort.TransactionalID, abort.ProducerID, abort.ProducerEpoch = "tx-abort5", stalePID, 4
		resp := call(abort).(*kmsg.EndTxnResponse)
		if resp.ErrorCode != 0 {
			t.Fatalf("answer %v, want none", kerr.ErrorForCode(resp.ErrorCode))
		}
		if _, ok := routing.PhysicalPID(idGen, resp.ProducerID); !ok || resp.ProducerID < 0 {
			t.Fatalf("EndTxn v%d answered producer ID %d, want one of generation %d", abort.Version, resp.ProducerID, idGen)
		}
		if n := len(up.of(kmsg.EndTxn)) - beforeEnd; n != 0 {
			t.Fatalf("%d EndTxn reached the cluster, want none", n)
		}
		sent := up.of(kmsg.InitProducerID)[beforeInit:]
		if len(sent) == 0 {
			t.Fatal("no InitProducerId fenced the transactional ID on the cluster")
		}
		for _, r := range sent {
			r := r.(*kmsg.InitProducerIDRequest)
			if r.TransactionalID == nil || *r.TransactionalID != "tx-abort5" || r.ProducerID != -1 || r.TransactionTimeoutMillis != defaultTxnTimeout {
				t.Fatalf("the cluster got InitProducerId %+v, want a fresh init of %q with Kafka's default timeout", r, "tx-abort5")
			}
		}
	})

	t.Run("EndTxn abort v1 answered alone", func(t *testing.T) {
		before := len(up.of(kmsg.EndTxn)) + len(up.of(kmsg.InitProducerID))
		abort := kmsg.NewPtrEndTxnRequest()
		abort.Version = 1
		abort.TransactionalID, abort.ProducerID, abort.ProducerEpoch = "tx-abort1", stalePID, 4
		if resp := call(abort).(*kmsg.EndTxnResponse); resp.ErrorCode != 0 {
			t.Fatalf("answer %v, want none", kerr.ErrorForCode(resp.ErrorCode))
		}
		if n := len(up.of(kmsg.EndTxn)) + len(up.of(kmsg.InitProducerID)) - before; n != 0 {
			t.Fatalf("%d requests reached the cluster, want none", n)
		}
	})

	t.Run("Produce transactional", func(t *testing.T) {
		before := len(up.of(kmsg.Produce))
		txn := "tx-produce"
		resp := call(produceReq(s, t, &txn, recordBatch(stalePID, 4, 0, true))).(*kmsg.ProduceResponse)
		p := resp.Topics[0].Partitions[0]
		if p.ErrorCode != kerr.UnknownProducerID.Code || p.LogStartOffset != -2 {
			t.Fatalf("answer %v log start %d, want UNKNOWN_PRODUCER_ID and -2", kerr.ErrorForCode(p.ErrorCode), p.LogStartOffset)
		}
		if n := len(up.of(kmsg.Produce)) - before; n != 0 {
			t.Fatalf("%d produces reached the cluster, want none", n)
		}
	})

	t.Run("Produce idempotent writes under a new ID", func(t *testing.T) {
		// The producer wrote to the partition before the switch (its
		// sequence is 40): the log is not empty.
		if p := call(produceReq(s, t, nil, recordBatch(-1, -1, -1, false))).(*kmsg.ProduceResponse).Topics[0].Partitions[0]; p.ErrorCode != 0 || p.BaseOffset != 0 {
			t.Fatalf("first record: %v at offset %d", kerr.ErrorForCode(p.ErrorCode), p.BaseOffset)
		}
		before := len(up.of(kmsg.Produce))
		var pids []int64
		for seq := int32(40); seq < 43; seq++ {
			resp := call(produceReq(s, t, nil, recordBatch(stalePID, 4, seq, false))).(*kmsg.ProduceResponse)
			p := resp.Topics[0].Partitions[0]
			if p.ErrorCode != 0 || p.BaseOffset != int64(seq-39) {
				t.Fatalf("sequence %d: %v at offset %d, want none at %d", seq, kerr.ErrorForCode(p.ErrorCode), p.BaseOffset, seq-39)
			}
		}
		for _, r := range up.of(kmsg.Produce)[before:] {
			protocol.WalkBatches(r.(*kmsg.ProduceRequest).Topics[0].Partitions[0].Records, func(b protocol.Batch) error {
				pids = append(pids, b.ProducerID())
				return nil
			})
		}
		if len(pids) != 3 || pids[0] != pids[1] || pids[1] != pids[2] || pids[0] < 0 || pids[0] == stalePhysPID {
			t.Fatalf("the cluster got producer IDs %v, want one new ID for all three batches", pids)
		}
	})

	t.Run("Fetch LastFetchedEpoch", func(t *testing.T) {
		before := len(up.of(kmsg.Fetch))
		f := kmsg.NewPtrFetchRequest()
		f.Version = min(maxVersion(t, s, kmsg.Fetch), 12)
		f.ReplicaID, f.MaxBytes, f.SessionEpoch = -1, 1<<20, -1
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes, fp.CurrentLeaderEpoch, fp.LastFetchedEpoch = 0, 0, 1<<20, -1, staleEpoch
		f.Topics = []kmsg.FetchRequestTopic{{Topic: "t", Partitions: []kmsg.FetchRequestTopicPartition{fp}}}
		resp := call(f).(*kmsg.FetchResponse)
		if c := resp.Topics[0].Partitions[0].ErrorCode; c != 0 {
			t.Fatalf("answer %v, want none", kerr.ErrorForCode(c))
		}
		sent := up.of(kmsg.Fetch)[before:]
		if len(sent) != 1 {
			t.Fatalf("%d fetches reached the cluster, want 1", len(sent))
		}
		if e := sent[0].(*kmsg.FetchRequest).Topics[0].Partitions[0].LastFetchedEpoch; e != -1 {
			t.Fatalf("the cluster got LastFetchedEpoch %d, want -1", e)
		}
	})

	t.Run("ListTransactions filters", func(t *testing.T) {
		lt := func(filters ...int64) (*kmsg.ListTransactionsResponse, []kmsg.Request) {
			before := len(up.of(kmsg.ListTransactions))
			r := kmsg.NewPtrListTransactionsRequest()
			r.Version = maxVersion(t, s, kmsg.ListTransactions)
			r.ProducerIDFilters = filters
			resp := call(r).(*kmsg.ListTransactionsResponse)
			return resp, up.of(kmsg.ListTransactions)[before:]
		}
		resp, sent := lt(stalePID)
		if resp.ErrorCode != 0 || len(resp.TransactionStates) != 0 || len(sent) != 0 {
			t.Fatalf("only a stale filter: error %d, %d transactions, %d requests upstream; want an empty answer from Ferry", resp.ErrorCode, len(resp.TransactionStates), len(sent))
		}
		_, sent = lt(stalePID, fresh.ProducerID)
		phys, _ := routing.PhysicalPID(idGen, fresh.ProducerID)
		if len(sent) == 0 {
			t.Fatal("nothing reached the cluster")
		}
		for _, r := range sent {
			if f := r.(*kmsg.ListTransactionsRequest).ProducerIDFilters; len(f) != 1 || f[0] != phys {
				t.Fatalf("the cluster got filters %v, want [%d]", f, phys)
			}
		}
	})

	if leaks := up.leaks(); len(leaks) > 0 {
		t.Fatalf("identities of generation 1 reached the cluster: %v", leaks)
	}
}
