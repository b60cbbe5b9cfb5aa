// Package verifiable runs Apache Kafka's own verifiable clients —
// org.apache.kafka.tools.VerifiableProducer and VerifiableConsumer, the
// clients Kafka's system tests use to show that no acknowledged record is
// lost — and keeps what they report: every acknowledged record with its
// partition and offset, every range of offsets a consumer read, every
// commit and its outcome.
//
// Both print one JSON object per event on standard output (see their
// sources in apache/kafka, tools/src/main/java/org/apache/kafka/tools).
// The producer writes increasing integers as values ("0", "1", …, or with
// a prefix); the consumer reports what it read as per-partition ranges
// (records_consumed: minOffset..maxOffset, every offset between read on a
// topic without transaction markers or compaction) and commits after each
// batch when auto-commit is off.
package verifiable

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// Ack is one record the producer had acknowledged.
type Ack struct {
	Partition int32
	Offset    int64
	Value     string
	At        time.Time // when the event was read
}

// Range is one batch a consumer read from a partition: every offset from
// Min to Max.
type Range struct {
	Partition int32
	Min, Max  int64
	At        time.Time
	Seq       int // the event's place among the client's events
}

// Commit is one commit a consumer made, and whether it succeeded.
type Commit struct {
	Offsets map[int32]int64
	Success bool
	Error   string
	At      time.Time
	Seq     int // the event's place among the client's events
}

// proc is a running verifiable client and the events it printed.
type proc struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr strings.Builder
	bad    []string // standard output lines that are not events
	events int      // events read so far
	exited chan struct{}
	err    error
}

// start runs main with args through kafkatest.JavaCmd and hands each event
// line of its standard output, decoded, to on (under p.mu), with its place
// among the events (seq, from 1).
func (p *proc) start(ctx context.Context, t testing.TB, main string, args []string, on func(name string, raw []byte, at time.Time, seq int)) {
	t.Helper()
	p.exited = make(chan struct{})
	p.cmd = kafkatest.JavaCmd(ctx, t, main, args...)
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.stderr.Len() < 1<<20 {
			p.stderr.Write(b)
		}
		return len(b), nil
	})
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", p.name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			var ev struct {
				Name string `json:"name"`
			}
			p.mu.Lock()
			if json.Unmarshal(line, &ev) != nil || ev.Name == "" {
				p.bad = append(p.bad, string(line))
			} else {
				p.events++
				on(ev.Name, line, time.Now(), p.events)
			}
			p.mu.Unlock()
		}
		io.Copy(io.Discard, out)
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.exited)
	}()
}

// stop sends SIGTERM (the tools close their client on it and print
// shutdown_complete) and waits for the exit.
func (p *proc) stop(timeout time.Duration) error {
	if p.cmd.Process != nil {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit within %v of SIGTERM", p.name, timeout)
	}
}

// Stderr is what the client printed on standard error (its log), the
// first MiB.
func (p *proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// NotEvents are the standard output lines that were not events.
func (p *proc) NotEvents() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.bad...)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// Producer is a running VerifiableProducer.
type Producer struct {
	proc
	acks   []Ack
	errs   []string
	closed bool // shutdown_complete
}

// ProducerConfig is what a VerifiableProducer is asked to do.
type ProducerConfig struct {
	Bootstrap  string
	Topic      string
	Throughput int // records a second
	Max        int // records in all (-1: until stopped)
	// Properties are producer configs, passed in a --command-config
	// file.
	Properties map[string]string
}

// StartProducer runs a VerifiableProducer with acks=all until it has sent
// cfg.Max records or is stopped.
func StartProducer(ctx context.Context, t testing.TB, cfg ProducerConfig) *Producer {
	t.Helper()
	p := &Producer{proc: proc{name: "VerifiableProducer"}}
	args := []string{"--bootstrap-server", cfg.Bootstrap, "--topic", cfg.Topic, "--acks", "-1",
		"--throughput", strconv.Itoa(cfg.Throughput), "--max-messages", strconv.Itoa(cfg.Max)}
	if path := writeProps(t, "producer.properties", cfg.Properties); path != "" {
		args = append(args, "--command-config", path)
	}
	p.start(ctx, t, "org.apache.kafka.tools.VerifiableProducer", args, func(name string, raw []byte, at time.Time, seq int) {
		switch name {
		case "producer_send_success":
			var e struct {
				Partition int32  `json:"partition"`
				Offset    int64  `json:"offset"`
				Value     string `json:"value"`
			}
			if json.Unmarshal(raw, &e) == nil {
				p.acks = append(p.acks, Ack{Partition: e.Partition, Offset: e.Offset, Value: e.Value, At: at})
			}
		case "producer_send_error":
			p.errs = append(p.errs, string(raw))
		case "shutdown_complete":
			p.closed = true
		}
	})
	return p
}

// Acks is every record acknowledged so far.
func (p *Producer) Acks() []Ack {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Ack(nil), p.acks...)
}

// Acked is how many records were acknowledged so far.
func (p *Producer) Acked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acks)
}

// Errors are the producer_send_error events, as printed.
func (p *Producer) Errors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errs...)
}

// Wait waits for the producer to exit on its own (it sent Max records and
// closed), and reports how it exited.
func (p *Producer) Wait(timeout time.Duration) error {
	select {
	case <-p.exited:
	case <-time.After(timeout):
		return fmt.Errorf("VerifiableProducer still running after %v", timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return fmt.Errorf("VerifiableProducer exited: %w", p.err)
	}
	if !p.closed {
		return fmt.Errorf("VerifiableProducer exited without shutdown_complete")
	}
	return nil
}

// Stop stops the producer.
func (p *Producer) Stop(timeout time.Duration) error { return p.stop(timeout) }

// Consumer is a running VerifiableConsumer.
type Consumer struct {
	proc
	Group   string
	ranges  []Range
	commits []Commit
}

// ConsumerConfig is what a VerifiableConsumer is asked to do.
type ConsumerConfig struct {
	Bootstrap string
	Topic     string
	Group     string
	Protocol  string // "classic" or "consumer" (KIP-848)
}

// StartConsumer runs a VerifiableConsumer in group, from the earliest
// offset where the group has none committed, committing after each batch
// it reads.
func StartConsumer(ctx context.Context, t testing.TB, cfg ConsumerConfig) *Consumer {
	t.Helper()
	c := &Consumer{proc: proc{name: "VerifiableConsumer " + cfg.Group}, Group: cfg.Group}
	args := []string{"--bootstrap-server", cfg.Bootstrap, "--topic", cfg.Topic, "--group-id", cfg.Group,
		"--group-protocol", cfg.Protocol, "--reset-policy", "earliest"}
	c.start(ctx, t, "org.apache.kafka.tools.VerifiableConsumer", args, func(name string, raw []byte, at time.Time, seq int) {
		switch name {
		case "records_consumed":
			var e struct {
				Partitions []struct {
					Partition int32 `json:"partition"`
					Min       int64 `json:"minOffset"`
					Max       int64 `json:"maxOffset"`
				} `json:"partitions"`
			}
			if json.Unmarshal(raw, &e) == nil {
				for _, p := range e.Partitions {
					c.ranges = append(c.ranges, Range{Partition: p.Partition, Min: p.Min, Max: p.Max, At: at, Seq: seq})
				}
			}
		case "offsets_committed":
			var e struct {
				Offsets []struct {
					Partition int32 `json:"partition"`
					Offset    int64 `json:"offset"`
				} `json:"offsets"`
				Success bool   `json:"success"`
				Error   string `json:"error"`
			}
			if json.Unmarshal(raw, &e) == nil {
				cm := Commit{Offsets: map[int32]int64{}, Success: e.Success, Error: e.Error, At: at, Seq: seq}
				for _, o := range e.Offsets {
					cm.Offsets[o.Partition] = o.Offset
				}
				c.commits = append(c.commits, cm)
			}
		}
	})
	return c
}

// Ranges is every batch read so far.
func (c *Consumer) Ranges() []Range {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Range(nil), c.ranges...)
}

// Commits is every commit so far.
func (c *Consumer) Commits() []Commit {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Commit(nil), c.commits...)
}

// Stop stops the consumer (it leaves its group) and waits for it.
func (c *Consumer) Stop(timeout time.Duration) error { return c.stop(timeout) }

// Read is the offsets of each partition read, and how many reads there
// were beyond the first of each offset (records read again).
func Read(ranges []Range) (read map[int32]map[int64]bool, again int) {
	read = map[int32]map[int64]bool{}
	for _, r := range ranges {
		if read[r.Partition] == nil {
			read[r.Partition] = map[int64]bool{}
		}
		for o := r.Min; o <= r.Max; o++ {
			if read[r.Partition][o] {
				again++
			}
			read[r.Partition][o] = true
		}
	}
	return read, again
}

// Unread counts the acknowledged records of acks at offsets ranges never
// read.
func Unread(acks []Ack, ranges []Range) int {
	read, _ := Read(ranges)
	n := 0
	for _, a := range acks {
		if !read[a.Partition][a.Offset] {
			n++
		}
	}
	return n
}

// writeProps writes props as a Java properties file in a temporary
// directory of the test and returns its path, or "" when there are none.
func writeProps(t testing.TB, name string, props map[string]string) string {
	t.Helper()
	if len(props) == 0 {
		return ""
	}
	var b strings.Builder
	for k, v := range props {
		fmt.Fprintf(&b, "%s=%s\n", k, v)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
