package proxy

// A stress test of the produce path under broker faults: Ferry must never
// acknowledge a record at an offset where it is not. Idempotent producers
// (acks=all, many requests in flight) write through Ferry to a 3-broker
// kfake cluster while the brokers answer some produces
// NOT_LEADER_OR_FOLLOWER (a producer's first batch in a partition more
// often: a broker not yet leading) or REQUEST_TIMED_OUT (written all the
// same), delay answers (so that answers of different partitions and
// brokers come back out of order), lose answers of requests they applied,
// close connections, move partition leaders, and go down for a while (a
// broker "killed": its connections reset, dials refused, its partitions
// moved to the others). Afterwards every partition is read from kfake
// directly: each acknowledged record must be at the partition and offset
// it was acknowledged at, and after the records its producer acknowledged
// before. The producers are franz-go clients and raw pipelining ones
// (rawProducer), which send a producer's batches as librdkafka does and
// check what librdkafka takes on trust: that no later batch of theirs was
// written ahead of one refused.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/protocol"
)

func TestProduceAnswersMatchUnderFaults(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FERRY_STRESS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FERRY_STRESS_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (FERRY_STRESS_SEED=%d reproduces the faults' choices; their timing stays the machine's)", seed, seed)

	// With a lane per broker (the default) a client's connection
	// carries the partitions one broker leads, and a produce is nearly
	// always one broker's, answered by the goroutine that read it
	// (answers.go). With one lane a connection carries every partition:
	// its produces go to several brokers, each answer read by another
	// connection's reader, and out of order.
	for _, v := range []struct {
		name string
		cfg  produceStress
	}{
		{"lanes/all-partitions", produceStress{pipeliners: 6, producers: 4, records: 2500, onePart: false, batchMax: 4 << 10}},
		{"lanes/one-partition", produceStress{pipeliners: 3, producers: 3, records: 2000, onePart: true, batchMax: 512}},
		{"one-lane/all-partitions", produceStress{lanes: 1, pipeliners: 6, producers: 4, records: 2500, onePart: false, batchMax: 4 << 10}},
		{"one-lane/one-partition", produceStress{lanes: 1, pipeliners: 3, producers: 3, records: 2000, onePart: true, batchMax: 512}},
	} {
		seed++
		v.cfg.seed, v.cfg.partitions, v.cfg.produceTime, v.cfg.sessions = seed, 6, 6*time.Second, 8
		t.Run(v.name, func(t *testing.T) { runProduceStress(t, v.cfg) })
	}
}

type produceStress struct {
	seed        uint64
	lanes       int // 0: one per broker
	producers   int
	records     int // per producer
	pipeliners  int // raw pipelining producers besides (rawProducer)
	sessions    int // clients per producer, one after the other
	partitions  int32
	onePart     bool // every record to partition 0
	batchMax    int32
	produceTime time.Duration // how long the records are spread over
}

// stressCounters count the faults injected.
type stressCounters struct {
	ctlNotLeader, ctlClosed, readDelay, slowNodeDelay atomic.Int64
	ctlFirstNotLeader                                 atomic.Int64
	connDropAnswer, connDropRead, connDelay           atomic.Int64
	connKills, brokerDowns, moves                     atomic.Int64
	dialsRefused                                      atomic.Int64
}

// stressFaults is the fault injector: a kfake ListenFn whose listeners and
// connections misbehave while on, and the random choices of the control
// functions and the chaos loop.
type stressFaults struct {
	on atomic.Bool

	rmu sync.Mutex
	rng *rand.Rand

	bmu     sync.Mutex
	brokers []*faultBroker // by node ID (kfake creates node i's listener i-th)

	slowNode  atomic.Int32 // -1: none
	slowUntil atomic.Int64

	n stressCounters
}

func (f *stressFaults) float() float64 {
	f.rmu.Lock()
	defer f.rmu.Unlock()
	return f.rng.Float64()
}

func (f *stressFaults) intn(n int) int {
	f.rmu.Lock()
	defer f.rmu.Unlock()
	return f.rng.IntN(n)
}

func (f *stressFaults) chance(p float64) bool { return f.float() < p }

func (f *stressFaults) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(f.intn(int(hi-lo)+1))
}

func (f *stressFaults) listen(network, addr string) (net.Listener, error) {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	f.bmu.Lock()
	defer f.bmu.Unlock()
	b := &faultBroker{f: f, node: int32(len(f.brokers)), addr: ln.Addr(), ln: ln, closedCh: make(chan struct{}), conns: map[*faultConn]struct{}{}}
	f.brokers = append(f.brokers, b)
	return b, nil
}

func (f *stressFaults) broker(node int32) *faultBroker {
	f.bmu.Lock()
	defer f.bmu.Unlock()
	return f.brokers[node]
}

// faultBroker is one broker's listener: it can go down (its listener
// closed, so dials are refused, and its connections closed) and come back
// on the same port.
type faultBroker struct {
	f    *stressFaults
	node int32
	addr net.Addr

	mu       sync.Mutex
	ln       net.Listener // nil while down
	up       chan struct{}
	closed   bool // by kfake
	closedCh chan struct{}
	conns    map[*faultConn]struct{}
}

func (b *faultBroker) Addr() net.Addr { return b.addr }

func (b *faultBroker) Accept() (net.Conn, error) {
	for {
		b.mu.Lock()
		ln, up, closed := b.ln, b.up, b.closed
		b.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		if ln == nil {
			select {
			case <-up:
			case <-b.closedCh:
			}
			continue
		}
		nc, err := ln.Accept()
		if err != nil {
			b.mu.Lock()
			replaced := !b.closed && b.ln != ln
			b.mu.Unlock()
			if replaced {
				continue // went down meanwhile
			}
			return nil, err
		}
		fc := &faultConn{Conn: nc, b: b}
		b.mu.Lock()
		if b.ln != ln { // went down meanwhile
			b.mu.Unlock()
			nc.Close()
			b.f.n.dialsRefused.Add(1)
			continue
		}
		b.conns[fc] = struct{}{}
		b.mu.Unlock()
		return fc, nil
	}
}

func (b *faultBroker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	close(b.closedCh)
	if b.ln != nil {
		return b.ln.Close()
	}
	return nil
}

// killConns closes every connection to the broker.
func (b *faultBroker) killConns() {
	b.mu.Lock()
	conns := make([]*faultConn, 0, len(b.conns))
	for c := range b.conns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (b *faultBroker) down() {
	b.mu.Lock()
	if b.ln == nil || b.closed {
		b.mu.Unlock()
		return
	}
	ln := b.ln
	b.ln = nil
	b.up = make(chan struct{})
	b.mu.Unlock()
	ln.Close()
	b.killConns()
}

func (b *faultBroker) isDown() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ln == nil
}

func (b *faultBroker) bringUp() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ln != nil || b.closed {
		return nil
	}
	var err error
	for i := 0; i < 100; i++ {
		var ln net.Listener
		if ln, err = net.Listen("tcp", b.addr.String()); err == nil {
			b.ln = ln
			close(b.up)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("broker %d: listening again on %s: %w", b.node, b.addr, err)
}

// faultConn is a broker's end of a connection: kfake reads requests from
// it and writes each answer with one Write.
type faultConn struct {
	net.Conn
	b    *faultBroker
	once sync.Once
	// body: the broker's reader read a frame's size last (kfake reads a
	// request as its 4-byte size, then its body); only its goroutine
	// reads.
	body bool
}

func (c *faultConn) Close() error {
	c.once.Do(func() {
		c.b.mu.Lock()
		delete(c.b.conns, c)
		c.b.mu.Unlock()
	})
	return c.Conn.Close()
}

func (c *faultConn) Read(p []byte) (int, error) {
	f := c.b.f
	if f.on.Load() && f.chance(0.0015) {
		// The connection breaks before the broker read (all of) the
		// next request: not applied.
		f.n.connDropRead.Add(1)
		c.Close()
		return 0, net.ErrClosed
	}
	atBody := c.body
	n, err := c.Conn.Read(p)
	c.body = len(p) == 4 && n == 4
	if atBody && n >= 2 && f.on.Load() && int16(binary.BigEndian.Uint16(p)) == int16(kmsg.Produce) {
		// The broker takes the Produce late, the connection's later
		// requests behind it, while its other connections go on.
		if f.chance(0.1) {
			f.n.readDelay.Add(1)
			time.Sleep(f.between(time.Millisecond, 20*time.Millisecond))
		}
		if c.b.node == f.slowNode.Load() && time.Now().UnixNano() < f.slowUntil.Load() {
			f.n.slowNodeDelay.Add(1)
			time.Sleep(f.between(5*time.Millisecond, 40*time.Millisecond))
		}
	}
	return n, err
}

func (c *faultConn) Write(p []byte) (int, error) {
	f := c.b.f
	if f.on.Load() {
		if f.chance(0.004) {
			// The broker applied the request, and its answer is lost
			// with the connection.
			f.n.connDropAnswer.Add(1)
			c.Close()
			return 0, net.ErrClosed
		}
		if f.chance(0.05) {
			f.n.connDelay.Add(1)
			time.Sleep(f.between(time.Millisecond, 15*time.Millisecond))
		}
	}
	return c.Conn.Write(p)
}

// producerStarts reports whether a Produce carries an idempotent
// producer's batch of sequence 0.
func producerStarts(kr kmsg.Request) bool {
	for _, t := range kr.(*kmsg.ProduceRequest).Topics {
		for _, p := range t.Partitions {
			if len(p.Records) >= protocol.BatchHeaderSize {
				if b := protocol.Batch(p.Records); b.ProducerID() >= 0 && b.BaseSequence() == 0 {
					return true
				}
			}
		}
	}
	return false
}

// notLeaderAnswer answers every partition of a Produce
// NOT_LEADER_OR_FOLLOWER, unwritten.
func notLeaderAnswer(kr kmsg.Request) kmsg.Response {
	req := kr.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.ProduceResponseTopic{Topic: rt.Topic, TopicID: rt.TopicID}
		for _, rp := range rt.Partitions {
			st.Partitions = append(st.Partitions, produceError(rp.Partition, kerr.NotLeaderForPartition.Code))
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// rawProducerBase numbers the raw producers' records apart from the
// franz-go producers' (ackedRecord.producer).
const rawProducerBase = 1000

type ackedRecord struct {
	producer   int // franz-go's from 0, rawProducer's from rawProducerBase
	seq        int // the producer's record number
	partition  int32
	offset     int64
	key, value string
}

type logRecord struct {
	key, value string
}

func runProduceStress(t *testing.T, cfg produceStress) {
	const topic = "stress"
	f := &stressFaults{rng: rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15))}
	f.slowNode.Store(-1)
	const nodes = 3
	kf := newKfake(t, nodes, kfake.SeedTopics(cfg.partitions, topic), kfake.ListenFn(f.listen))

	// The broker's own faults, on every Produce while on.
	kf.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if !f.on.Load() {
			return nil, nil, false
		}
		if producerStarts(kr) && f.chance(0.08) {
			// A producer's first batch meets a broker not yet
			// leading (the cluster's metadata already says it is).
			f.n.ctlFirstNotLeader.Add(1)
			return notLeaderAnswer(kr), nil, true
		}
		switch x := f.float(); {
		case x < 0.015:
			f.n.ctlNotLeader.Add(1)
			return notLeaderAnswer(kr), nil, true
		case x < 0.022:
			// kfake closes the connection without applying it.
			f.n.ctlClosed.Add(1)
			return nil, errors.New("injected: connection closed before the produce was applied"), true
		}
		// Delays are the connections' (faultConn.Read): kfake's
		// SleepControl races with itself under -race.
		return nil, nil, false
	})
	when := func(p float64) func(kmsg.Request) bool {
		return func(kmsg.Request) bool { return f.on.Load() && f.chance(p) }
	}
	produceKey := []kmsg.Key{kmsg.Produce}
	faults := []*kfake.FaultHandle{
		kf.Fault(kfake.Fault{Keys: produceKey, Err: kerr.NotLeaderForPartition, Count: -1, When: when(0.006)}),
		// Answered with the error, written all the same: the retry
		// is a duplicate, answered with the first write's offset.
		kf.Fault(kfake.Fault{Keys: produceKey, Err: kerr.RequestTimedOut, Count: -1, When: when(0.006)}),
		kf.Fault(kfake.Fault{Keys: produceKey, Err: kerr.NotEnoughReplicasAfterAppend, Count: -1, When: when(0.003)}),
	}

	ferryOpts := []Option{WithLogger(zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))}
	if cfg.lanes > 0 {
		ferryOpts = append(ferryOpts, WithLanes(cfg.lanes))
	}
	srv, addr := startFerry(t, kf.ListenAddrs(), ferryOpts...)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	// Everyone knows the topic before the faults start.
	warm := newClient(t, addr, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := int32(0); p < cfg.partitions; p++ {
		if err := warm.ProduceSync(ctx, &kgo.Record{Partition: p, Key: []byte("warm"), Value: []byte(fmt.Sprintf("warm-%d", p))}).FirstErr(); err != nil {
			t.Fatalf("warming partition %d: %v", p, err)
		}
	}

	var (
		amu      sync.Mutex
		acks     []ackedRecord
		failures = map[string]int{}
	)
	start := time.Now()
	f.on.Store(true)

	// The chaos loop: leaders move, brokers go down and come back,
	// connections are killed, a broker turns slow.
	chaosCtx, stopChaos := context.WithCancel(ctx)
	chaosDone := make(chan struct{})
	var chaosErr atomic.Pointer[error]
	go func() {
		defer close(chaosDone)
		upNodes := func(except int32) []int32 {
			var ns []int32
			for n := int32(0); n < nodes; n++ {
				if n != except && !f.broker(n).isDown() {
					ns = append(ns, n)
				}
			}
			return ns
		}
		for chaosCtx.Err() == nil {
			select {
			case <-chaosCtx.Done():
				return
			case <-time.After(f.between(80*time.Millisecond, 300*time.Millisecond)):
			}
			switch x := f.float(); {
			case x < 0.40: // a leader moves
				p := int32(f.intn(int(cfg.partitions)))
				if cfg.onePart && f.chance(0.7) {
					p = 0
				}
				ups := upNodes(-1)
				to := ups[f.intn(len(ups))]
				if err := kf.MoveTopicPartition(topic, p, to); err != nil {
					chaosErr.Store(&err)
					return
				}
				f.n.moves.Add(1)
			case x < 0.55: // a broker's connections are killed
				f.broker(int32(f.intn(int(nodes)))).killConns()
				f.n.connKills.Add(1)
			case x < 0.68: // a broker goes down for a while
				victim := int32(f.intn(int(nodes)))
				if cfg.onePart && f.chance(0.6) {
					victim = kf.LeaderFor(topic, 0)
				}
				b := f.broker(victim)
				ups := upNodes(victim)
				if len(ups) == 0 {
					continue
				}
				// The victim's connections break and dials to it
				// are refused; the cluster moves its partitions to
				// the others (as a controller would on its death),
				// before or a little after.
				moveAway := func() error {
					for p := int32(0); p < cfg.partitions; p++ {
						if kf.LeaderFor(topic, p) == victim {
							if err := kf.MoveTopicPartition(topic, p, ups[f.intn(len(ups))]); err != nil {
								return err
							}
							f.n.moves.Add(1)
						}
					}
					return nil
				}
				var moveErr error
				if f.chance(0.5) {
					moveErr = moveAway()
					b.down()
				} else {
					b.down()
					time.Sleep(f.between(10*time.Millisecond, 300*time.Millisecond))
					moveErr = moveAway()
				}
				f.n.brokerDowns.Add(1)
				if moveErr != nil {
					chaosErr.Store(&moveErr)
					return
				}
				select {
				case <-chaosCtx.Done():
				case <-time.After(f.between(200*time.Millisecond, 1200*time.Millisecond)):
				}
				if err := b.bringUp(); err != nil {
					chaosErr.Store(&err)
					return
				}
			case x < 0.78: // a broker turns slow
				f.slowNode.Store(int32(f.intn(int(nodes))))
				f.slowUntil.Store(time.Now().Add(f.between(300*time.Millisecond, 1500*time.Millisecond)).UnixNano())
			}
		}
	}()

	var (
		vmu        sync.Mutex
		violations []string
	)
	stopPipeliners := make(chan struct{})
	var pwg sync.WaitGroup
	for k := 0; k < cfg.pipeliners; k++ {
		pl := &rawProducer{id: k, topic: topic, addr: addr, f: f}
		if !cfg.onePart {
			pl.partition = int32(k) % cfg.partitions
		}
		pl.versions.produce = min(maxVersion(t, srv, kmsg.Produce), 12) // by name
		pl.versions.metadata = min(maxVersion(t, srv, kmsg.Metadata), 12)
		pl.versions.initPID = min(maxVersion(t, srv, kmsg.InitProducerID), 4)
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			pl.run(ctx, stopPipeliners, cfg.seed, 12, func(a ackedRecord) {
				amu.Lock()
				defer amu.Unlock()
				acks = append(acks, a)
			}, func(v string) {
				vmu.Lock()
				defer vmu.Unlock()
				violations = append(violations, v)
			})
		}()
	}

	// Each producer is a new client (a new producer ID) every
	// cfg.records/cfg.sessions records: the first batch of a producer ID
	// in a partition is the one a broker takes with any sequence
	// (kfake, as Kafka, on a partition that holds records), which a
	// later batch overtaking it would replace.
	var wg sync.WaitGroup
	for i := 0; i < cfg.producers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pace := cfg.produceTime / time.Duration(cfg.records)
			next := time.Now()
			per := (cfg.records + cfg.sessions - 1) / cfg.sessions
			for from := 0; from < cfg.records; from += per {
				cl, err := kgo.NewClient(
					kgo.SeedBrokers(addr),
					kgo.ClientID(fmt.Sprintf("stress-%d", i)),
					kgo.DefaultProduceTopic(topic),
					kgo.RecordPartitioner(kgo.ManualPartitioner()),
					kgo.RequiredAcks(kgo.AllISRAcks()),
					kgo.MaxBufferedRecords(1<<16),
					kgo.ProducerLinger(time.Millisecond),
					kgo.ProducerBatchMaxBytes(cfg.batchMax),
					kgo.ProducerBatchCompression(kgo.NoCompression()),
					kgo.RetryBackoffFn(func(int) time.Duration { return 25 * time.Millisecond }),
					kgo.RecordDeliveryTimeout(35*time.Second),
					kgo.MetadataMinAge(50*time.Millisecond),
				)
				if err != nil {
					t.Error(err)
					return
				}
				for j := from; j < min(from+per, cfg.records); j++ {
					p := int32(0)
					if !cfg.onePart {
						p = int32((j + i) % int(cfg.partitions))
					}
					r := &kgo.Record{
						Partition: p,
						Key:       []byte(fmt.Sprintf("p%d-%d", i, j)),
						Value:     []byte(fmt.Sprintf("seed%d/producer%d/record%d", cfg.seed, i, j)),
					}
					cl.Produce(ctx, r, func(r *kgo.Record, err error) {
						amu.Lock()
						defer amu.Unlock()
						if err != nil {
							failures[err.Error()]++
							return
						}
						acks = append(acks, ackedRecord{producer: i, seq: j, partition: r.Partition, offset: r.Offset, key: string(r.Key), value: string(r.Value)})
					})
					if j%16 == 15 {
						next = next.Add(16 * pace)
						if d := time.Until(next); d > 0 {
							time.Sleep(d)
						}
					}
				}
				if err := cl.Flush(ctx); err != nil {
					t.Errorf("producer %d: flush: %v", i, err)
				}
				cl.Close()
			}
		}()
	}
	wg.Wait()
	close(stopPipeliners)
	pwg.Wait()
	produced := time.Since(start)
	stopChaos()
	<-chaosDone
	f.on.Store(false)
	for _, h := range faults {
		h.Remove()
	}
	for n := int32(0); n < nodes; n++ {
		if err := f.broker(n).bringUp(); err != nil {
			t.Fatal(err)
		}
	}
	if e := chaosErr.Load(); e != nil {
		t.Fatalf("chaos: %v", *e)
	}
	t.Logf("produced for %v; faults injected: control NOT_LEADER to a producer's first batch %d, control NOT_LEADER %d, control closed %d, produces taken late %d, slow-node delays %d; "+
		"fault NOT_LEADER %d, REQUEST_TIMED_OUT (written) %d, NOT_ENOUGH_REPLICAS_AFTER_APPEND (written) %d; "+
		"answers lost after apply %d, connections broken on read %d, answers delayed %d; connection kills %d, brokers down %d, connections accepted while going down %d, leader moves %d",
		produced.Round(time.Millisecond), f.n.ctlFirstNotLeader.Load(), f.n.ctlNotLeader.Load(), f.n.ctlClosed.Load(), f.n.readDelay.Load(), f.n.slowNodeDelay.Load(),
		faults[0].Hits(), faults[1].Hits(), faults[2].Hits(),
		f.n.connDropAnswer.Load(), f.n.connDropRead.Load(), f.n.connDelay.Load(), f.n.connKills.Load(), f.n.brokerDowns.Load(), f.n.dialsRefused.Load(), f.n.moves.Load())

	// Read every partition from the cluster itself.
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	logs := readAllPartitions(t, rctx, kf.ListenAddrs(), topic, cfg.partitions)

	amu.Lock()
	defer amu.Unlock()
	total := cfg.producers * cfg.records
	nFailed := 0
	for _, n := range failures {
		nFailed += n
	}
	nKgo, nRaw := 0, 0
	for _, a := range acks {
		if a.producer >= rawProducerBase {
			nRaw++
		} else {
			nKgo++
		}
	}
	t.Logf("franz-go: %d records, %d acknowledged, %d failed %v; pipeliners: %d records acknowledged", total, nKgo, nFailed, failures, nRaw)
	if nKgo+nFailed != total {
		t.Errorf("%d records produced, %d acknowledged and %d failed: some never finished", total, nKgo, nFailed)
	}
	if nKgo < total/2 {
		t.Errorf("only %d of %d records acknowledged: the faults drowned the test", nKgo, total)
	}
	vmu.Lock()
	if len(violations) > 0 {
		// librdkafka, seeing a later batch acknowledged, counts an
		// overtaken one written ("implicitly acked") and loses it.
		t.Errorf("the pipelining producers found %d batches overtaken (or answers mismatched, or stuck) (seed %d):\n%s", len(violations), cfg.seed, strings.Join(head(violations, 8), "\n"))
	}
	vmu.Unlock()

	// Where each value is in the log.
	where := map[string][]string{}
	held := 0
	for p, recs := range logs {
		for off, r := range recs {
			where[r.value] = append(where[r.value], fmt.Sprintf("%d@%d", p, off))
			held++
		}
	}
	var dups []string
	for v, at := range where {
		if len(at) > 1 && v != "" {
			dups = append(dups, fmt.Sprintf("%s at %v", v, at))
		}
	}
	sort.Strings(dups)
	if len(dups) > 0 {
		// Not what this test checks (an idempotent producer may
		// write a record again after an epoch bump), but worth
		// knowing.
		t.Logf("%d values written more than once: %v", len(dups), head(dups, 10))
	}

	type pos struct {
		p   int32
		off int64
	}
	ackedAt := map[pos]ackedRecord{}
	var bad []string
	for _, a := range acks {
		k := pos{a.partition, a.offset}
		if prev, ok := ackedAt[k]; ok {
			bad = append(bad, fmt.Sprintf("two records acknowledged at %d@%d: %q (producer %d) and %q (producer %d)", a.partition, a.offset, prev.value, prev.producer, a.value, a.producer))
		}
		ackedAt[k] = a
		got, ok := logs[a.partition][a.offset]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%q (producer %d) acknowledged at %d@%d: no record there (partition end %d); the value is at %v",
				a.value, a.producer, a.partition, a.offset, len(logs[a.partition]), orAbsent(where[a.value])))
		case got.value != a.value || got.key != a.key:
			bad = append(bad, fmt.Sprintf("%q (producer %d) acknowledged at %d@%d, which holds %q (key %q); the value is at %v",
				a.value, a.producer, a.partition, a.offset, got.value, got.key, orAbsent(where[a.value])))
		}
	}
	// An idempotent producer's records are written in the order it
	// produced them, partition by partition: a batch that overtook an
	// earlier one of its producer (sent again after it) shows here.
	type prodPart struct {
		producer int
		p        int32
	}
	byPP := map[prodPart][]ackedRecord{}
	for _, a := range acks {
		k := prodPart{a.producer, a.partition}
		byPP[k] = append(byPP[k], a)
	}
	var reordered []string
	for k, as := range byPP {
		sort.Slice(as, func(x, y int) bool { return as[x].seq < as[y].seq })
		for x := 1; x < len(as); x++ {
			if as[x].offset <= as[x-1].offset {
				reordered = append(reordered, fmt.Sprintf("producer %d, partition %d: record %d acknowledged at %d, after record %d acknowledged at %d",
					k.producer, k.p, as[x].seq, as[x].offset, as[x-1].seq, as[x-1].offset))
			}
		}
	}
	if len(reordered) > 0 {
		sort.Strings(reordered)
		t.Errorf("%d acknowledged records are before records their producer produced earlier (seed %d):\n%s", len(reordered), cfg.seed, strings.Join(head(reordered, 40), "\n"))
	}
	t.Logf("the cluster holds %d records; %d acknowledged records checked, %d wrong", held, len(acks), len(bad))
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Errorf("%d acknowledged records are not where they were acknowledged (seed %d):\n%s", len(bad), cfg.seed, strings.Join(head(bad, 40), "\n"))
	}
}

func head(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("... and %d more", len(s)-n))
	}
	return s
}

func orAbsent(at []string) string {
	if len(at) == 0 {
		return "nowhere (not on the cluster)"
	}
	return strings.Join(at, ", ")
}

// readAllPartitions reads every record of topic's partitions from the
// cluster at addrs: by partition, by offset.
func readAllPartitions(t *testing.T, ctx context.Context, addrs []string, topic string, partitions int32) map[int32]map[int64]logRecord {
	t.Helper()
	adm := kadm.NewClient(newClient(t, addrs[0], kgo.SeedBrokers(addrs...)))
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	offsets := map[int32]kgo.Offset{}
	ends.Each(func(e kadm.ListedOffset) {
		if e.Err != nil {
			t.Fatalf("end offset of %d: %v", e.Partition, e.Err)
		}
		want[e.Partition] = e.Offset
		offsets[e.Partition] = kgo.NewOffset().AtStart()
	})
	if len(want) != int(partitions) {
		t.Fatalf("end offsets of %d partitions, want %d", len(want), partitions)
	}
	cons := newClient(t, addrs[0], kgo.SeedBrokers(addrs...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}), kgo.FetchMaxWait(200*time.Millisecond))
	logs := map[int32]map[int64]logRecord{}
	next := map[int32]int64{}
	for p := range want {
		logs[p] = map[int64]logRecord{}
	}
	done := func() bool {
		for p, end := range want {
			if next[p] < end {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading the partitions back: %v (read up to %v of %v)", ctx.Err(), next, want)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Fatalf("fetch %d: %v", p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			logs[r.Partition][r.Offset] = logRecord{key: string(r.Key), value: string(r.Value)}
			next[r.Partition] = max(next[r.Partition], r.Offset+1)
		})
	}
	return logs
}

// A pipelining idempotent producer on the raw protocol, as librdkafka
// produces: up to five requests in flight on its connection to the
// partition's leader lane from a producer's first batch on (franz-go sends
// a partition's first batch alone until one is answered without error,
// which hides what follows), every batch after a failed one resent in
// order. It checks what librdkafka takes on trust: when the first batch
// not yet acknowledged is resent and answered OUT_OF_ORDER_SEQUENCE_NUMBER,
// a later batch of the producer was written ahead of it — librdkafka
// would count the earlier one as written ("implicitly acked"), and lose it
// silently. Each of its producer IDs writes a dozen batches, so that many
// batches are a producer's first in the partition (which a broker takes
// with any sequence, kfake as Kafka, on a partition that held records).
type rawProducer struct {
	id        int
	topic     string
	partition int32
	addr      string // Ferry's bootstrap lane
	f         *stressFaults
	versions  struct{ produce, metadata, initPID int16 }

	conn     net.Conn
	corr     int32
	leader   string // the leader lane's address, "" to look up
	produced int    // records so far, across producer IDs
}

type rawBatch struct {
	seq    int32
	values []string
	keys   []string
	first  int // the producer's record number of its first record
	acked  bool
	offset int64
	// after: acknowledged while an earlier batch of its window failed
	after string
}

func (pl *rawProducer) close() {
	if pl.conn != nil {
		pl.conn.Close()
		pl.conn = nil
	}
}

func (pl *rawProducer) call(c net.Conn, req kmsg.Request) (kmsg.Response, error) {
	pl.corr++
	c.SetDeadline(time.Now().Add(15 * time.Second))
	if err := rawSend(c, req, pl.corr); err != nil {
		return nil, err
	}
	return rawReceive(c, req, pl.corr)
}

// rawReceive reads the next answer, which must be to corr.
func rawReceive(c net.Conn, req kmsg.Request, corr int32) (kmsg.Response, error) {
	b, err := rawFrame(c)
	if err != nil {
		return nil, err
	}
	if len(b) < 4 {
		return nil, fmt.Errorf("answer of %d bytes", len(b))
	}
	if got := int32(binary.BigEndian.Uint32(b)); got != corr {
		return nil, &answerOrderError{got, corr}
	}
	return answerTo(req, b)
}

type answerOrderError struct{ got, want int32 }

func (e *answerOrderError) Error() string {
	return fmt.Sprintf("answer to correlation ID %d where %d's was due", e.got, e.want)
}

// lookupLeader asks Ferry which lane leads the partition.
func (pl *rawProducer) lookupLeader() error {
	c, err := net.DialTimeout("tcp", pl.addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	md := kmsg.NewPtrMetadataRequest()
	md.Version = pl.versions.metadata
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(pl.topic)
	md.Topics = append(md.Topics, rt)
	resp, err := pl.call(c, md)
	if err != nil {
		return err
	}
	mr := resp.(*kmsg.MetadataResponse)
	for _, t := range mr.Topics {
		for _, p := range t.Partitions {
			if p.Partition != pl.partition {
				continue
			}
			if p.ErrorCode != 0 || p.Leader < 0 {
				return fmt.Errorf("partition %d: leader %d, %v", p.Partition, p.Leader, kerr.ErrorForCode(p.ErrorCode))
			}
			for _, b := range mr.Brokers {
				if b.NodeID == p.Leader {
					pl.leader = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
					return nil
				}
			}
		}
	}
	return fmt.Errorf("no leader for partition %d in %+v", pl.partition, mr.Brokers)
}

func (pl *rawProducer) leaderConn() (net.Conn, error) {
	if pl.conn != nil {
		return pl.conn, nil
	}
	if pl.leader == "" {
		if err := pl.lookupLeader(); err != nil {
			return nil, err
		}
	}
	c, err := net.DialTimeout("tcp", pl.leader, 5*time.Second)
	if err != nil {
		pl.leader = ""
		return nil, err
	}
	pl.conn = c
	return c, nil
}

func (pl *rawProducer) initPID(ctx context.Context) (int64, int16, error) {
	for ctx.Err() == nil {
		c, err := pl.leaderConn()
		if err == nil {
			ip := kmsg.NewPtrInitProducerIDRequest()
			ip.Version = pl.versions.initPID
			ip.TransactionTimeoutMillis = 60000
			ip.ProducerID, ip.ProducerEpoch = -1, -1
			var resp kmsg.Response
			if resp, err = pl.call(c, ip); err == nil {
				r := resp.(*kmsg.InitProducerIDResponse)
				if r.ErrorCode == 0 {
					return r.ProducerID, r.ProducerEpoch, nil
				}
				// A retriable refusal (the coordinator moving): asked again.
			} else {
				pl.close()
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return -1, -1, ctx.Err()
}

func (pl *rawProducer) produceReq(pid int64, epoch int16, b *rawBatch) *kmsg.ProduceRequest {
	p := kmsg.NewPtrProduceRequest()
	p.Version = pl.versions.produce
	p.Acks = -1
	p.TimeoutMillis = 5000
	p.Topics = []kmsg.ProduceRequestTopic{{Topic: pl.topic, Partitions: []kmsg.ProduceRequestTopicPartition{{
		Partition: pl.partition, Records: batchOf(pid, epoch, b.seq, false, b.keys, b.values),
	}}}}
	return p
}

// run writes batches of one to three records under new producer IDs,
// batchesPer each, until stop; ack gets each acknowledged record,
// violation each finding.
func (pl *rawProducer) run(ctx context.Context, stop <-chan struct{}, seed uint64, batchesPer int, ack func(ackedRecord), violation func(string)) {
	defer pl.close()
	for {
		select {
		case <-stop:
			return
		default:
		}
		if ctx.Err() != nil {
			return
		}
		pid, epoch, err := pl.initPID(ctx)
		if err != nil {
			return
		}
		batches := make([]rawBatch, batchesPer)
		seq := int32(0)
		for i := range batches {
			n := 1 + pl.f.intn(3)
			b := rawBatch{seq: seq, first: pl.produced}
			for range n {
				b.keys = append(b.keys, fmt.Sprintf("pl%d-%d", pl.id, pl.produced))
				b.values = append(b.values, fmt.Sprintf("seed%d/rawProducer%d/record%d", seed, pl.id, pl.produced))
				pl.produced++
			}
			seq += int32(n)
			batches[i] = b
		}
		pl.session(ctx, pid, epoch, batches, violation)
		for _, b := range batches {
			if !b.acked {
				continue
			}
			for i := range b.values {
				ack(ackedRecord{producer: rawProducerBase + pl.id, seq: b.first + i, partition: pl.partition, offset: b.offset + int64(i), key: b.keys[i], value: b.values[i]})
			}
		}
	}
}

// session writes batches under (pid, epoch), five requests in flight,
// until all are acknowledged, one is found overtaken, or ctx ends.
func (pl *rawProducer) session(ctx context.Context, pid int64, epoch int16, batches []rawBatch, violation func(string)) {
	next := 0
	began := time.Now()
	var recent []string // the last failures, for a session that does not end
	for next < len(batches) && ctx.Err() == nil {
		if time.Since(began) > 15*time.Second {
			violation(fmt.Sprintf("rawProducer %d: producer %d stuck for %v at batch seq %d of partition %d; last failures: %v",
				pl.id, pid, time.Since(began).Round(time.Second), batches[next].seq, pl.partition, recent))
			return
		}
		c, err := pl.leaderConn()
		if err != nil {
			recent = append(recent[max(0, len(recent)-7):], "connect: "+err.Error())
			time.Sleep(20 * time.Millisecond)
			continue
		}
		type inFlight struct {
			b    int
			corr int32
			req  *kmsg.ProduceRequest
		}
		var (
			window  []inFlight
			sendErr error
		)
		c.SetDeadline(time.Now().Add(15 * time.Second))
		// The batches not yet acknowledged among the five from the
		// first not acknowledged: no client sends one again once it
		// is acknowledged, nor one further ahead (a broker remembers
		// its producers' last five batches, to answer one sent again).
		for b := next; b < min(next+5, len(batches)); b++ {
			if batches[b].acked {
				continue
			}
			req := pl.produceReq(pid, epoch, &batches[b])
			pl.corr++
			if sendErr = rawSend(c, req, pl.corr); sendErr != nil {
				break
			}
			window = append(window, inFlight{b, pl.corr, req})
		}
		failed := ""
		if sendErr != nil {
			failed = "send: " + sendErr.Error() // the answers to what went are read first
		}
		for _, w := range window {
			resp, err := rawReceive(c, w.req, w.corr)
			if err != nil {
				var oe *answerOrderError
				if errors.As(err, &oe) {
					violation(fmt.Sprintf("rawProducer %d: %v", pl.id, err))
				}
				pl.close()
				if failed == "" {
					failed = err.Error()
				}
				break
			}
			pr := resp.(*kmsg.ProduceResponse)
			if len(pr.Topics) != 1 || len(pr.Topics[0].Partitions) != 1 || pr.Topics[0].Partitions[0].Partition != pl.partition {
				violation(fmt.Sprintf("rawProducer %d: a produce of partition %d answered %+v", pl.id, pl.partition, pr.Topics))
				pl.close()
				return
			}
			a := pr.Topics[0].Partitions[0]
			b := &batches[w.b]
			switch {
			case a.ErrorCode == 0:
				b.acked, b.offset = true, a.BaseOffset
				if failed != "" {
					b.after = failed
				}
			case a.ErrorCode == kerr.OutOfOrderSequenceNumber.Code && failed == "" && w.b == next:
				// The first batch not yet acknowledged, resent (or
				// sent) in order: the broker holds a later sequence.
				var ahead []string
				for _, l := range batches[w.b+1:] {
					if l.acked {
						ahead = append(ahead, fmt.Sprintf("seq %d at %d@%d (acknowledged after %s)", l.seq, pl.partition, l.offset, l.after))
					}
				}
				violation(fmt.Sprintf("rawProducer %d: batch (producer %d, epoch %d, seq %d, %d records) of partition %d answered OUT_OF_ORDER_SEQUENCE_NUMBER: later batches were written ahead of it: %v",
					pl.id, pid, epoch, b.seq, len(b.values), pl.partition, orAbsent(head(ahead, 2))))
				pl.close()
				return
			default:
				if failed == "" {
					failed = fmt.Sprintf("seq %d %v", b.seq, kerr.ErrorForCode(a.ErrorCode))
				}
			}
		}
		for next < len(batches) && batches[next].acked {
			next++
		}
		if failed != "" {
			recent = append(recent[max(0, len(recent)-7):], failed)
			pl.close()
			pl.leader = "" // look the leader up again
			time.Sleep(time.Duration(10+pl.f.intn(20)) * time.Millisecond)
		}
	}
}
