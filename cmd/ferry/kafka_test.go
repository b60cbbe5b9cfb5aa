package main

// `ferry serve` in front of two real Apache Kafka clusters with the mirror
// enabled (skipped under -short).

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// recordLine is a record as the comparisons see it: where it is and
// everything a consumer reads.
func recordLine(r *kgo.Record) string {
	var h strings.Builder
	for _, rh := range r.Headers {
		fmt.Fprintf(&h, "%s:%s;", rh.Key, rh.Value)
	}
	return fmt.Sprintf("%d/%06d %s=%s h=%s ts=%d", r.Partition, r.Offset, r.Key, r.Value, h.String(), r.Timestamp.UnixMilli())
}

// readN reads n records of topic directly from a cluster at the given
// isolation level, and returns them sorted by partition and offset.
func readN(t *testing.T, addrs []string, topic string, n int, iso kgo.IsolationLevel) []string {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(iso))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []string
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s from %v", len(out), n, topic, addrs)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Logf("fetch %s[%d] from %v: %v", topic, p, addrs, err) })
		fs.EachRecord(func(r *kgo.Record) { out = append(out, recordLine(r)) })
	}
	slices.Sort(out)
	return out
}

// endOffsets lists a topic's end offsets directly on a cluster.
func endOffsets(t *testing.T, addrs []string, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addrs...))).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("end offsets of %s on %v: %v", topic, addrs, err)
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// settledEndOffsets are endOffsets once no transaction is open on the
// topic: EndTxn is answered before the coordinator has written the
// markers, so an end offset read just after it may lack the marker. Open
// transactions hold the last stable offset (read_committed) below the end.
func settledEndOffsets(t *testing.T, addrs []string, topic string) map[int32]int64 {
	t.Helper()
	adm := kadm.NewClient(newClient(t, kgo.SeedBrokers(addrs...)))
	var ends map[int32]int64
	testwait.Eventually(t, 30*time.Second, topic+"'s transactions settled", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ends = endOffsets(t, addrs, topic)
		stable, err := adm.ListCommittedOffsets(ctx, topic)
		if err == nil {
			err = stable.Error()
		}
		if err != nil {
			return err
		}
		var open []string
		stable.Each(func(o kadm.ListedOffset) {
			if o.Offset != ends[o.Partition] {
				open = append(open, fmt.Sprintf("%d: stable %d, end %d", o.Partition, o.Offset, ends[o.Partition]))
			}
		})
		if len(open) > 0 {
			return fmt.Errorf("open: %v", open)
		}
		return nil
	})
	return ends
}

// TestServeMirrorRealKafka: `ferry serve` with two 1-node Apache Kafka
// clusters and the mirror enabled. Records produced through Ferry (plain,
// and in committed and aborted transactions) are on the standby at the
// same offsets, read directly, at both isolation levels; the end offsets
// are equal; /status reports every partition caught up with lag 0.
func TestServeMirrorRealKafka(t *testing.T) {
	primary := kafkatest.Start(t, 1, kafkatest.WithName("primary"))
	standby := kafkatest.Start(t, 1, kafkatest.WithName("standby"))
	path := writeConfig(t, fmt.Sprintf(`
cluster_id: ferry-mirror-test
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - name: primary
    bootstrap: [%s]
  - name: standby
    bootstrap: [%s]
mirror:
  sync_interval: 1s
`, primary.Bootstrap(), standby.Bootstrap()))
	p := startFerry(t, "serve", "--config", path)
	adminAddr := p.waitFor(t, adminLog, 30*time.Second)[1]
	addr := p.waitFor(t, regexp.MustCompile(`"msg":"serving Kafka clients".*"bootstrap":"([^"]+)"`), 90*time.Second)[1]
	p.waitFor(t, regexp.MustCompile(`"msg":"mirror started".*"from":"primary","to":"standby"`), 10*time.Second)

	const topic, partitions = "orders", 3
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(addr))).CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create %s through Ferry: %v", topic, err)
	}

	// Through Ferry: plain records from an idempotent producer, then a
	// committed and an aborted transaction.
	var committed []string
	prod := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))
	var rs []*kgo.Record
	for i := range 300 {
		rs = append(rs, &kgo.Record{
			Key:       []byte(fmt.Sprintf("k%03d", i)),
			Value:     []byte(fmt.Sprintf("plain %d %s", i, strings.Repeat("x", i%50))),
			Headers:   []kgo.RecordHeader{{Key: "i", Value: []byte(fmt.Sprint(i))}},
			Timestamp: time.UnixMilli(1_700_000_000_000 + int64(i)),
		})
	}
	if err := prod.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce through Ferry: %v", err)
	}
	for _, r := range rs {
		committed = append(committed, recordLine(r))
	}
	txn := newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.TransactionalID("mirror-e2e"))
	aborted := 0
	for _, commit := range []bool{true, false} {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		var trs []*kgo.Record
		for i := range 20 {
			trs = append(trs, &kgo.Record{Key: []byte(fmt.Sprintf("t%d-%02d", map[bool]int{true: 1, false: 0}[commit], i)),
				Value: []byte(fmt.Sprintf("txn commit=%v %d", commit, i)), Timestamp: time.UnixMilli(1_700_000_100_000 + int64(i))})
		}
		if err := txn.ProduceSync(ctx, trs...).FirstErr(); err != nil {
			t.Fatalf("transactional produce through Ferry: %v", err)
		}
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatalf("end transaction (commit %v) through Ferry: %v", commit, err)
		}
		if commit {
			for _, r := range trs {
				committed = append(committed, recordLine(r))
			}
		} else {
			aborted += len(trs)
		}
	}
	slices.Sort(committed)

	// /status: every partition caught up, lag 0, at the primary's end.
	ends := settledEndOffsets(t, primary.Addrs(), topic)
	ms := waitMirrorCaughtUp(t, adminAddr, topic, ends)
	if !ms.Enabled || !ms.Running || ms.Source != "primary" || ms.Target != "standby" || ms.Summary.Halted != 0 || ms.Summary.CaughtUp != partitions {
		t.Fatalf("mirror section %+v", ms)
	}
	if got := endOffsets(t, standby.Addrs(), topic); fmt.Sprint(got) != fmt.Sprint(ends) {
		t.Fatalf("standby end offsets %v, primary's %v", got, ends)
	}

	// Read directly: the standby holds what the primary holds, at the same
	// offsets, and read_committed sees exactly the committed records.
	for _, iso := range []struct {
		name  string
		level kgo.IsolationLevel
		n     int
	}{
		{"read_committed", kgo.ReadCommitted(), len(committed)},
		{"read_uncommitted", kgo.ReadUncommitted(), len(committed) + aborted},
	} {
		onPrimary := readN(t, primary.Addrs(), topic, iso.n, iso.level)
		onStandby := readN(t, standby.Addrs(), topic, iso.n, iso.level)
		if !slices.Equal(onStandby, onPrimary) {
			t.Fatalf("%s: standby and primary differ:\nstandby %q\nprimary %q", iso.name, onStandby, onPrimary)
		}
		if iso.level == kgo.ReadCommitted() && !slices.Equal(onStandby, committed) {
			t.Fatalf("read_committed on the standby:\n%q\nwant what was acknowledged through Ferry:\n%q", onStandby, committed)
		}
	}

	p.stop(t, 30*time.Second)
	p.waitFor(t, regexp.MustCompile(`"msg":"mirror stopped"`), time.Second)
}
