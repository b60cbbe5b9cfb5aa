package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// mirrorResult is one copy: the fleet's mirror from the primary to the
// standby of a topic loaded before the members started.
type mirrorResult struct {
	members   int
	bytes     int64
	records   int64
	window    time.Duration // first poll seeing records on the standby → the poll seeing all
	startup   time.Duration // members started → first records on the standby
	total     time.Duration // members started → the poll seeing all
	owners    map[int32]int // partitions each member's writer copied, at the end
	handovers float64       // partitions whose writer moved to another member during the round
}

func (r mirrorResult) mbps() float64 { return float64(r.bytes) / 1e6 / r.window.Seconds() }

func adminClient(addrs []string) (*kadm.Client, *kgo.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl, nil
}

// loadPrimary creates topic on the primary directly and writes n records
// of 1 KiB round-robin over its partitions, franz-go defaults otherwise.
func loadPrimary(ctx context.Context, c *kafkatest.Cluster, topic string, partitions int, n int64) (int64, error) {
	adm, cl, err := adminClient(c.Addrs())
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", topic, err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return 0, err
	}
	defer prod.Close()
	values := benchutil.Values(256, 1024)
	acks := benchutil.NewAcks(false)
	for i := int64(0); i < n && ctx.Err() == nil; i++ {
		prod.Produce(ctx, &kgo.Record{Partition: int32(i % int64(partitions)), Value: values[i%int64(len(values))]}, func(r *kgo.Record, err error) {
			acks.Ack(r, 0, err)
		})
	}
	if err := acks.Flush(ctx, prod); err != nil {
		return 0, err
	}
	return acks.Bytes, nil
}

// createReady creates topic on c and waits until every partition answers
// ListOffsets.
func createReady(ctx context.Context, c *kafkatest.Cluster, topic string, partitions int) error {
	adm, cl, err := adminClient(c.Addrs())
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create %s on %s: %w", topic, c.Bootstrap(), err)
	}
	broker := cl.Broker(int(c.NodeIDs()[0]))
	deadline := time.Now().Add(time.Minute)
	for {
		hw, err := highWatermarks(ctx, broker, topic, partitions)
		if err == nil && len(hw) == partitions {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s on %s: %d of %d partitions answer (%v)", topic, c.Bootstrap(), len(hw), partitions, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// highWatermarks asks broker for the high watermark of every partition of
// topic; a partition that answers with an error counts as 0.
func highWatermarks(ctx context.Context, broker *kgo.Broker, topic string, partitions int) (map[int32]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(partitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, broker)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode == 0 {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out, nil
}

// measureMirror loads a fresh topic into the primary with no member
// running, starts the members ids (all at once, seeded with each other;
// a lone member with no seeds), and times the copy to the standby: from
// the last poll of the standby's high watermarks that saw none of the
// records to the first that saw all of them.
func (b *bench) measureMirror(ctx context.Context, ids []int32, round int) (mirrorResult, error) {
	r := mirrorResult{members: len(ids), owners: map[int32]int{}}
	topic := fmt.Sprintf("fleetbench-mirror-%dm-%d", len(ids), round)
	n := b.o.mirrorBytes / 1024
	step("mirror, %d member(s): loading %d records of 1 KiB into %s on the primary directly (no member running)", len(ids), n, topic)
	bytes, err := loadPrimary(ctx, b.primary, topic, b.o.mirrorPartitions, n)
	if err != nil {
		return r, err
	}
	// The standby's topic is created here, not by the mirror's metadata
	// sync, and its partitions answer before the members start: what is
	// timed is the copy, not a new topic's leaders settling (a writer that
	// finds its partition without a leader backs off).
	if err := createReady(ctx, b.standby, topic, b.o.mirrorPartitions); err != nil {
		return r, err
	}
	r.bytes, r.records = bytes, n
	srcAdm, srcCl, err := adminClient(b.primary.Addrs())
	if err != nil {
		return r, err
	}
	defer srcCl.Close()
	want, err := benchutil.EndOffsets(ctx, srcAdm, topic)
	if err != nil {
		return r, err
	}
	// The standby is read with ListOffsets sent straight to its broker:
	// a client's metadata cache would not know the topic (created by the
	// mirror meanwhile) for up to its metadata min age, 5 s.
	dstCl, err := kgo.NewClient(kgo.SeedBrokers(b.standby.Addrs()...))
	if err != nil {
		return r, err
	}
	defer dstCl.Close()
	broker := dstCl.Broker(int(b.standby.NodeIDs()[0]))

	seeds := []string{}
	if len(ids) > 1 {
		seeds = b.fleet.allSeeds()
	}
	started := time.Now()
	for _, id := range ids {
		if err := b.fleet.start(b.fleet.members[id], seeds); err != nil {
			return r, err
		}
	}
	emptyAt := started
	seen := false
	deadline := started.Add(5 * time.Minute)
	lastLog := time.Now()
	for {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("mirror of %s not complete 5 minutes after the members started", topic)
		}
		for _, id := range ids {
			if m := b.fleet.members[id]; !m.running() {
				return r, fmt.Errorf("member %d exited (log %s)", id, m.log)
			}
		}
		now := time.Now()
		ends, err := highWatermarks(ctx, broker, topic, len(want))
		var have, total int64
		done := err == nil && len(ends) == len(want)
		for p, w := range want {
			have += ends[p]
			total += w
			if ends[p] < w {
				done = false
			}
		}
		if have == 0 {
			emptyAt = now
		} else if !seen {
			seen = true
			r.startup = emptyAt.Sub(started)
		}
		if done {
			r.window = now.Sub(emptyAt)
			r.total = now.Sub(started)
			break
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			step("mirror, %d member(s): %d of %d offsets on the standby", len(ids), have, total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.fleet.waitAlive(ctx, ids...); err != nil {
		return r, err
	}
	st, err := b.fleet.status(ctx, b.fleet.members[ids[0]])
	if err != nil {
		return r, err
	}
	for _, p := range st.Mirror.Partitions {
		if p.Topic == topic {
			r.owners[p.Owner]++
		}
	}
	for _, id := range ids {
		v, err := b.fleet.metric(ctx, b.fleet.members[id], `ferry_mirror_handovers_total{direction="gained"}`)
		if err == nil {
			r.handovers += v
		}
	}
	step("mirror, %d member(s): %.1f MB/s (%s in %v; first records on the standby %v after the start, all %v after; owners %v, writers handed over %v)",
		len(ids), r.mbps(), benchutil.HumanBytes(r.bytes), ms2(r.window), ms2(r.startup), ms2(r.total), r.owners, r.handovers)
	return r, nil
}
