package mirror

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
)

// The partition writer: one per mirrored partition. Its position is the
// standby's end offset; it fetches raw batches from the source leader from
// there up to the last stable offset and appends them to the standby leader
// so that each lands at its source offset.
//
// How a stock broker treats what the writer sends (LogValidator,
// ProducerStateManager in apache/kafka):
//   - the leader assigns offsets from its log end: a batch lands at its source
//     offset only if the standby's end offset equals the batch's base offset;
//   - a batch must hold lastOffsetDelta+1 records; compressed batches are
//     kept in place (payload untouched) when the codec matches the topic's
//     (the standby topic has compression.type=producer);
//   - control batches and LogAppendTime batches are refused from clients;
//   - a producer ID the broker has not seen may start at any sequence.
//
// So, per source batch, in offset order:
//   - a gap before it (compaction hole, raised log start, an empty batch
//     the cleaner kept) is filled (fill);
//   - a control batch (transaction marker) ends the matching writer
//     transaction with EndTxn, so the coordinator's marker lands at the same
//     offset; a marker with no writer transaction open is a gap of one;
//   - a data batch is re-stamped with the writer's producer ID, epoch and
//     sequence (CRC recomputed) and appended; batches of an aborted source
//     transaction, and the last batch of a committed one, go inside a writer
//     transaction (one transactional ID per open source transaction).
//
// Several Produce requests are kept in flight on one connection, so the
// broker appends them in order; each response's base offset is checked.

// Wire versions the writer speaks on its own connections. Produce v11 and
// EndTxn v4 keep transactions on the classic protocol (the writer adds
// partitions with AddPartitionsToTxn). A target that serves Produce only
// to an older version (v9 before Kafka 3.7, whose request is the same) is
// written at its highest (writer.produceV): an unknown version makes a
// broker close the connection. Fetch v12 is the last version that names
// topics.
const (
	produceVersion     = 11
	fetchVersion       = 12
	listOffsetsVersion = 7
)

// txnTimeout is the writer transactions' timeout. A writer transaction can
// stay open while the source's marker waits behind another open source
// transaction; the coordinator aborting it early would put a marker at the
// wrong offset, so it is the broker default maximum.
const txnTimeout = 15 * time.Minute

// fillerChunk caps the records of one filler batch (about 25 bytes each).
const fillerChunk = 20000

// PartitionState is the state of one partition writer.
type PartitionState int

const (
	StateStarting  PartitionState = iota // connecting, initialising producers
	StateMirroring                       // copying, behind the source
	StateCaughtUp                        // the standby holds every source offset
	StateHalted                          // stopped on an error; see PartitionStatus.Err
	StateStopped                         // the source topic or partition is gone
)

func (s PartitionState) String() string {
	switch s {
	case StateStarting:
		return "starting"
	case StateMirroring:
		return "mirroring"
	case StateCaughtUp:
		return "caught up"
	case StateHalted:
		return "halted"
	case StateStopped:
		return "stopped"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// PartitionStatus is one partition's mirror status.
type PartitionStatus struct {
	Topic     string
	Partition int32
	State     PartitionState
	// Mirrored is the standby's end offset acknowledged to the writer:
	// every offset below it is on the standby at its source offset.
	Mirrored int64
	// SourceEnd is the source's high watermark: the larger of the one
	// the writer's last fetch returned and the one the Mirror last listed
	// (every second, ends.go), so it misses at most what the source
	// acknowledged in the last interval. SourceStable is the last stable
	// offset at the last fetch.
	SourceEnd, SourceStable int64
	// LagRecords is SourceEnd - Mirrored (offsets, markers included);
	// SourceEnd while Mirrored is not known (nothing is known to be on
	// the standby).
	LagRecords int64
	// LagTime is how long ago the partition was last caught up (0 when it
	// is, and when it stopped); for a partition never caught up, since
	// its writer was made.
	LagTime time.Duration
	// Err is why the writer halted (a *HaltError), or the last transient
	// error it is retrying.
	Err error
}

type writer struct {
	m         *Mirror
	topic     string
	partition int32

	mu         sync.Mutex // guards status and the four below
	status     PartitionStatus
	caught     time.Time // last time caught up
	fetchedEnd int64     // the source's high watermark at the last fetch (-1: none yet)
	listedEnd  int64     // the source's end offset last listed (ends.go; -1: none yet)
	retired    bool      // replaced (Restart) or forgotten: touches nothing any more
	// parked: the writer has no goroutine and waits for its partition's
	// watcher (watch.go), which reports the source's high watermark in
	// listEnds' place and starts the writer again.
	parked  atomic.Bool
	watcher *watcher // it parked with (set before parked)

	ctx  context.Context // the writer's, until it is stopped
	done chan struct{}   // closed when the writer has stopped for good

	// Per session (see session).
	src, dst *link // the leaders', dialed when needed (closed while parked)
	produceV int16 // the Produce version the target is written at
	next     int64 // the next offset to write, on both logs
	acked    int64 // the standby's end offset acknowledged so far
	plain    producer
	slots    []*txnSlot
	open     map[int64]*txnSlot // source producer ID -> writer transaction
	marker   map[int64]int64    // source producer ID -> offset of its last marker seen
	inflight []pendingProduce
	epoch    int32     // source leader epoch of the last batch written (kept across sessions)
	trimmed  int64     // the standby's log start is known to be at least this
	srcStart int64     // the source's log start, when it is inside a batch
	srcLog   int64     // the source's log start at the last copy fetch
	srcEnd   int64     // the source's high watermark as the start's tail check read it (-1: not read)
	started  bool      // the session got as far as copying
	lastPing time.Time // when the last successful ownership check was sent
	fillSlot *txnSlot  // a filler transaction an earlier writer left open
	owned    bool      // the session took ownership (its fence period waited out)
	lastSent time.Time // when the session last sent an append or EndTxn
	// pred is what the partition's previous session in this process left
	// (fence.go, predecessor): the next takeOwnership uses it, once.
	pred *predecessor
	kept map[string]producer // the unused slots of a predecessor this session directly succeeded
	// settled: the predecessor this session directly succeeded left nothing
	// in flight (fence.go, settledBy), so one reading of the standby's end
	// suffices.
	settled bool
	marking bool // an EndTxn was sent and its marker not yet seen on the standby
}

// producer is a producer ID the writer appends with, and its next sequence
// on this partition.
type producer struct {
	id    int64
	epoch int16
	seq   int32
	txnID *string
}

type txnSlot struct {
	producer
	// unused: this process initialised the slot's producer and never
	// began a transaction with it, so a later session may keep it
	// (fence.go, predecessor).
	unused bool
	// lazy: the coordinator did not know the slot's transactional ID at
	// the session's start; readySlot initialises it before its first
	// transaction.
	lazy   bool
	open   bool
	srcPID int64
	// added: the partition is in the slot's open transaction but nothing
	// was appended yet (an earlier writer stopped in between); used first.
	added bool
}

type pendingProduce struct {
	conn  *conn
	call  *call
	base  int64 // source offset the batch must land at
	next  int64
	kind  string
	bytes int
}

func newWriter(m *Mirror, topic string, partition int32) *writer {
	w := &writer{
		m:          m,
		topic:      topic,
		partition:  partition,
		caught:     time.Now(),
		epoch:      -1,
		fetchedEnd: -1,
		listedEnd:  -1,
	}
	w.status = PartitionStatus{Topic: topic, Partition: partition, State: StateStarting, Mirrored: -1, SourceEnd: -1, SourceStable: -1}
	return w
}

// logger is the mirror's logger with the partition's fields. Made when a
// line is logged, which is rare: one kept per writer cost a kilobyte of
// heap per mirrored partition (zap encodes the fields into a buffer of the
// logger's own).
func (w *writer) logger() *zap.Logger {
	return w.m.log.With(zap.String("topic", w.topic), zap.Int32("partition", w.partition))
}

// Status returns the writer's status.
func (w *writer) Status() PartitionStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.status
	if st.State == StateMirroring || st.State == StateStarting || st.State == StateHalted {
		// Halted, the lag keeps growing from the last time it was
		// caught up, as the records do.
		st.LagTime = time.Since(w.caught)
	}
	return st
}

func (w *writer) setState(s PartitionState, err error) {
	w.mu.Lock()
	w.status.State = s
	w.status.Err = err
	w.mu.Unlock()
}

// progress updates the mirrored offset and lag after a fetch or an ack.
func (w *writer) progress(srcEnd, srcStable int64) {
	w.mu.Lock()
	if srcEnd >= 0 {
		w.fetchedEnd, w.status.SourceStable = srcEnd, srcStable
	}
	w.status.Mirrored = w.acked
	w.advanceLocked()
	w.mu.Unlock()
}

// advanceLocked recomputes the source end and the lag, moves the state
// between mirroring and caught up (a writer starting, halted or stopped
// keeps its state), and sets the metrics. w.mu is held.
func (w *writer) advanceLocked() {
	w.updateLocked()
	st := &w.status
	if st.State != StateHalted && st.State != StateStopped {
		if st.LagRecords == 0 && st.SourceEnd >= 0 {
			st.State = StateCaughtUp
			st.Err = nil
			w.caught = time.Now()
		} else {
			st.State = StateMirroring
		}
	}
}

// updateLocked sets SourceEnd to the larger of the high watermark of the
// last fetch and the end last listed (ends.go), the lag from it, and the
// lag metrics; a caught-up partition whose listed end is ahead is
// mirroring again. w.mu is held.
func (w *writer) updateLocked() {
	st := &w.status
	st.SourceEnd = max(w.fetchedEnd, w.listedEnd)
	mirrored := st.Mirrored
	if mirrored < 0 {
		if st.SourceEnd < 0 {
			return // neither end known: no lag to tell
		}
		// Not started (or halted before it started): nothing is known
		// to be on the standby, so the whole source end is the lag a
		// forced switch must count on losing, not 0.
		mirrored = 0
	}
	lag := max(st.SourceEnd-mirrored, 0)
	st.LagRecords = lag
	if lag > 0 && st.State == StateCaughtUp {
		st.State = StateMirroring
	}
	if lag == 0 {
		// Caught up as of this listing: an idle partition's fetch may
		// not end for idleFetchMaxWait, and the lag time of its next
		// record counts from here, not from that fetch.
		w.caught = time.Now()
	}
}

// start runs the writer in a goroutine of its own: from a new session, or
// (resume) back into its copy loop after parking, the session's state
// intact. done is closed when the writer stops for good, not when it
// parks. It reports false when the mirror is closed.
func (w *writer) start(resume bool) bool {
	if !w.m.goRun(func() {
		if !w.run(w.ctx, resume) {
			close(w.done)
		}
	}) {
		close(w.done)
		return false
	}
	return true
}

// errParked ends a writer's goroutine when its partition parks.
var errParked = errors.New("mirror: partition parked")

// run mirrors the partition until ctx ends or the writer halts, or parks
// (true: its watcher starts it again). Transient errors (leader moves,
// broker restarts, lost connections) end a session; the next session starts
// again from the standby's end offset.
func (w *writer) run(ctx context.Context, resume bool) (parked bool) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		var err error
		if resume {
			resume, w.started = false, true
			err = w.copyLoop(ctx)
		} else {
			w.started = false
			err = w.session(ctx)
		}
		if errors.Is(err, errParked) {
			return true // the watcher has the writer now: touch nothing
		}
		w.pred = w.predecessor()
		w.closeConns()
		if w.started {
			backoff = 100 * time.Millisecond
		}
		if ctx.Err() != nil {
			return false
		}
		var halt *HaltError
		if errors.Is(err, ErrFenced) && w.m.cfg.ownership != nil {
			// Another member believes it owns the partition too: the
			// ownership is moving, and the two views have not met yet.
			// The fence kept the standby whole; this is no halt. Lost
			// here too, assign cancels ctx; still owned after two
			// fence periods (the other member's time to learn it is not the
			// owner), take the partition back.
			w.logger().Warn("mirror partition writer fenced by another member's writer, retrying while this member owns it",
				zap.Error(err), zap.Duration("backoff", 2*w.m.cfg.fencePeriod))
			w.setState(StateStarting, err)
			if sleep(ctx, 2*w.m.cfg.fencePeriod) != nil {
				return false
			}
			continue
		}
		if errors.As(err, &halt) {
			w.logger().Error("mirror partition halted", zap.Error(err))
			w.m.metrics.halt(w.topic, w.partition, err)
			w.setState(StateHalted, err)
			return false
		}
		if errors.Is(err, errTopicGone) {
			w.setState(StateStopped, err)
			return false
		}
		w.logger().Warn("mirror partition session ended, retrying", zap.Error(err), zap.Duration("backoff", backoff))
		w.mu.Lock()
		w.status.Err = err
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return false
}

var errTopicGone = errors.New("mirror: source topic deleted")

func (w *writer) closeConns() {
	if w.src != nil {
		w.src.Close()
		w.src = nil
	}
	if w.dst != nil {
		w.dst.Close()
		w.dst = nil
	}
	w.inflight = nil
}

func (w *writer) halt(err error, offset int64, format string, args ...any) error {
	return &HaltError{Topic: w.topic, Partition: w.partition, Offset: offset, Detail: fmt.Sprintf(format, args...), Err: err}
}

// session connects to both leaders, initialises the writer's producers
// (which fences and aborts whatever an earlier writer left open), finds the
// standby's end, checks that the standby's tail matches the source, and
// then copies until an error.
func (w *writer) session(ctx context.Context) error {
	looked := time.Now()
	srcAddr, err := w.m.leaderAddr(ctx, w.m.srcLeaders, w.topic, w.partition)
	if err != nil {
		return fmt.Errorf("source leader: %w", err)
	}
	dstAddr, err := w.m.leaderAddr(ctx, w.m.dstLeaders, w.topic, w.partition)
	if err != nil {
		return fmt.Errorf("standby leader: %w", err)
	}
	// Dialed when first used: none is held through the fence period.
	w.src = newLink(srcAddr, w.m.cfg.srcSec, w.m.metrics.conns)
	w.dst = newLink(dstAddr, w.m.cfg.dstSec, w.m.metrics.conns)
	w.srcLog, w.srcEnd = -1, -1
	began := time.Now()

	// A target without DescribeTransactions (Kafka before 3.0) cannot
	// run the fence checks below: halted at once, saying so, rather than
	// failing every check.
	if w.m.dstAPIs.lacks(ctx, w.m.dst, int16(kmsg.DescribeTransactions)) {
		return w.halt(ErrTargetTooOld, w.next,
			"the target cluster offers no DescribeTransactions (KIP-664, Kafka 3.0 and later), which each writer needs to fence an older one before it appends: it cannot be mirrored into until it is upgraded")
	}
	w.produceV = produceVersion
	if v, ok, err := w.m.dstAPIs.maxVersion(ctx, w.m.dst, int16(kmsg.Produce)); err == nil && ok {
		w.produceV = min(produceVersion, v)
	}
	// Ownership (see fence.go): the partition's own transactional ID,
	// whose producer appends the plain batches and fillers of one. Its
	// InitProducerId bumps the epoch, which stops an older writer at its
	// next fence check and at the standby leader from our first append on.
	if err := w.takeOwnership(ctx); err != nil {
		return err
	}
	owned := time.Now()
	// The transactional slots (recover.go): a transaction an earlier writer
	// left open on this partition is resumed, every other slot is
	// initialised (which fences an older writer's transactional work).
	w.open = make(map[int64]*txnSlot)
	w.fillSlot = nil
	if err := w.initSlots(ctx); err != nil {
		return err
	}
	slotted := time.Now()
	w.marker = make(map[int64]int64)
	w.srcStart = 0

	// The checks that need no connection of the writer's own, before it
	// queues for one: the standby's end, where the source's leader epoch
	// of the last batch mirrored ends, and an empty standby partition's
	// source end (it has no tail to check; that end says whether there is
	// anything to copy, unknown on an error: it parks). Each is shared
	// with the other writers starting now, one request per leader.
	end, err := w.standbyEnd(ctx)
	if err != nil {
		return err
	}
	w.next, w.acked, w.marking = end, end, false
	if err := w.checkEpoch(ctx); err != nil {
		return err
	}
	if w.next == 0 {
		if end, err := w.m.endOf(ctx, w.m.srcEnds, w.topic, w.partition); err == nil {
			w.srcEnd = end
		}
	}
	ended := time.Now()

	// Every writer starts at once after a switch: at most setupParallel
	// hold their two connections through the checks below, and each then
	// parks unless its source is known to be ahead (the watcher wakes it
	// at once if there is anything to copy).
	// Ten thousand writers dialing both leaders together took 20,000 file
	// descriptors at each broker, and the brokers down with them.
	select {
	case w.m.setups <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	release := sync.OnceFunc(func() { <-w.m.setups })
	defer release()
	admitted := time.Now()
	// The connections are dialed when first used: by the tail check here.
	if err := w.checkTail(ctx); err != nil {
		return err
	}
	if err := w.resumeOpen(ctx); err != nil {
		return err
	}
	// The steps' times tell where a slow start went (after a switch, every
	// writer starts at once and they queue at the coordinator and at setups).
	w.logger().Info("mirror partition writer started", zap.Int64("offset", w.next), zap.Int64("producer_id", w.plain.id),
		zap.Duration("took", time.Since(began)), zap.Duration("leaders", began.Sub(looked)), zap.Duration("ownership", owned.Sub(began)),
		zap.Duration("slots", slotted.Sub(owned)), zap.Duration("ends", ended.Sub(slotted)), zap.Duration("queued", admitted.Sub(ended)),
		zap.Duration("checks", time.Since(admitted)))
	w.m.metrics.starts.Observe(time.Since(looked).Seconds())
	w.progress(-1, -1)
	w.started = true
	// A partition the tail check found behind its source copies at once:
	// parking would close both connections only for the watcher to wake
	// it and dial them again (1,000 restarted writers with a backlog each
	// paid that twice).
	if len(w.inflight) == 0 && w.srcEnd <= w.next {
		return w.park(ctx, max(w.next, w.srcStart))
	}
	release()
	return w.copyLoop(ctx)
}

// setupParallel bounds the writers holding their connections through a
// session's start (session).
const setupParallel = 256

// standbyEnd returns the standby's end offset: its high watermark, waiting
// until it stops moving (an append acknowledged by the leader but not yet
// by every in-sync replica sits above it for a moment) — unless the
// session directly succeeds one of this process that left nothing in
// flight (settled): no append can be on its way then, and the wait of
// 50 ms held one of the setupParallel slots of every restarted writer.
func (w *writer) standbyEnd(ctx context.Context) (int64, error) {
	prev := int64(-2)
	for range 50 {
		hw, err := w.m.endOf(ctx, w.m.dstEnds, w.topic, w.partition)
		if err != nil {
			return 0, err
		}
		if hw == prev || w.settled {
			return hw, nil
		}
		prev = hw
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
	}
	return 0, errors.New("standby high watermark does not settle")
}

// endOf reads a partition's high watermark through ends (m.dstEnds or
// m.srcEnds): the readings of writers starting together share a ListOffsets
// request per broker, where a thousand restarted writers sent a thousand,
// each on its own new connection, to brokers that were the catch-up's
// bottleneck.
func (m *Mirror) endOf(ctx context.Context, ends *coalescer[topicPartition, kadm.ListedOffset], topic string, partition int32) (int64, error) {
	tp := topicPartition{topic, partition}
	got, err := ends.getAll(ctx, tp)
	if err != nil {
		return 0, fmt.Errorf("ListOffsets: %w", err)
	}
	o, ok := got[tp]
	switch {
	case !ok:
		return 0, fmt.Errorf("ListOffsets: %w", kerr.UnknownTopicOrPartition)
	case o.Err != nil:
		return 0, fmt.Errorf("ListOffsets: %w", o.Err)
	}
	return o.Offset, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// listOffset asks c (a leader) for the partition's offset at ts (-1 latest,
// -2 earliest).
func (w *writer) listOffset(ctx context.Context, c *link, ts int64) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.Version = listOffsetsVersion
	req.ReplicaID = -1
	t := kmsg.NewListOffsetsRequestTopic()
	t.Topic = w.topic
	p := kmsg.NewListOffsetsRequestTopicPartition()
	p.Partition = w.partition
	p.CurrentLeaderEpoch = -1
	p.Timestamp = ts
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	resp, err := c.Do(ctx, req)
	if err != nil {
		return 0, err
	}
	r := resp.(*kmsg.ListOffsetsResponse)
	if len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1 {
		return 0, errors.New("ListOffsets: malformed response")
	}
	rp := r.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
		return 0, fmt.Errorf("ListOffsets: %w", err)
	}
	return rp.Offset, nil
}

// fetch reads raw batches from c at offset.
func (w *writer) fetch(ctx context.Context, c *link, offset int64, isolation int8, maxWait time.Duration, maxBytes int32) (*kmsg.FetchResponseTopicPartition, error) {
	return fetchedPartition(c.Do(ctx, w.fetchRequest(c, offset, isolation, maxWait, maxBytes)))
}

// fetchRequest is the fetch of the writer's partition from c at offset.
func (w *writer) fetchRequest(c *link, offset int64, isolation int8, maxWait time.Duration, maxBytes int32) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.Version = fetchVersion
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(maxWait / time.Millisecond)
	req.MinBytes = 1
	req.MaxBytes = maxBytes
	req.IsolationLevel = isolation
	req.SessionEpoch = -1
	t := kmsg.NewFetchRequestTopic()
	t.Topic = w.topic
	p := kmsg.NewFetchRequestTopicPartition()
	p.Partition = w.partition
	p.CurrentLeaderEpoch = -1
	p.LastFetchedEpoch = -1
	if c == w.src {
		p.LastFetchedEpoch = w.epoch
	}
	p.FetchOffset = offset
	p.LogStartOffset = -1
	p.PartitionMaxBytes = maxBytes
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	return req
}

// fetchedPartition is the one partition of a fetch's answer.
func fetchedPartition(resp kmsg.Response, err error) (*kmsg.FetchResponseTopicPartition, error) {
	if err != nil {
		return nil, err
	}
	r := resp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
		return nil, fmt.Errorf("Fetch: %w", err)
	}
	if len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1 {
		return nil, errors.New("Fetch: malformed response")
	}
	return &r.Topics[0].Partitions[0], nil
}

// oneBatch is the size a fetch asks for when it needs only the batch
// holding an offset: a broker answers a fetch's first batch whole, however
// large (KIP-74, Kafka 0.10.1), and nothing after it when asked for one
// byte. The tail check at every writer start asked for 1 MiB, so a
// partition with a backlog sent up to a mebibyte of it, read and thrown
// away, before its copy began: a thousand restarted writers read the
// backlog twice.
const oneBatch = 1

// firstBatchAt returns the first complete batch in records that ends after
// offset.
func firstBatchAt(records []byte, offset int64) (protocol.Batch, error) {
	var found protocol.Batch
	err := protocol.WalkBatches(records, func(b protocol.Batch) error {
		if b.NextOffset() > offset {
			found = b
			return errStopWalk
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopWalk) {
		return nil, err
	}
	return found, nil
}

var errStopWalk = errors.New("stop")

// checkTail compares the standby's last batch with the source at the same
// offset. It catches a crash that left the standby different from the
// source: an ABORT marker a restarted writer's InitProducerId wrote where the
// source has data, or a source that was truncated or rewritten under the
// mirror. An ABORT where the source has a COMMIT (a crash between the last
// batch of a committed transaction and its marker) keeps offsets equal: it
// is reported and counted, and mirroring goes on.
//
// A tail that differs halts the writer. Before it does, it finds where the
// two logs part (divergedFrom) and reports that as its mirrored offset: a
// forced switch loses the source's records from there, whatever the
// standby's end (routing.Position.Matches).
func (w *writer) checkTail(ctx context.Context) error {
	if w.next == 0 {
		return nil
	}
	err := w.compareAt(ctx, w.next-1, true)
	if h := (*HaltError)(nil); errors.As(err, &h) && Parted(err) {
		from, ferr := w.divergedFrom(ctx, w.next-1)
		if ferr != nil {
			return ferr // transient: the next session checks again
		}
		w.mu.Lock()
		w.status.Mirrored = from
		w.mu.Unlock()
		h.Detail += fmt.Sprintf("; the standby holds what the source does below %d", from)
	}
	return err
}

// divergedFrom returns the first offset at or below at (where the standby
// differs from the source) from which it differs: a binary search with
// compareAt, as a log that parted from its source stays apart (a batch
// that differs shifts or replaces everything after it). Offsets below
// either log's start compare as equal.
func (w *writer) divergedFrom(ctx context.Context, at int64) (int64, error) {
	lo, hi := int64(0), at // the first differing offset is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		err := w.compareAt(ctx, mid, false)
		var h *HaltError
		switch {
		case err == nil:
			lo = mid + 1
		case errors.As(err, &h):
			hi = mid
		default:
			return 0, err
		}
	}
	return lo, nil
}

// compareAt compares the standby's batch holding offset at with the
// source's; nil when they hold the same, a *HaltError when not. At the
// tail (tail) it also halts on a source shorter than the standby, takes
// the source's leader epoch, and reports an ABORT where the source has a
// COMMIT.
func (w *writer) compareAt(ctx context.Context, at int64, tail bool) error {
	st, err := w.fetch(ctx, w.dst, at, 0, 0, oneBatch)
	if err != nil {
		return err
	}
	if st.ErrorCode == kerr.OffsetOutOfRange.Code {
		if !tail {
			return nil // below the standby's log start: nothing to compare
		}
		return w.tailDeleted(ctx, at)
	}
	if err := kerr.ErrorForCode(st.ErrorCode); err != nil {
		return fmt.Errorf("standby fetch at %d: %w", at, err)
	}
	sb, err := firstBatchAt(st.RecordBatches, at)
	if err != nil || sb == nil {
		// Nothing readable there (e.g. the standby's own log start is
		// at its end): nothing to compare.
		return nil
	}
	sr, err := w.fetch(ctx, w.src, at, 0, 0, oneBatch)
	if err != nil {
		return err
	}
	if sr.ErrorCode == kerr.OffsetOutOfRange.Code {
		if !tail {
			return nil // below the source's log start: nothing to compare
		}
		hw, err := w.listOffset(ctx, w.src, -1)
		if err != nil {
			return err
		}
		if hw < w.next {
			return w.halt(ErrSourceTruncated, w.next, "standby holds offsets up to %d, source ends at %d", w.next, hw)
		}
		return nil // below the source's log start: nothing to compare
	}
	if err := kerr.ErrorForCode(sr.ErrorCode); err != nil {
		return fmt.Errorf("source fetch at %d: %w", at, err)
	}
	if tail {
		w.srcEnd = sr.HighWatermark
	}
	if tail && sr.HighWatermark < w.next {
		return w.halt(ErrSourceTruncated, w.next, "standby holds offsets up to %d, source high watermark is %d", w.next, sr.HighWatermark)
	}
	rb, err := firstBatchAt(sr.RecordBatches, at)
	if err != nil {
		return err
	}
	covers := rb != nil && rb.BaseOffset() <= at
	if rb != nil && tail {
		w.epoch = rb.PartitionLeaderEpoch()
	}
	switch {
	case sb.IsControl():
		if !covers || !rb.IsControl() && !rb.HasRecordAt(at) {
			return nil // our own filler's marker in a source gap
		}
		if protocol.IsFillerBatch(rb) {
			// A marker with no data on this partition (a transaction
			// fenced by the switch's drain), which the mirror copied as a
			// filler when it ran the other way.
			return nil
		}
		if !rb.IsControl() {
			if twice, err := w.markerTwice(ctx, sb, at); err != nil {
				return err
			} else if twice {
				return w.halt(ErrMarkerTwice, at, "standby has the transaction marker at %d again at %d, where the source has data: the standby's coordinator wrote it twice (its broker restarted before the transaction was recorded complete); the standby is one offset ahead from %d, copy the topic again", at-1, at, at)
			}
			return w.halt(ErrDiverged, at, "standby has a transaction marker at %d where the source has data (writer crashed inside a transaction)", at)
		}
		st, _ := protocol.ControlType(sb)
		rt, _ := protocol.ControlType(rb)
		if st == protocol.ControlAbort && rt == protocol.ControlCommit && tail {
			w.m.metrics.lostCommit.Inc()
			w.logger().Error("source transaction committed but aborted on the standby (writer crashed before the commit): read_committed readers of the standby miss the last batch before this offset",
				zap.Int64("marker_offset", at))
		}
		return nil
	case protocol.IsFillerBatch(sb):
		if covers && !rb.IsControl() && rb.HasRecordAt(at) {
			return w.halt(ErrDiverged, at, "standby has a filler at %d where the source has data", at)
		}
		return nil
	default:
		// A source batch with holes inside went as runs (reframe.go).
		if !covers || !tailMatches(rb, sb) {
			return w.halt(ErrDiverged, at, "standby batch at %d differs from the source", sb.BaseOffset())
		}
		return nil
	}
}

// tailDeleted is the tail check of a standby whose fetch at its last offset
// at was out of range. Its log start may have passed its end: every record
// deleted, as Kafka Streams leaves a repartition topic once it has processed
// all of it (it purges up to its committed offset, the end), and as the
// mirror copies such a purge (trimLogStart). No batch is left to compare;
// the source must still reach the standby's end. Any other out of range
// (the standby's end moved below at) is an error, retried by the next
// session. Before, every start of such a partition's writer failed here
// for as long as the log stayed empty, so the mirror never caught up.
func (w *writer) tailDeleted(ctx context.Context, at int64) error {
	start, err := w.listOffset(ctx, w.dst, -2)
	if err != nil {
		return err
	}
	if start <= at {
		return fmt.Errorf("standby fetch at %d: %w (log start %d)", at, kerr.OffsetOutOfRange, start)
	}
	hw, err := w.listOffset(ctx, w.src, -1)
	if err != nil {
		return err
	}
	if hw < w.next {
		return w.halt(ErrSourceTruncated, w.next, "standby holds offsets up to %d, source ends at %d", w.next, hw)
	}
	w.srcEnd = hw
	return nil
}

// markerTwice reports whether the standby's marker sb at at repeats the
// one just before it: the standby holds a marker of the same producer,
// epoch and kind at at-1, and the source a marker of that kind there. A
// writer that crashed inside a transaction leaves an ABORT of a new epoch
// (its InitProducerId) after data; a coordinator that resent a marker
// leaves the same marker twice.
func (w *writer) markerTwice(ctx context.Context, sb protocol.Batch, at int64) (bool, error) {
	if at == 0 {
		return false, nil
	}
	pid, epoch := sb.ProducerID(), sb.ProducerEpoch()
	kind, err := protocol.ControlType(sb)
	if err != nil {
		return false, nil
	}
	// markerAt reports whether c holds a marker of kind at at-1 (of pid
	// and epoch when ours: the source's markers are its producers').
	markerAt := func(c *link, ours bool) (bool, error) {
		r, err := w.fetch(ctx, c, at-1, 0, 0, oneBatch)
		if err != nil {
			return false, err
		}
		if kerr.ErrorForCode(r.ErrorCode) != nil {
			return false, nil
		}
		b, err := firstBatchAt(r.RecordBatches, at-1)
		if err != nil || b == nil || !b.IsControl() || b.BaseOffset() != at-1 {
			return false, nil
		}
		if ours && (b.ProducerID() != pid || b.ProducerEpoch() != epoch) {
			return false, nil
		}
		k, err := protocol.ControlType(b)
		return err == nil && k == kind, nil
	}
	if twice, err := markerAt(w.dst, true); err != nil || !twice {
		return false, err
	}
	return markerAt(w.src, false)
}

// copyLoop fetches and appends until an error.
func (w *writer) copyLoop(ctx context.Context) error {
	cfg := &w.m.cfg
	wait := cfg.fetchMaxWait
	caughtUp := false // the last fetch's high watermark is copied
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Nothing is in flight here (drain): a connection whose SASL
		// session nears its end is replaced now.
		w.renewConns()
		// Fetch from the source's log start if that is inside the batch
		// the standby needs next: the broker returns that batch whole.
		at := max(w.next, w.srcStart)
		idle := wait >= max(cfg.idleWait, cfg.fetchMaxWait)
		if len(w.inflight) == 0 && (idle || caughtUp && w.m.metrics.conns.over(cfg.connBudget)) {
			// Idle, or caught up with the mirror's connections over
			// their budget (ConnectionBudget): the partition's watcher
			// waits for it (watch.go).
			return w.park(ctx, at)
		}
		if cfg.onFetch != nil {
			cfg.onFetch(w.topic, w.partition, wait)
		}
		// The answer is read into a pooled buffer, given back once its
		// batches are on the standby (drain below): nothing of it is kept
		// past that. On any error it is left to the collector.
		resp, body, err := w.src.DoPooled(ctx, w.fetchRequest(w.src, at, 1, wait, cfg.fetchBytes))
		p, err := fetchedPartition(resp, err)
		if err != nil {
			return err
		}
		w.srcLog = p.LogStartOffset
		wait = nextFetchWait(wait, cfg.fetchMaxWait, cfg.idleWait, len(p.RecordBatches) > 0)
		switch p.ErrorCode {
		case 0:
		case kerr.OffsetOutOfRange.Code:
			if err := w.outOfRange(ctx); err != nil {
				return err
			}
			continue
		default:
			return fmt.Errorf("source fetch: %w", kerr.ErrorForCode(p.ErrorCode))
		}
		if p.DivergingEpoch.EndOffset >= 0 && p.DivergingEpoch.EndOffset < w.next {
			return w.halt(ErrSourceTruncated, w.next, "source leader epoch %d ends at %d, below the mirrored offset", p.DivergingEpoch.Epoch, p.DivergingEpoch.EndOffset)
		}
		if p.HighWatermark < w.acked {
			return w.halt(ErrSourceTruncated, w.next, "source high watermark %d is below the mirrored offset %d", p.HighWatermark, w.acked)
		}
		if err := w.process(ctx, p, len(p.RecordBatches) >= int(cfg.fetchBytes)*9/10); err != nil {
			return err
		}
		if err := w.drain(ctx); err != nil {
			return err
		}
		answerBufs.Put(body)
		caughtUp = w.next >= p.HighWatermark
		w.progress(p.HighWatermark, p.LastStableOffset)
		if err := w.trimLogStart(ctx, p.LogStartOffset); err != nil {
			return err
		}
	}
}

// idleFetchMaxWait is how long the fetches of a partition with nothing new
// wait at the source leader before the partition parks (watch.go), reached
// by doubling FetchMaxWait after each empty fetch; the first fetch that
// returns records goes back to FetchMaxWait. A fetch asks for one byte
// (MinBytes 1), so the leader answers as soon as anything is appended (or
// the leader moves, or the partition is deleted): the wait delays no
// record. Each fetch of an idle partition costs a round trip of CPU here
// and at the broker, and its two connections a buffer each: a partition
// idle for the sum of these waits (15 s at the default FetchMaxWait)
// closes them and costs nothing on its own until its log changes.
const idleFetchMaxWait = 10 * time.Second

// nextFetchWait is the wait of the fetch after one that waited wait and
// returned records (got) or none; a wait of max(idle, base) parks.
func nextFetchWait(wait, base, idle time.Duration, got bool) time.Duration {
	if got {
		return base
	}
	return min(2*wait, max(idle, base))
}

// park closes the writer's connections and hands the partition to its
// watcher, which starts the writer again (wake) when the source log
// changes past at, when it fails, or when ctx ends; it returns errParked,
// which ends the writer's goroutine. Nothing is in flight. A parked
// partition costs its writer's state and nothing else: no goroutine, no
// connection, no request of its own.
func (w *writer) park(ctx context.Context, at int64) error {
	addr := w.src.addr
	w.src.Close()
	w.dst.Close()
	w.inflight = nil
	w.watcher = w.m.watcherFor(addr)
	w.parked.Store(true)
	w.m.mu.Lock()
	id := w.m.topicIDs[w.topic]
	w.m.mu.Unlock()
	w.watcher.park(ctx, topicPartition{w.topic, w.partition},
		parkedFetch{offset: at, epoch: w.epoch, logStart: w.srcLog, topicID: id}, w.watched, w.wake)
	return errParked
}

// watched records the source's high watermark as a parked writer's
// watcher saw it (in listEnds' place): a writer that parked as its session
// started learns here that it is caught up, where its first fetch told it.
func (w *writer) watched(hw int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.retired {
		w.listedEnd = hw
		w.advanceLocked()
	}
}

// wake starts a parked writer again, back into its copy loop. Caught up
// until now: the lag time of what woke it counts from here, as listEnds
// would have had it.
func (w *writer) wake() {
	w.parked.Store(false)
	w.mu.Lock()
	if w.status.LagRecords == 0 {
		w.caught = time.Now()
	}
	w.mu.Unlock()
	w.start(true)
}

// renewConns closes a connection whose SASL session (KIP-368) nears its
// end; the next request dials a new one to the same leader. Nothing may be
// in flight. The producers' state is the writer's, not the connections'.
func (w *writer) renewConns() {
	if len(w.inflight) > 0 {
		return
	}
	w.src.renew()
	w.dst.renew()
}

// outOfRange handles a fetch below the source's log start (fill up to it)
// or above its end (the source lost what was mirrored).
func (w *writer) outOfRange(ctx context.Context) error {
	start, err := w.listOffset(ctx, w.src, -2)
	if err != nil {
		return err
	}
	end, err := w.listOffset(ctx, w.src, -1)
	if err != nil {
		return err
	}
	switch {
	case w.next > end:
		return w.halt(ErrSourceTruncated, w.next, "source ends at %d, below the mirrored offset %d", end, w.next)
	case w.next < start:
		// The log start may be inside a batch, which a fetch at it
		// returns whole: fill up to that batch.
		to := start
		p, err := w.fetch(ctx, w.src, start, 1, 0, oneBatch)
		if err != nil {
			return err
		}
		if p.ErrorCode == 0 {
			if b, err := firstBatchAt(p.RecordBatches, start); err == nil && b != nil && b.BaseOffset() < to {
				to = max(b.BaseOffset(), w.next)
			}
		}
		w.srcStart = start
		if to == w.next {
			return nil
		}
		w.logger().Info("source log starts above the mirror position: filling", zap.Int64("from", w.next), zap.Int64("to", to))
		if err := w.fill(ctx, w.next, to); err != nil {
			return err
		}
		return w.drain(ctx)
	}
	return nil // raced with retention or a leader change: fetch again
}

// trimLogStart moves the standby's log start up to the source's once the
// standby holds it, so that fillers below it disappear like the source's
// records did.
func (w *writer) trimLogStart(ctx context.Context, srcStart int64) error {
	if srcStart <= 0 || w.acked < srcStart || w.trimmed >= srcStart {
		return nil
	}
	start, err := w.listOffset(ctx, w.dst, -2)
	if err != nil {
		return err
	}
	if start >= srcStart {
		w.trimmed = start
		return nil
	}
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.TimeoutMillis = 30000
	t := kmsg.NewDeleteRecordsRequestTopic()
	t.Topic = w.topic
	p := kmsg.NewDeleteRecordsRequestTopicPartition()
	p.Partition = w.partition
	p.Offset = srcStart
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, w.m.dst)
	if err != nil {
		return err
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return fmt.Errorf("DeleteRecords on standby: %w", err)
			}
		}
	}
	w.logger().Info("standby log start raised to match the source", zap.Int64("log_start", srcStart))
	w.trimmed = srcStart
	return nil
}

// process appends the batches of one fetch response. full says the
// response was cut by its size limit.
func (w *writer) process(ctx context.Context, p *kmsg.FetchResponseTopicPartition, full bool) error {
	var batches []protocol.Batch
	err := protocol.WalkBatches(p.RecordBatches, func(b protocol.Batch) error {
		if b.NextOffset() > w.next {
			batches = append(batches, b)
		}
		return nil
	})
	if err != nil {
		return w.halt(ErrUnsupportedBatch, w.next, "%v", err)
	}
	aborted := p.AbortedTransactions
	sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })

	for i, b := range batches {
		base := b.BaseOffset()
		if err := b.CheckCRC(); err != nil {
			return w.halt(ErrUnsupportedBatch, base, "%v", err)
		}
		// A batch the log cleaner left with holes inside it goes as runs
		// of consecutive records (reframe.go).
		runs, err := w.reframe(b)
		if err != nil {
			return err
		}
		switch {
		case runs != nil:
			// The gaps before, between and after the runs are filled as
			// the runs are written (send).
		case base < w.next:
			return w.halt(ErrDiverged, w.next, "standby ends at %d, inside the source batch %d..%d", w.next, base, b.NextOffset()-1)
		case base > w.next:
			if err := w.fill(ctx, w.next, base); err != nil {
				return err
			}
		}
		w.epoch = b.PartitionLeaderEpoch()
		pid := b.ProducerID()

		if b.IsControl() {
			typ, err := protocol.ControlType(b)
			if err != nil {
				return w.halt(ErrUnsupportedBatch, base, "%v", err)
			}
			w.marker[pid] = base
			slot := w.open[pid]
			if slot == nil {
				// A marker with no data of its transaction here (or
				// whose data was below the mirror's start): a gap of one.
				if err := w.fill(ctx, base, base+1); err != nil {
					return err
				}
				continue
			}
			if err := w.endTxn(ctx, slot, typ == protocol.ControlCommit, base); err != nil {
				return err
			}
			delete(w.open, pid)
			continue
		}
		if b.NumRecords() == 0 {
			// An empty batch the log cleaner kept for its producer state.
			if err := w.fill(ctx, base, b.NextOffset()); err != nil {
				return err
			}
			continue
		}
		if b.Magic() != protocol.BatchMagic {
			return w.halt(ErrUnsupportedBatch, base, "magic %d", b.Magic())
		}

		if !b.IsTransactional() {
			if err := w.send(ctx, b, runs, nil, "plain"); err != nil {
				return err
			}
			continue
		}
		if slot := w.open[pid]; slot != nil {
			if err := w.send(ctx, b, runs, slot, "txn"); err != nil {
				return err
			}
			continue
		}
		inTxn := w.isAborted(aborted, pid, base)
		if !inTxn {
			// Committed: only the transaction's last batch here goes in a
			// writer transaction, so that a crash of the writer can abort
			// no more than one batch. Look ahead for the producer's next
			// batch.
			switch lookahead(batches[i+1:], pid) {
			case aheadData:
				inTxn = false
			case aheadMarker:
				inTxn = true
			default:
				if i > 0 {
					// Fetch again from here to see further.
					return nil
				}
				// Nothing further is readable yet (the marker is beyond
				// the last stable offset, or the response was cut):
				// write it inside the transaction, which is always
				// correct, with a longer crash window.
				inTxn = true
				_ = full
			}
		}
		if !inTxn {
			if err := w.send(ctx, b, runs, nil, "plain"); err != nil {
				return err
			}
			continue
		}
		slot, err := w.beginTxn(ctx, pid, base)
		if err != nil {
			return err
		}
		if err := w.send(ctx, b, runs, slot, "txn"); err != nil {
			return err
		}
	}
	return nil
}

type ahead int

const (
	aheadUnknown ahead = iota
	aheadData
	aheadMarker
)

func lookahead(rest []protocol.Batch, pid int64) ahead {
	for _, b := range rest {
		if b.ProducerID() != pid {
			continue
		}
		if b.IsControl() {
			return aheadMarker
		}
		return aheadData
	}
	return aheadUnknown
}

// isAborted reports whether the source transaction of producer pid that
// the batch at base belongs to was aborted: the fetch's aborted
// transactions list an entry for pid starting after the producer's last
// marker and at or before base.
func (w *writer) isAborted(aborted []kmsg.FetchResponseTopicPartitionAbortedTransaction, pid, base int64) bool {
	last, ok := w.marker[pid]
	if !ok {
		last = -1
	}
	for _, a := range aborted {
		if a.ProducerID == pid && a.FirstOffset <= base && a.FirstOffset > last {
			return true
		}
	}
	return false
}

// produce re-stamps b for the writer's producer (slot's if in a
// transaction) and sends it, keeping at most InFlight in flight.
func (w *writer) produce(ctx context.Context, b protocol.Batch, slot *txnSlot, kind string) error {
	if len(w.inflight) >= w.m.cfg.inflight {
		if err := w.waitOldest(ctx); err != nil {
			return err
		}
	}
	if w.dst.c != nil && w.dst.c.renewing() {
		// Its SASL session nears its end in the middle of a long
		// fetch's batches: what is in flight is answered on it, the
		// rest goes on a new connection.
		for len(w.inflight) > 0 {
			if err := w.waitOldest(ctx); err != nil {
				return err
			}
		}
		w.dst.renew()
	}
	dst, err := w.dst.conn(ctx)
	if err != nil {
		return fmt.Errorf("standby leader: %w", err)
	}
	if w.fillSlot != nil && kind != "filler" {
		return w.halt(ErrDiverged, b.BaseOffset(),
			"a filler transaction an earlier writer left open ends at %d, but the source has data at %d", w.next-1, b.BaseOffset())
	}
	if err := w.checkFence(ctx); err != nil {
		return err
	}
	w.lastSent = time.Now()
	prod := &w.plain
	if slot != nil {
		prod = &slot.producer
	}
	attrs := b.Attributes() &^ (protocol.BatchAttrLogAppendTime | protocol.BatchAttrTransactional)
	if slot != nil {
		attrs |= protocol.BatchAttrTransactional
	}
	base, next := b.BaseOffset(), b.NextOffset()
	// The CRC from the header's change alone, not another pass over the
	// batch: its CRC was right (checked when fetched, or computed when
	// Ferry built it: a filler, a reframed run).
	var old [protocol.BatchHeaderSize]byte
	copy(old[:], b)
	// Kafka 4 refuses a client batch whose baseOffset is not 0; the
	// leader assigns it (outside the CRC).
	b.SetBaseOffset(0)
	b.SetAttributes(attrs)
	b.SetProducer(prod.id, prod.epoch, prod.seq)
	b.PatchCRC(old[:])
	prod.seq = nextSeq(prod.seq, b.NumRecords())

	req := kmsg.NewPtrProduceRequest()
	req.Version = w.produceV
	req.Acks = -1
	req.TimeoutMillis = 30000
	if slot != nil {
		req.TransactionID = prod.txnID
	}
	t := kmsg.NewProduceRequestTopic()
	t.Topic = w.topic
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Partition = w.partition
	pp.Records = b
	t.Partitions = append(t.Partitions, pp)
	req.Topics = append(req.Topics, t)

	w.inflight = append(w.inflight, pendingProduce{conn: dst, call: dst.Send(req), base: base, next: next, kind: kind, bytes: len(b)})
	w.next = next
	return nil
}

func nextSeq(seq, n int32) int32 {
	s := int64(seq) + int64(n)
	if s > math.MaxInt32 {
		s -= math.MaxInt32 + 1
	}
	return int32(s)
}

// waitOldest waits for the oldest Produce in flight and checks where the
// batch landed.
func (w *writer) waitOldest(ctx context.Context) error {
	pp := w.inflight[0]
	// The slot let go: it holds the connection and the response, which a
	// parked writer must not keep.
	w.inflight[0] = pendingProduce{}
	w.inflight = w.inflight[1:]
	resp, err := pp.conn.Wait(ctx, pp.call)
	if err != nil {
		return err
	}
	r := resp.(*kmsg.ProduceResponse)
	if len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1 {
		return errors.New("Produce: malformed response")
	}
	rp := r.Topics[0].Partitions[0]
	if rp.ErrorCode != 0 {
		perr := kerr.ErrorForCode(rp.ErrorCode)
		msg := ""
		if rp.ErrorMessage != nil {
			msg = *rp.ErrorMessage
		}
		for _, er := range rp.ErrorRecords {
			if er.ErrorMessage != nil {
				msg += fmt.Sprintf(" (record %d: %s)", er.RelativeOffset, *er.ErrorMessage)
			}
		}
		switch perr {
		case kerr.InvalidRecord, kerr.CorruptMessage, kerr.InvalidTimestamp, kerr.MessageTooLarge,
			kerr.RecordListTooLarge, kerr.UnsupportedForMessageFormat, kerr.InvalidRequiredAcks,
			kerr.TopicAuthorizationFailed, kerr.TransactionalIDAuthorizationFailed, kerr.ClusterAuthorizationFailed:
			return w.halt(ErrRejected, pp.base, "%v: %s", perr, msg)
		case kerr.ProducerFenced, kerr.InvalidProducerEpoch:
			return w.halt(ErrFenced, pp.base, "%v", perr)
		}
		return fmt.Errorf("Produce at %d: %w %s", pp.base, perr, msg)
	}
	if rp.BaseOffset != pp.base {
		return w.haltUnwritten(ctx, pp.base, "before the writer's next append", func(held string) error {
			return w.halt(ErrOffsetMismatch, pp.base, "standby appended the batch %d..%d at offset %d%s", pp.base, pp.next-1, rp.BaseOffset, held)
		})
	}
	w.acked = pp.next
	w.m.metrics.batches.WithLabelValues(pp.kind).Inc()
	if pp.kind != "filler" {
		w.m.metrics.bytes.Add(float64(pp.bytes))
	}
	return nil
}

// drain waits for every Produce in flight.
func (w *writer) drain(ctx context.Context) error {
	for len(w.inflight) > 0 {
		if err := w.waitOldest(ctx); err != nil {
			return err
		}
	}
	w.progress(-1, -1)
	return nil
}

// freeSlot returns a transactional slot with no transaction open.
func (w *writer) freeSlot(at int64) (*txnSlot, error) {
	for _, s := range w.slots {
		if !s.open && s.added {
			s.added = false
			return s, nil
		}
	}
	for _, s := range w.slots {
		if !s.open {
			return s, nil
		}
	}
	return nil, w.halt(ErrTooManyOpenTxns, at, "%d source transactions open at once, more than the writer's %d transactional slots", len(w.slots)+1, len(w.slots))
}

// readySlot readies slot s for a transaction: initialises its producer if
// the session left that to its first use (lazy), and marks it used (no
// later session keeps it: fence.go, predecessor).
func (w *writer) readySlot(ctx context.Context, s *txnSlot, at int64) error {
	s.unused = false
	if !s.lazy {
		return nil
	}
	// An InitProducerId fences whoever holds the ID: only an owner sends
	// one (see fence.go; a stale one, stuck past the fence period, halts
	// the next owner instead of mixing into its partition).
	if err := w.checkFence(ctx); err != nil {
		return err
	}
	p, err := w.m.initProducer(ctx, s.txnID)
	if err != nil {
		return w.txnErr(err, at)
	}
	s.producer, s.lazy = p, false
	return nil
}

// beginTxn opens a writer transaction for source producer pid.
func (w *writer) beginTxn(ctx context.Context, pid, at int64) (*txnSlot, error) {
	s, err := w.freeSlot(at)
	if err != nil {
		return nil, err
	}
	if err := w.readySlot(ctx, s, at); err != nil {
		return nil, err
	}
	if err := w.m.addPartition(ctx, &s.producer, w.topic, w.partition); err != nil {
		return nil, w.txnErr(err, at)
	}
	s.open, s.srcPID = true, pid
	w.open[pid] = s
	return s, nil
}

// endTxn waits for what is in flight, ends slot's transaction and waits
// until its marker is in the standby log at offset at.
func (w *writer) endTxn(ctx context.Context, s *txnSlot, commit bool, at int64) error {
	if err := w.drain(ctx); err != nil {
		return err
	}
	if w.next != at {
		return w.halt(ErrOffsetMismatch, at, "transaction marker due at %d, standby is at %d", at, w.next)
	}
	if err := w.checkFence(ctx); err != nil {
		return err
	}
	if testHookEndTxn != nil {
		testHookEndTxn(commit)
	}
	w.lastSent, w.marking = time.Now(), true
	if err := w.m.endTxn(ctx, &s.producer, commit); err != nil {
		return w.txnErr(err, at)
	}
	if testHookEndedTxn != nil {
		testHookEndedTxn(at, false)
	}
	s.open = false
	// The coordinator writes the marker after answering EndTxn.
	if err := w.waitEnd(ctx, at+1); err != nil {
		return err
	}
	if testHookEndedTxn != nil {
		testHookEndedTxn(at, true)
	}
	w.next, w.acked, w.marking = at+1, at+1, false
	return nil
}

// haltUnwritten halts a writer that found at offset a batch it did not
// write (when says at which step). The marker the standby holds at
// offset-1 again (the writer's own, and the source's there) is the
// standby's coordinator writing it twice: marker_twice. Anything else is
// the offset mismatch mismatch builds, given what the standby holds there
// ("" when it cannot be read).
func (w *writer) haltUnwritten(ctx context.Context, offset int64, when string, mismatch func(held string) error) error {
	b, err := w.batchAt(ctx, w.dst, offset)
	if err != nil || b == nil {
		return mismatch("")
	}
	kind := "data"
	if b.IsControl() {
		kind = "a control batch"
		if twice, err := w.markerTwice(ctx, b, offset); err == nil && twice {
			return w.halt(ErrMarkerTwice, offset, "standby has the transaction marker at %d again at %d, %s: the standby's coordinator wrote it twice; the standby is one offset ahead from %d, copy the topic again", offset-1, offset, when, offset)
		}
	}
	return mismatch(fmt.Sprintf(" (at %d the standby holds %s of producer %d, epoch %d, from %d)", offset, kind, b.ProducerID(), b.ProducerEpoch(), b.BaseOffset()))
}

// waitEnd polls the standby's high watermark until it reaches want.
func (w *writer) waitEnd(ctx context.Context, want int64) error {
	delay := 2 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for {
		hw, err := w.listOffset(ctx, w.dst, -1)
		if err != nil {
			return err
		}
		switch {
		case hw == want:
			return nil
		case hw > want:
			return w.haltUnwritten(ctx, want, "just after the writer ended its transaction", func(held string) error {
				return w.halt(ErrOffsetMismatch, want-1, "standby end moved to %d, expected %d after a transaction marker%s", hw, want, held)
			})
		case time.Now().After(deadline):
			return fmt.Errorf("transaction marker at %d not in the standby log after a minute", want-1)
		}
		if err := sleep(ctx, delay); err != nil {
			return err
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// fill writes filler records at [from, to), where the source holds no data
// record. One offset: a tombstone under protocol.FillerKey from the plain
// producer. More: to-from-1 filler records in a writer transaction that is
// then aborted, its ABORT marker taking the last offset; read_committed
// readers of the standby never see them, and the standby's cleaner or
// retention removes them.
func (w *writer) fill(ctx context.Context, from, to int64) error {
	if w.next != from {
		return w.halt(ErrOffsetMismatch, from, "filler due at %d, standby is at %d", from, w.next)
	}
	n := to - from
	w.m.metrics.fillers.Add(float64(n))
	if s := w.fillSlot; s != nil {
		// Finish the filler transaction an earlier writer left open in
		// this gap: its records end at from, its ABORT goes at to-1.
		w.fillSlot = nil
		return w.fillAborted(ctx, s, n-1, to-1)
	}
	if n == 1 {
		return w.produceFiller(ctx, 1, nil)
	}
	if err := w.drain(ctx); err != nil {
		return err
	}
	s, err := w.freeSlot(from)
	if err != nil {
		return err
	}
	if err := w.readySlot(ctx, s, from); err != nil {
		return err
	}
	if err := w.m.addPartition(ctx, &s.producer, w.topic, w.partition); err != nil {
		return w.txnErr(err, from)
	}
	s.open, s.srcPID = true, -1
	return w.fillAborted(ctx, s, n-1, to-1)
}

// fillAborted produces n filler records in slot's open transaction, in
// batches of at most fillerChunk, then aborts it with its marker at
// marker.
func (w *writer) fillAborted(ctx context.Context, s *txnSlot, n, marker int64) error {
	for left := n; left > 0; {
		k := int32(min(left, fillerChunk))
		if err := w.produceFiller(ctx, k, s); err != nil {
			return err
		}
		left -= int64(k)
	}
	return w.endTxn(ctx, s, false, marker)
}

func (w *writer) produceFiller(ctx context.Context, n int32, slot *txnSlot) error {
	buf := protocol.AppendFillerBatch(nil, n, 0, 0, 0, slot != nil)
	b := protocol.Batch(buf)
	b.SetBaseOffset(w.next) // produce reads the source offset from here
	return w.produce(ctx, b, slot, "filler")
}

// txnErr turns a fencing error from the transaction coordinator into a
// halt: another writer initialised this writer's transactional ID.
func (w *writer) txnErr(err error, at int64) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return w.halt(ErrFenced, at, "%v", err)
	}
	return err
}
