package mirror

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"go.uber.org/zap"
)

// Mirror copies the selected topics of the source cluster to the target
// cluster at the same offsets: one writer per partition (writer.go) and a
// metadata sync loop (sync.go) that creates topics and partitions, copies
// configs, consumer group offsets and ACLs, and starts writers for new
// partitions. With WithOwnership, several Mirrors (one per member) share
// the partitions (ownership.go).
//
// Lock order: Mirror.assignMu, then Mirror.mu, then writer.mu.
type Mirror struct {
	cfg     config
	log     *zap.Logger
	metrics *metrics

	src, dst       *kgo.Client
	srcAdm, dstAdm *kadm.Client
	// coord are the target clients the writers' transaction coordinator
	// requests go through (coord[0] is dst).
	coord []*kgo.Client
	// srcLeaders, dstLeaders and txnDescs coalesce the writers' starts'
	// lookups (coalesce.go).
	srcLeaders, dstLeaders *coalescer[string, topicLeaders]
	txnDescs               *coalescer[string, kadm.DescribedTransaction]
	srcEnds, dstEnds       *coalescer[topicPartition, kadm.ListedOffset]  // high watermarks (a writer's start)
	srcEpochs              *coalescer[epochAt, kadm.OffsetForLeaderEpoch] // where the source's leader epochs end (checkEpoch)
	// srcAPIs, dstAPIs: what each cluster offers (apis.go);
	// noTxnListing logs once that the source has no ListTransactions.
	srcAPIs, dstAPIs apiSupport
	noTxnListing     sync.Once

	assignMu sync.Mutex // one assign at a time (ownership.go)

	mu       sync.Mutex
	writers  map[topicPartition]*writerHandle // the writers of this member
	topicIDs map[string][16]byte              // source topic IDs of mirrored topics
	parts    map[string]int32                 // mirrored topics ready on the standby, and their partitions
	owned    map[topicPartition]bool          // ownership of parts as last applied (assign)
	closed   bool
	running  bool
	cancel   context.CancelFunc  // of Run's context
	runCtx   context.Context     // Run's context, for the writers Restart starts
	watchers map[string]*watcher // of idle partitions, by source broker (watch.go)
	life     context.Context     // ends at Close: the watchers'
	endLife  context.CancelFunc
	inSync   groupsInSync   // the periodic group sync's (sync.go)
	setups   chan struct{}  // writers starting a session (setupParallel)
	wg       sync.WaitGroup // every goroutine started by goRun

	closeOnce sync.Once
	done      chan struct{} // closed by Close

	// syncRound counts the sync loop's rounds; settled is the source's
	// topics as last found ready (both the sync loop's goroutine only).
	syncRound int
	settled   settledTopics
}

type topicPartition struct {
	topic     string
	partition int32
}

type writerHandle struct {
	w      *writer
	cancel context.CancelFunc
	done   chan struct{} // closed when the writer's goroutine returns
}

// New returns a Mirror; Run starts it.
func New(opts ...Option) (*Mirror, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Transactions on the classic protocol (AddPartitionsToTxn, EndTxn
	// v4): see the wire versions in writer.go.
	vers := kversion.Stable()
	vers.SetMaxKeyVersion(0, produceVersion)
	vers.SetMaxKeyVersion(22, 4) // InitProducerId
	vers.SetMaxKeyVersion(24, 3) // AddPartitionsToTxn
	vers.SetMaxKeyVersion(26, 4) // EndTxn
	// Kafka Streams groups (KIP-1071), whose members a switch removes
	// from the standby (evictStreamsMembers): not in Stable yet.
	vers.SetMaxKeyVersion(int16(kmsg.StreamsGroupHeartbeat), 0)
	vers.SetMaxKeyVersion(int16(kmsg.StreamsGroupDescribe), 0)
	src, err := cfg.srcSec.NewClient(cfg.source, kgo.ClientID("ferry-mirror"), kgo.WithHooks(cfg.srcHooks...))
	if err != nil {
		return nil, fmt.Errorf("mirror: source client: %w", err)
	}
	coord := make([]*kgo.Client, coordConns)
	for i := range coord {
		cl, err := cfg.dstSec.NewClient(cfg.target, kgo.ClientID("ferry-mirror"), kgo.MaxVersions(vers), kgo.WithHooks(cfg.dstHooks...))
		if err != nil {
			src.Close()
			for _, c := range coord[:i] {
				c.Close()
			}
			return nil, fmt.Errorf("mirror: target client: %w", err)
		}
		coord[i] = cl
	}
	dst := coord[0]
	m := &Mirror{
		cfg:      cfg,
		log:      cfg.logger,
		metrics:  newMetrics(cfg.registry),
		src:      src,
		dst:      dst,
		srcAdm:   kadm.NewClient(src),
		dstAdm:   kadm.NewClient(dst),
		coord:    coord,
		writers:  make(map[topicPartition]*writerHandle),
		topicIDs: make(map[string][16]byte),
		parts:    make(map[string]int32),
		owned:    make(map[topicPartition]bool),
		done:     make(chan struct{}),
		setups:   make(chan struct{}, setupParallel),
	}
	m.life, m.endLife = context.WithCancel(context.Background())
	m.srcLeaders, m.dstLeaders = m.newLeaders(src), m.newLeaders(dst)
	m.txnDescs = m.newTxnDescriber()
	m.srcEnds, m.dstEnds = m.newEnds(src), m.newEnds(dst)
	m.srcEpochs = m.newEpochEnds()
	if cfg.registry != nil {
		cfg.registry.MustRegister(partitionMetrics{m})
	}
	return m, nil
}

// Run mirrors until ctx ends or Close is called. It returns ErrClosed
// after Close, ctx's error otherwise.
func (m *Mirror) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	if m.running {
		m.mu.Unlock()
		return errors.New("mirror: Run called twice")
	}
	m.running = true
	ctx, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	m.runCtx = ctx
	m.mu.Unlock()
	defer cancel()

	m.log.Info("mirror starting", zap.Strings("source", m.cfg.source), zap.Strings("target", m.cfg.target))
	if m.cfg.ownership != nil {
		m.goRun(func() { m.watchOwnership(ctx) })
	}
	m.goRun(func() { m.refreshEnds(ctx) })
	t := time.NewTicker(m.cfg.syncInterval)
	defer t.Stop()
	for {
		m.syncOnce(ctx)
		select {
		case <-ctx.Done():
			m.stopWriters()
			select {
			case <-m.done:
				return ErrClosed
			default:
				return ctx.Err()
			}
		case <-t.C:
		}
	}
}

// Close stops Run and every writer and closes the clients. Safe to call
// more than once.
func (m *Mirror) Close() {
	m.closeOnce.Do(func() {
		// 1. Refuse new goroutines and stop Run's context.
		m.mu.Lock()
		m.closed = true
		cancel := m.cancel
		m.mu.Unlock()
		close(m.done)
		if cancel != nil {
			cancel()
		}
		m.endLife()
		// 2. Stop the writers and wait for every goroutine.
		m.stopWriters()
		m.wg.Wait()
		// 3. Close the clients.
		m.src.Close()
		for _, cl := range m.coord {
			cl.Close()
		}
	})
}

// goRun runs fn in a tracked goroutine unless the mirror is closed.
func (m *Mirror) goRun(fn func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
	return true
}

func (m *Mirror) stopWriters() {
	m.mu.Lock()
	for _, h := range m.writers {
		h.cancel()
	}
	m.mu.Unlock()
}

// startWriter starts the writer of a partition if it has none, given what
// its previous writer in this process left (nil: nothing). Only assign and
// Restart call it.
func (m *Mirror) startWriter(ctx context.Context, topic string, partition int32, pred *predecessor) {
	key := topicPartition{topic, partition}
	m.mu.Lock()
	if _, ok := m.writers[key]; ok || m.closed {
		m.mu.Unlock()
		return
	}
	w := newWriter(m, topic, partition)
	w.pred = pred
	wctx, cancel := context.WithCancel(ctx)
	h := &writerHandle{w: w, cancel: cancel, done: make(chan struct{})}
	w.ctx, w.done = wctx, h.done
	m.writers[key] = h
	m.mu.Unlock()
	if !w.start(false) {
		cancel()
	}
}

// stopTopic stops the writers of a topic deleted on the source and marks
// them stopped; their status stays visible.
// A deleted topic's writers are forgotten (so a topic created again under
// the name starts new writers, whose tail check then compares it with what
// the standby holds); a recreated one's are kept, halted.
func (m *Mirror) stopTopic(topic string, why error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var halt *HaltError
	halted := errors.As(why, &halt)
	for k, h := range m.writers {
		if k.topic != topic {
			continue
		}
		h.cancel()
		if halted {
			h.w.setState(StateHalted, why)
			m.metrics.halt(k.topic, k.partition, why)
			continue
		}
		h.w.setState(StateStopped, why)
		h.w.retire()
		m.metrics.forget(k.topic, k.partition)
		delete(m.writers, k)
	}
}

// Status returns the status of every partition whose writer runs in this
// Mirror, ordered by topic and partition. With WithOwnership these are the
// partitions this member owns (a lost partition's writer leaves the list
// once it has stopped; a gained one's joins it in StateStarting): the
// fleet's status is the union of its members' lists.
func (m *Mirror) Status() []PartitionStatus {
	m.mu.Lock()
	ws := make([]*writer, 0, len(m.writers))
	for _, h := range m.writers {
		ws = append(ws, h.w)
	}
	m.mu.Unlock()
	out := make([]PartitionStatus, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.Status())
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}

// WaitCaughtUp waits until every mirrored partition of the given topics
// (all selected source topics, if none are given) has mirrored everything
// the source held when WaitCaughtUp was called — the standby's end offset
// has reached the source's high watermark read at the start — and returns
// nil; it returns an error as soon as one of them is halted here, or ctx's
// error. Partitions whose source topic was deleted are skipped.
//
// Both ends are read from the clusters, so every partition is judged,
// whichever member's writer mirrors it (WithOwnership). A halt is seen only
// in this member's writers (Status): a partition halted on another member
// keeps WaitCaughtUp waiting until ctx ends.
//
// The writers copy only decided data. A partition held below that high
// watermark by a transaction still open on the source (its last stable
// offset, read now, is below; the standby has everything up to it) counts
// as caught up once openTxnGrace has passed: not at once, since a
// transaction just committed leaves the last stable offset behind until
// the coordinator's marker lands. The switchover uses
// Drain, which also ends such transactions.
func (m *Mirror) WaitCaughtUp(ctx context.Context, topics ...string) error {
	selected := len(topics) == 0
	var ends kadm.ListedOffsets
	for {
		// Every partition in the source's metadata must have an end
		// (a client's cached metadata may lag a partition increase).
		td, err := listTopics(ctx, m.src)
		if err == nil && selected {
			topics = topics[:0]
			for name, t := range td {
				if m.cfg.mirrorTopic(name, t.internal) {
					topics = append(topics, name)
				}
			}
		}
		if err == nil && len(topics) == 0 {
			return nil
		}
		if err == nil {
			ends, err = m.srcAdm.ListEndOffsets(ctx, topics...)
		}
		if err == nil {
			err = ends.Error()
		}
		if err == nil {
			for _, t := range topics {
				for p := range td[t].partitions {
					if _, ok := ends.Lookup(t, p); !ok {
						err = fmt.Errorf("no end offset for %s[%d] yet", t, p)
					}
				}
			}
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("mirror: source end offsets: %w", err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	delay := 10 * time.Millisecond
	openAfter := time.Now().Add(openTxnGrace)
	for {
		if err := m.localHalt(func(tp topicPartition) bool { return ends[tp.topic] != nil }); err != nil {
			return err
		}
		// The source's topics now, to skip deleted ones (nil: unknown,
		// skip none).
		now, _ := listTopics(ctx, m.src)
		dst, err := m.dstAdm.ListEndOffsets(ctx, topics...)
		all := err == nil
		// After the grace, the source's last stable offsets now: a
		// partition whose transaction is still open counts as caught up
		// at it.
		var stable kadm.ListedOffsets
		if all && time.Now().After(openAfter) {
			if l, err := m.srcAdm.ListCommittedOffsets(ctx, topics...); err == nil && l.Error() == nil {
				stable = l
			}
		}
		ends.Each(func(o kadm.ListedOffset) {
			if _, ok := now[o.Topic]; now != nil && !ok {
				return // deleted on the source
			}
			d, ok := dst.Lookup(o.Topic, o.Partition)
			switch {
			case !ok || d.Err != nil:
				all = false // not on the standby yet
			case d.Offset >= o.Offset:
			default:
				// An open transaction may hold the writer below the end.
				l, ok := stable.Lookup(o.Topic, o.Partition)
				if !ok || l.Offset >= o.Offset || d.Offset < l.Offset {
					all = false
				}
			}
		})
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// localHalt returns an error naming the first partition selected by in
// whose writer halted in this member.
func (m *Mirror) localHalt(in func(topicPartition) bool) error {
	for _, st := range m.Status() {
		if st.State == StateHalted && in(topicPartition{st.Topic, st.Partition}) {
			return fmt.Errorf("mirror: %s[%d] halted: %w", st.Topic, st.Partition, st.Err)
		}
	}
	return nil
}

// leaderAddr returns the address of the partition's leader, from a
// Metadata request that carries every topic asked about meanwhile (leaders:
// m.srcLeaders or m.dstLeaders).
func (m *Mirror) leaderAddr(ctx context.Context, leaders *coalescer[string, topicLeaders], topic string, partition int32) (string, error) {
	got, err := leaders.getAll(ctx, topic)
	if err != nil {
		return "", err
	}
	tl, ok := got[topic]
	if !ok {
		return "", fmt.Errorf("metadata: %s missing from the response", topic)
	}
	if tl.err != nil {
		return "", fmt.Errorf("metadata for %s: %w", topic, tl.err)
	}
	if err := tl.errs[partition]; err != nil {
		return "", fmt.Errorf("%s[%d]: %w", topic, partition, err)
	}
	if addr, ok := tl.addrs[partition]; ok {
		return addr, nil
	}
	return "", fmt.Errorf("%s[%d]: %w", topic, partition, kerr.UnknownTopicOrPartition)
}

// topicLeaders is what a Metadata answer says of one topic's partitions.
type topicLeaders struct {
	err   error            // the topic's own error
	addrs map[int32]string // a partition's leader's address
	errs  map[int32]error  // why a partition has no leader address
}

// coalescerMax bounds the keys of one coalesced request (topics of a
// Metadata request, transactional IDs of a DescribeTransactions).
const coalescerMax = 2000

// coalesceTimeout bounds one coalesced request.
const coalesceTimeout = 30 * time.Second

// newLeaders returns the coalescer of leader lookups on cl's cluster.
func (m *Mirror) newLeaders(cl *kgo.Client) *coalescer[string, topicLeaders] {
	return coalesce(m, func(ctx context.Context, topics []string) (map[string]topicLeaders, error) {
		req := kmsg.NewPtrMetadataRequest()
		for _, topic := range topics {
			t := kmsg.NewMetadataRequestTopic()
			t.Topic = kmsg.StringPtr(topic)
			req.Topics = append(req.Topics, t)
		}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return nil, err
		}
		addrs := make(map[int32]string, len(resp.Brokers))
		for _, b := range resp.Brokers {
			addrs[b.NodeID] = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
		}
		out := make(map[string]topicLeaders, len(resp.Topics))
		for _, rt := range resp.Topics {
			if rt.Topic == nil {
				continue
			}
			tl := topicLeaders{err: kerr.ErrorForCode(rt.ErrorCode), addrs: make(map[int32]string, len(rt.Partitions))}
			for _, p := range rt.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil && p.Leader < 0 {
					tl.setErr(p.Partition, err)
					continue
				}
				addr, ok := addrs[p.Leader]
				if !ok {
					tl.setErr(p.Partition, fmt.Errorf("leader %d not among the brokers", p.Leader))
					continue
				}
				tl.addrs[p.Partition] = addr
			}
			out[*rt.Topic] = tl
		}
		return out, nil
	})
}

func (tl *topicLeaders) setErr(partition int32, err error) {
	if tl.errs == nil {
		tl.errs = make(map[int32]error)
	}
	tl.errs[partition] = err
}

// coalesce returns a coalescer of m's lookups whose requests (fetch) are
// each bounded by coalesceTimeout.
func coalesce[K comparable, V any](m *Mirror, fetch func(ctx context.Context, keys []K) (map[K]V, error)) *coalescer[K, V] {
	return &coalescer[K, V]{
		start: m.goRun,
		ctx:   m.life,
		max:   coalescerMax,
		fetch: func(ctx context.Context, keys []K) (map[K]V, error) {
			ctx, cancel := context.WithTimeout(ctx, coalesceTimeout)
			defer cancel()
			return fetch(ctx, keys)
		},
	}
}

// newEnds returns the coalescer of high watermark readings on cl's
// cluster: one ListOffsets per leader (ListEnds) for every partition asked
// about while the last was in flight. A reading is never older than its
// ask (a round is sent after its keys joined it).
func (m *Mirror) newEnds(cl *kgo.Client) *coalescer[topicPartition, kadm.ListedOffset] {
	return coalesce(m, func(ctx context.Context, tps []topicPartition) (map[topicPartition]kadm.ListedOffset, error) {
		parts := make(map[string][]int32)
		for _, tp := range tps {
			parts[tp.topic] = append(parts[tp.topic], tp.partition)
		}
		listed, err := ListEnds(ctx, cl, parts, false)
		if err != nil {
			return nil, err
		}
		out := make(map[topicPartition]kadm.ListedOffset, len(tps))
		listed.Each(func(o kadm.ListedOffset) { out[topicPartition{o.Topic, o.Partition}] = o })
		return out, nil
	})
}

// epochAt asks where a partition's leader epoch ends (OffsetForLeaderEpoch).
type epochAt struct {
	topicPartition
	epoch int32
}

// newEpochEnds returns the coalescer of OffsetForLeaderEpoch on the source,
// one request per leader (kadm shards it, from the client's metadata) for
// every partition asked about while the last was in flight. A partition
// asked about twice in one round (one writer per partition makes that
// rare) is answered for the later epoch only; the other ask finds no answer
// and its session starts again.
func (m *Mirror) newEpochEnds() *coalescer[epochAt, kadm.OffsetForLeaderEpoch] {
	return coalesce(m, func(ctx context.Context, keys []epochAt) (map[epochAt]kadm.OffsetForLeaderEpoch, error) {
		var req kadm.OffsetForLeaderEpochRequest
		for _, k := range keys {
			req.Add(k.topic, k.partition, k.epoch)
		}
		// Partial on error: the partitions of the leaders that answered.
		got, err := m.srcAdm.OffsetForLeaderEpoch(ctx, req)
		out := make(map[epochAt]kadm.OffsetForLeaderEpoch, len(keys))
		for t, ps := range got {
			for p, o := range ps {
				out[epochAt{topicPartition{t, p}, req[t][p]}] = o
			}
		}
		return out, err
	})
}

// newTxnDescriber returns the coalescer of DescribeTransactions on the
// target.
func (m *Mirror) newTxnDescriber() *coalescer[string, kadm.DescribedTransaction] {
	return coalesce(m, func(ctx context.Context, ids []string) (map[string]kadm.DescribedTransaction, error) {
		// Partial on error: the IDs of the coordinators that answered.
		return m.dstAdm.DescribeTransactions(ctx, ids...)
	})
}

// retriableTxnErr reports whether a transaction coordinator error is worth
// retrying after a moment.
func retriableTxnErr(err error) bool {
	return errors.Is(err, kerr.ConcurrentTransactions) || errors.Is(err, kerr.CoordinatorLoadInProgress) ||
		errors.Is(err, kerr.NotCoordinator) || errors.Is(err, kerr.CoordinatorNotAvailable) ||
		errors.Is(err, kerr.RequestTimedOut) || errors.Is(err, kerr.TransactionAbortable)
}

// retryTxn runs fn until it succeeds, fails with a non-retriable error, or
// a minute passes.
func retryTxn(ctx context.Context, what string, fn func() error) error {
	delay := 10 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for {
		err := fn()
		if err == nil || !retriableTxnErr(err) || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		}
		if err := sleep(ctx, delay); err != nil {
			return err
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// initProducer gets a producer ID on the target: idempotent if txnID is
// nil, else for that transactional ID (bumping its epoch, which fences an
// older holder and aborts a transaction it left open).
func (m *Mirror) initProducer(ctx context.Context, txnID *string) (producer, error) {
	return initProducerOn(ctx, m.txnClient(*txnID), txnID)
}

// coordConns is how many connections to each target broker the writers'
// transaction coordinator requests (InitProducerId, AddPartitionsToTxn,
// EndTxn) are spread over. A broker takes one request of a connection at a
// time, and one client keeps one connection per broker: the 1,000 writers
// starting together at 10,000 partitions queued there. On this project's
// 2-core machine, 1,000 InitProducerIds for new IDs took 3.9 s through one
// connection and 1.2 s through eight. (DescribeTransactions takes a list:
// the writers' are coalesced instead, txnDescs.)
const coordConns = 8

// txnClient is the target client for requests about transactional ID id:
// always the same one for an ID.
func (m *Mirror) txnClient(id string) *kgo.Client { return m.coord[coordIndex(id, len(m.coord))] }

func coordIndex(id string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// initProducerOn is initProducer on the cluster cl reaches.
func initProducerOn(ctx context.Context, cl *kgo.Client, txnID *string) (producer, error) {
	var p producer
	err := retryTxn(ctx, "InitProducerId", func() error {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = txnID
		req.TransactionTimeoutMillis = int32(txnTimeout / time.Millisecond)
		req.ProducerID = -1
		req.ProducerEpoch = -1
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return err
		}
		p = producer{id: resp.ProducerID, epoch: resp.ProducerEpoch, txnID: txnID}
		return nil
	})
	return p, err
}

// addPartition adds the partition to p's transaction.
func (m *Mirror) addPartition(ctx context.Context, p *producer, topic string, partition int32) error {
	return retryTxn(ctx, "AddPartitionsToTxn", func() error {
		req := kmsg.NewPtrAddPartitionsToTxnRequest()
		req.TransactionalID = *p.txnID
		req.ProducerID = p.id
		req.ProducerEpoch = p.epoch
		t := kmsg.NewAddPartitionsToTxnRequestTopic()
		t.Topic = topic
		t.Partitions = []int32{partition}
		req.Topics = append(req.Topics, t)
		resp, err := req.RequestWith(ctx, m.txnClient(*p.txnID))
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return err
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// endTxn commits or aborts p's transaction.
func (m *Mirror) endTxn(ctx context.Context, p *producer, commit bool) error {
	return retryTxn(ctx, "EndTxn", func() error {
		req := kmsg.NewPtrEndTxnRequest()
		req.TransactionalID = *p.txnID
		req.ProducerID = p.id
		req.ProducerEpoch = p.epoch
		req.Commit = commit
		resp, err := req.RequestWith(ctx, m.txnClient(*p.txnID))
		if err != nil {
			return err
		}
		return kerr.ErrorForCode(resp.ErrorCode)
	})
}
