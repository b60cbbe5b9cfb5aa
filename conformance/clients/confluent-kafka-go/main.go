// Command client is the confluent-kafka-go member of Ferry's client
// conformance matrix: Confluent's Go client, with the librdkafka it bundles
// (statically linked, cgo). conformance/clients/install.sh builds it into
// <cache>/clients/confluent-kafka-go-<hash>/client.
//
//	produce --bootstrap B --topic T --count N [--compression C] [--transactional-id X]
//	consume --bootstrap B --topic T --group G --count N [--isolation read_committed]
//	        [--group-protocol classic|consumer]
//	produce-steady --bootstrap B --topic T --count N --duration S
//	stream --bootstrap B --partitions P --rate R [--produce T] [--txn T:ID]
//	       [--consume NAME:T:GROUP:PROTOCOL:ISOLATION]...
//
// Each prints one JSON line per record (see ../README.md); produce-steady
// prints them for acknowledged records only, then a summary line.
// Diagnostics go to stderr. Any failure exits non-zero.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

const (
	consumeTimeout = 60 * time.Second
	drainFor       = 10 * time.Second // how long consume keeps reading past --count to reach the end offsets
	txnBatch       = 25               // records per transaction in transactional produce
	steadyGrace    = 60 * time.Second // how long produce-steady waits for acks after its last send

	txnRecords    = 10 // records per transaction in stream's txn role
	txnAbortEvery = 4  // every 4th transaction is aborted on purpose
	txnPause      = 100 * time.Millisecond
)

type args struct {
	mode, bootstrap, topic, compression, txnID, group, isolation, protocol string
	count, partitions                                                      int
	rate, duration                                                         float64
	produce, txn                                                           string
	consume                                                                []string
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	if len(os.Args) < 2 {
		fail("usage: client produce|consume|produce-steady|stream --bootstrap B ...")
	}
	var a args
	a.mode = os.Args[1]
	if a.mode == "version" { // for install.sh's summary
		_, v := kafka.LibraryVersion()
		fmt.Println("librdkafka", v)
		return
	}
	fs := flag.NewFlagSet("client "+a.mode, flag.ExitOnError)
	fs.StringVar(&a.bootstrap, "bootstrap", "", "")
	fs.StringVar(&a.topic, "topic", "", "")
	fs.IntVar(&a.count, "count", -1, "")
	fs.IntVar(&a.partitions, "partitions", 3, "")
	fs.Float64Var(&a.rate, "rate", 100, "")
	fs.StringVar(&a.produce, "produce", "", "")
	fs.StringVar(&a.txn, "txn", "", "")
	fs.Var((*multi)(&a.consume), "consume", "")
	fs.StringVar(&a.compression, "compression", "none", "")
	fs.StringVar(&a.txnID, "transactional-id", "", "")
	fs.Float64Var(&a.duration, "duration", 0, "")
	fs.StringVar(&a.group, "group", "", "")
	fs.StringVar(&a.isolation, "isolation", "read_uncommitted", "")
	fs.StringVar(&a.protocol, "group-protocol", "classic", "")
	fs.Parse(os.Args[2:])
	if a.bootstrap == "" {
		fail("--bootstrap is required")
	}
	switch a.mode {
	case "stream":
		stream(a)
		return
	case "produce", "produce-steady", "consume":
	default:
		fail("unknown mode %q", a.mode)
	}
	if a.topic == "" || a.count < 0 {
		fail("%s needs --topic and --count", a.mode)
	}
	switch a.mode {
	case "produce":
		produce(a)
	case "produce-steady":
		produceSteady(a)
	case "consume":
		if a.group == "" {
			fail("consume needs --group")
		}
		consume(a)
	}
}

func fail(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "client: "+format+"\n", v...)
	os.Exit(1)
}

// config is the settings given plus the client-side security the tests
// pass in the environment (clients/README.md, "Security"): none when
// CONFORMANCE_SECURITY_PROTOCOL is unset.
func config(a args, kv ...any) *kafka.ConfigMap {
	cm := &kafka.ConfigMap{"bootstrap.servers": a.bootstrap}
	if proto := os.Getenv("CONFORMANCE_SECURITY_PROTOCOL"); proto != "" {
		(*cm)["security.protocol"] = proto
		if ca := os.Getenv("CONFORMANCE_SSL_CA_FILE"); ca != "" {
			(*cm)["ssl.ca.location"] = ca
		}
		if mech := os.Getenv("CONFORMANCE_SASL_MECHANISM"); mech != "" {
			(*cm)["sasl.mechanism"] = mech
			(*cm)["sasl.username"] = os.Getenv("CONFORMANCE_SASL_USERNAME")
			(*cm)["sasl.password"] = os.Getenv("CONFORMANCE_SASL_PASSWORD")
		}
	}
	if d := os.Getenv("LIBRDKAFKA_DEBUG"); d != "" {
		(*cm)["debug"] = d
	}
	for i := 0; i+1 < len(kv); i += 2 {
		(*cm)[kv[i].(string)] = kv[i+1]
	}
	return cm
}

func runID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type recordLine struct {
	Partition int32             `json:"partition"`
	Offset    int64             `json:"offset"`
	Key       *string           `json:"key"`
	Value     *string           `json:"value"`
	Headers   map[string]string `json:"headers"`
	Timestamp int64             `json:"timestamp"`
	Aborted   bool              `json:"aborted,omitempty"`
}

func str(s string) *string { return &s }

func bytesStr(b []byte) *string {
	if b == nil {
		return nil
	}
	return str(string(b))
}

// logEvents drains a client's event channel of what is not a delivery
// report, to stderr; fatal is called for a fatal error.
func logEvents(ch chan kafka.Event, name string, fatal func(kafka.Error)) {
	for e := range ch {
		switch e := e.(type) {
		case kafka.Error:
			fmt.Fprintf(os.Stderr, "client: %s: librdkafka error: %v\n", name, e)
			if e.IsFatal() && fatal != nil {
				fatal(e)
			}
		default:
			fmt.Fprintf(os.Stderr, "client: %s: event %v\n", name, e)
		}
	}
}

func newProducer(a args, kv ...any) *kafka.Producer {
	p, err := kafka.NewProducer(config(a, kv...))
	if err != nil {
		fail("new producer: %v", err)
	}
	return p
}

// send produces msg, waiting while the local queue is full.
func send(p *kafka.Producer, msg *kafka.Message, dr chan kafka.Event) error {
	for {
		err := p.Produce(msg, dr)
		var ke kafka.Error
		if errors.As(err, &ke) && ke.Code() == kafka.ErrQueueFull {
			p.Flush(50)
			continue
		}
		return err
	}
}

func produce(a args) {
	kv := []any{"enable.idempotence", true, "acks", "all", "compression.type", a.compression,
		"linger.ms", 5, "batch.size", 4096, "delivery.timeout.ms", 60000}
	if a.txnID != "" {
		kv = append(kv, "transactional.id", a.txnID)
	}
	p := newProducer(a, kv...)
	go logEvents(p.Events(), "produce", nil)
	run := runID()
	base := time.Now().UnixMilli() - int64(a.count) // explicit, distinct, in the past
	results := make([]*recordLine, a.count)
	aborted := make([]bool, a.count)
	dr := make(chan kafka.Event, a.count+1)
	var failures []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; n < a.count; n++ {
			m := (<-dr).(*kafka.Message)
			i := m.Opaque.(int)
			if m.TopicPartition.Error != nil {
				failures = append(failures, fmt.Sprintf("record %d: %v", i, m.TopicPartition.Error))
				continue
			}
			results[i] = &recordLine{Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset),
				Key: str(fmt.Sprintf("k-%d", i)), Value: str(fmt.Sprintf("v-%d-%s", i, run)),
				Headers: map[string]string{"h": strconv.Itoa(i)}, Timestamp: base + int64(i), Aborted: aborted[i]}
		}
	}()
	topic := a.topic
	msg := func(i int) *kafka.Message {
		return &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key: []byte(fmt.Sprintf("k-%d", i)), Value: []byte(fmt.Sprintf("v-%d-%s", i, run)),
			Headers:   []kafka.Header{{Key: "h", Value: []byte(strconv.Itoa(i))}},
			Timestamp: time.UnixMilli(base + int64(i)), Opaque: i}
	}
	ctx := context.Background()
	must := func(what string, err error) {
		if err != nil {
			fail("produce: %s: %v", what, err)
		}
	}
	if a.txnID != "" {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		must("init transactions", p.InitTransactions(tctx))
		cancel()
		for n, start := 0, 0; start < a.count; n, start = n+1, start+txnBatch {
			// Odd-numbered transactions are aborted: half committed, a marked set aborted.
			abort := n%2 == 1
			must("begin transaction", p.BeginTransaction())
			for i := start; i < min(a.count, start+txnBatch); i++ {
				aborted[i] = abort
				must("produce", send(p, msg(i), dr))
			}
			p.Flush(60000) // offsets are needed even for aborted records
			tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if abort {
				must("abort", p.AbortTransaction(tctx))
			} else {
				must("commit", p.CommitTransaction(tctx))
			}
			cancel()
		}
	} else {
		for i := range a.count {
			must("produce", send(p, msg(i), dr))
		}
	}
	left := p.Flush(60000)
	if left > 0 {
		fail("produce: %d undelivered after 60 s", left)
	}
	wg.Wait()
	if len(failures) > 0 {
		fail("produce: %d failed: %v", len(failures), failures[:min(5, len(failures))])
	}
	w := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(w)
	for _, r := range results {
		enc.Encode(r)
	}
	w.Flush()
	p.Close()
}

// produceSteady produces --count records spread evenly over --duration
// seconds with an idempotent acks=all producer at librdkafka's default
// retries and delivery timeout, as an application would have it. A failed
// record is counted, never fatal.
func produceSteady(a args) {
	p := newProducer(a, "enable.idempotence", true, "acks", "all")
	go logEvents(p.Events(), "produce-steady", nil)
	run := runID()
	base := time.Now().UnixMilli() - int64(a.count)
	results := make([]*recordLine, a.count)
	var mu sync.Mutex
	firstError := ""
	failed := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		if firstError == "" {
			firstError = s
		}
	}
	dr := make(chan kafka.Event, a.count+1)
	var reports reportCount
	go func() {
		for e := range dr {
			m := e.(*kafka.Message)
			i := m.Opaque.(int)
			reports.add(1)
			if m.TopicPartition.Error != nil {
				failed(m.TopicPartition.Error.Error())
				continue
			}
			mu.Lock()
			results[i] = &recordLine{Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset),
				Key: str(fmt.Sprintf("k-%d", i)), Value: str(fmt.Sprintf("v-%d-%s", i, run)),
				Headers: map[string]string{"h": strconv.Itoa(i)}, Timestamp: base + int64(i)}
			mu.Unlock()
		}
	}()
	topic := a.topic
	start := time.Now()
	for i := range a.count {
		due := start.Add(time.Duration(a.duration * float64(time.Second) * float64(i) / float64(a.count)))
		time.Sleep(time.Until(due))
		err := send(p, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key: []byte(fmt.Sprintf("k-%d", i)), Value: []byte(fmt.Sprintf("v-%d-%s", i, run)),
			Headers:   []kafka.Header{{Key: "h", Value: []byte(strconv.Itoa(i))}},
			Timestamp: time.UnixMilli(base + int64(i)), Opaque: i}, dr)
		if err != nil {
			failed(err.Error())
		} else {
			reports.sent(1)
		}
	}
	if p.Flush(int(steadyGrace.Milliseconds())) > 0 {
		failed(fmt.Sprintf("unacknowledged %.0f s after the last send", steadyGrace.Seconds()))
	} else {
		reports.wait(5 * time.Second)
	}
	mu.Lock()
	w := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(w)
	acked := 0
	for _, r := range results {
		if r != nil {
			enc.Encode(r)
			acked++
		}
	}
	enc.Encode(map[string]any{"acked": acked, "failed": a.count - acked, "first_error": firstError})
	w.Flush()
	os.Exit(0) // do not let exit wait for what is left
}

func newConsumer(a args, group, isolation, protocol string) *kafka.Consumer {
	kv := []any{"group.id", group, "auto.offset.reset", "earliest", "enable.auto.commit", false,
		"isolation.level", isolation}
	if protocol != "classic" {
		kv = append(kv, "group.protocol", protocol)
	}
	c, err := kafka.NewConsumer(config(a, kv...))
	if err != nil {
		fail("new consumer: %v", err)
	}
	return c
}

func consume(a args) {
	c := newConsumer(a, a.group, a.isolation, a.protocol)
	if err := c.SubscribeTopics([]string{a.topic}, nil); err != nil {
		fail("subscribe: %v", err)
	}
	var out []recordLine
	deadline := time.Now().Add(consumeTimeout)
	poll := func() {
		switch e := c.Poll(200).(type) {
		case *kafka.Message:
			if e.TopicPartition.Error != nil {
				fail("consume: %v", e.TopicPartition.Error)
			}
			h := map[string]string{}
			for _, x := range e.Headers {
				h[x.Key] = string(x.Value)
			}
			out = append(out, recordLine{Partition: e.TopicPartition.Partition, Offset: int64(e.TopicPartition.Offset),
				Key: bytesStr(e.Key), Value: bytesStr(e.Value), Headers: h, Timestamp: e.Timestamp.UnixMilli()})
		case kafka.Error:
			fmt.Fprintf(os.Stderr, "client: consume: librdkafka error: %v\n", e)
			if e.IsFatal() {
				fail("consume: %v", e)
			}
		}
	}
	for len(out) < a.count && time.Now().Before(deadline) {
		poll()
	}
	// Drain to the end offsets (last stable offsets under read_committed),
	// so extra records show up and committed positions step over trailing
	// aborted records and transaction markers.
	positions := func() []kafka.TopicPartition {
		as, err := c.Assignment()
		if err != nil {
			fail("assignment: %v", err)
		}
		ps, err := c.Position(as)
		if err != nil {
			fail("position: %v", err)
		}
		return ps
	}
	caughtUp := func() bool {
		for _, tp := range positions() {
			_, high, err := c.QueryWatermarkOffsets(*tp.Topic, tp.Partition, 10000)
			if err != nil || int64(tp.Offset) < high {
				return false
			}
		}
		return true
	}
	drainUntil := time.Now().Add(drainFor)
	if deadline.Before(drainUntil) {
		drainUntil = deadline
	}
	for time.Now().Before(drainUntil) && !caughtUp() {
		poll()
	}
	if len(out) < a.count {
		fmt.Fprintf(os.Stderr, "consume: timed out with %d of %d records\n", len(out), a.count)
	}
	// Commit every assigned partition's position (the next offset to read).
	var commit []kafka.TopicPartition
	for _, tp := range positions() {
		if tp.Offset >= 0 {
			commit = append(commit, tp)
		}
	}
	if len(commit) > 0 {
		if _, err := c.CommitOffsets(commit); err != nil {
			fail("commit: %v", err)
		}
	}
	c.Close()
	w := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(w)
	for _, r := range out {
		enc.Encode(r)
	}
	w.Flush()
}

// reportCount counts the records sent and their delivery reports read, so
// that a producer can wait for the reports of what it flushed: they reach
// their channel through the client's poller, possibly after Flush returns.
type reportCount struct {
	mu            sync.Mutex
	nsent, nreads int
}

func (r *reportCount) sent(n int) { r.mu.Lock(); r.nsent += n; r.mu.Unlock() }
func (r *reportCount) add(n int)  { r.mu.Lock(); r.nreads += n; r.mu.Unlock() }

// wait waits until every record sent has had its report read, or timeout.
func (r *reportCount) wait(timeout time.Duration) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		done := r.nreads >= r.nsent
		r.mu.Unlock()
		if done {
			return
		}
	}
}

// ---- stream ----

var outMu sync.Mutex

func emit(m map[string]any) {
	b, _ := json.Marshal(m)
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

func ev(role, kind string, kv ...any) map[string]any {
	m := map[string]any{"role": role, "ev": kind}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// emitError prints an error; code is librdkafka's error text for the code
// (rd_kafka_err2str: confluent-kafka-go does not expose err2name).
func emitError(role string, err error, fatal bool) {
	var ke kafka.Error
	if errors.As(err, &ke) {
		emit(ev(role, "error", "code", ke.Code().String(), "error", ke.Error(), "fatal", fatal || ke.IsFatal(),
			"retriable", ke.IsRetriable(), "txn_requires_abort", ke.TxnRequiresAbort()))
		return
	}
	emit(ev(role, "error", "code", fmt.Sprintf("%T", err), "error", err.Error(), "fatal", fatal))
}

// produceRole: an idempotent producer at librdkafka's defaults, --rate
// records a second round robin over the partitions.
func produceRole(a args, topic string, stop <-chan struct{}) error {
	const role = "produce"
	p := newProducer(a, "enable.idempotence", true, "acks", "all")
	defer p.Close()
	dr := make(chan kafka.Event, 100000)
	go logEvents(p.Events(), role, func(e kafka.Error) { emitError(role, e, true) })
	var reports reportCount
	go func() {
		for e := range dr {
			m := e.(*kafka.Message)
			reports.add(1)
			if m.TopicPartition.Error != nil {
				emitError(role, m.TopicPartition.Error, false)
				continue
			}
			emit(ev(role, "ack", "partition", m.TopicPartition.Partition, "offset", int64(m.TopicPartition.Offset),
				"value", string(m.Value)))
		}
	}()
	run := runID()
	seq := make([]int, a.partitions)
	start := time.Now()
	for i := 0; ; {
		select {
		case <-stop:
			left := p.Flush(int(steadyGrace.Milliseconds()))
			if left > 0 {
				emit(ev(role, "error", "code", "TIMEOUT", "fatal", false,
					"error", fmt.Sprintf("%d records unacknowledged %.0f s after the last send", left, steadyGrace.Seconds())))
				p.Purge(kafka.PurgeQueue | kafka.PurgeInFlight)
			}
			reports.wait(5 * time.Second) // every report read is printed before done
			return nil
		default:
		}
		due := start.Add(time.Duration(float64(i) / a.rate * float64(time.Second)))
		if wait := time.Until(due); wait > 0 {
			time.Sleep(min(wait, 50*time.Millisecond))
			continue
		}
		part := i % a.partitions
		v := fmt.Sprintf("p%d-%06d-%s", part, seq[part]+1, run)
		err := send(p, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: int32(part)},
			Value: []byte(v)}, dr)
		if err != nil {
			emitError(role, err, false)
		} else {
			reports.sent(1)
		}
		seq[part]++
		i++
	}
}

// txnRole: a transactional producer, transactions of txnRecords records,
// every txnAbortEvery-th aborted on purpose. On an error it aborts and
// carries on with a new transaction; a fatal error ends the role.
func txnRole(a args, spec string, stop <-chan struct{}) error {
	const role = "txn"
	topic, id, _ := strings.Cut(spec, ":")
	p := newProducer(a, "transactional.id", id, "enable.idempotence", true, "acks", "all")
	defer p.Close()
	go logEvents(p.Events(), role, func(e kafka.Error) { emitError(role, e, true) })
	run := runID()
	seq := make([]int, a.partitions)
	ctx := context.Background()
	call := func(f func(context.Context) error) error {
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		return f(c)
	}
	if err := call(p.InitTransactions); err != nil {
		return err
	}
	// A retriable error of a transactional call means: call it again.
	retrying := func(f func(context.Context) error) error {
		for attempt := 0; ; attempt++ {
			err := call(f)
			var ke kafka.Error
			if err == nil || !errors.As(err, &ke) || !ke.IsRetriable() || attempt == 9 {
				return err
			}
			emit(ev(role, "retry", "code", ke.Code().String(), "error", ke.Error()))
			time.Sleep(100 * time.Millisecond)
		}
	}
	k := 0
	for n := 1; ; n++ {
		select {
		case <-stop:
			p.Flush(10000)
			return nil
		default:
		}
		abort := n%txnAbortEvery == 0
		dr := make(chan kafka.Event, txnRecords)
		var acked []map[string]any
		sent := 0
		// collect reads the delivery reports of what was sent: after a
		// Flush they are on their way to dr, if not there yet.
		collect := func() {
			for ; sent > 0; sent-- {
				select {
				case e := <-dr:
					if m := e.(*kafka.Message); m.TopicPartition.Error == nil {
						acked = append(acked, ev(role, "ack", "partition", m.TopicPartition.Partition,
							"offset", int64(m.TopicPartition.Offset), "value", string(m.Value), "txn", n))
					}
				case <-time.After(5 * time.Second):
					sent = 0
					return
				}
			}
		}
		err := p.BeginTransaction()
		for i := 0; err == nil && i < txnRecords; i++ {
			part := k % a.partitions
			k++
			seq[part]++
			v := fmt.Sprintf("p%d-%06d-t%d-%s", part, seq[part], n, run)
			err = send(p, &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: int32(part)},
				Value: []byte(v)}, dr)
			if err == nil {
				sent++
			}
		}
		if err == nil {
			p.Flush(60000)
			collect()
			for _, m := range acked {
				emit(m)
			}
			acked = nil
			if abort {
				if err = retrying(p.AbortTransaction); err == nil {
					emit(ev(role, "end", "txn", n, "outcome", "aborted"))
				}
			} else if err = retrying(p.CommitTransaction); err == nil {
				emit(ev(role, "end", "txn", n, "outcome", "committed"))
			}
		}
		if err != nil {
			emitError(role, err, false)
			collect()
			for _, m := range acked {
				emit(m)
			}
			var ke kafka.Error
			if errors.As(err, &ke) && ke.IsFatal() {
				return nil
			}
			if err := retrying(p.AbortTransaction); err != nil {
				emitError(role, err, true)
				return nil
			}
			emit(ev(role, "end", "txn", n, "outcome", "aborted", "after_error", true))
		}
		time.Sleep(txnPause)
	}
}

// consumeRole: a consumer group member that commits its positions after
// every poll that returned records.
func consumeRole(a args, spec string, stop <-chan struct{}) error {
	f := strings.Split(spec, ":")
	role, topic, group, protocol, isolation := f[0], f[1], f[2], f[3], f[4]
	c := newConsumer(a, group, isolation, protocol)
	if err := c.SubscribeTopics([]string{topic}, nil); err != nil {
		return err
	}
	commit := func() {
		done, err := c.Commit()
		if err != nil {
			var ke kafka.Error
			if !errors.As(err, &ke) || ke.Code() != kafka.ErrNoOffset {
				emitError(role, err, false)
			}
			return
		}
		offsets := map[string]int64{}
		for _, tp := range done {
			if tp.Error == nil && tp.Offset >= 0 {
				offsets[strconv.Itoa(int(tp.Partition))] = int64(tp.Offset)
			}
		}
		if len(offsets) > 0 {
			emit(ev(role, "committed", "offsets", offsets))
		}
	}
	handle := func(e kafka.Event) bool {
		switch e := e.(type) {
		case *kafka.Message:
			if e.TopicPartition.Error != nil {
				emitError(role, e.TopicPartition.Error, false)
				return false
			}
			emit(ev(role, "rec", "partition", e.TopicPartition.Partition, "offset", int64(e.TopicPartition.Offset),
				"value", string(e.Value)))
			return true
		case kafka.Error:
			fmt.Fprintf(os.Stderr, "client: %s: librdkafka error: %v\n", role, e)
			if e.IsFatal() {
				emitError(role, e, true)
			}
		}
		return false
	}
	for {
		select {
		case <-stop:
			commit()
			return c.Close()
		default:
		}
		// One poll: up to 500 records, the first waited for up to 200 ms.
		got := handle(c.Poll(200))
		for n := 0; got && n < 500; n++ {
			e := c.Poll(0)
			if e == nil {
				break
			}
			handle(e)
		}
		if got {
			commit()
		}
	}
}

// stream runs the roles asked for, each on its own goroutine, until
// stopped: a stdin line "stop ROLE" stops one, the end of stdin every one
// left. Each prints one JSON line per event (see ../README.md).
func stream(a args) {
	type role struct {
		name, spec string
		run        func(args, string, <-chan struct{}) error
	}
	var roles []role
	if a.produce != "" {
		roles = append(roles, role{"produce", a.produce, produceRole})
	}
	if a.txn != "" {
		roles = append(roles, role{"txn", a.txn, txnRole})
	}
	for _, spec := range a.consume {
		f := strings.Split(spec, ":")
		if len(f) != 5 {
			fail("--consume NAME:TOPIC:GROUP:PROTOCOL:ISOLATION, got %s", spec)
		}
		roles = append(roles, role{f[0], spec, consumeRole})
	}
	stops := map[string]chan struct{}{}
	for _, r := range roles {
		stops[r.name] = make(chan struct{})
	}
	var once sync.Map
	stopRole := func(name string) {
		if ch, ok := stops[name]; ok {
			if _, done := once.LoadOrStore(name, true); !done {
				close(ch)
			}
		}
	}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if w := strings.Fields(sc.Text()); len(w) == 2 && w[0] == "stop" {
				stopRole(w[1])
			}
		}
		for name := range stops {
			stopRole(name)
		}
	}()
	var wg sync.WaitGroup
	for _, r := range roles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.run(a, r.spec, stops[r.name]); err != nil {
				emitError(r.name, err, true)
			}
			emit(ev(r.name, "done"))
		}()
	}
	wg.Wait()
	os.Exit(0)
}
