package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/admin"
	"github.com/ferry-gw/ferry/conformance/benchutil"
)

// catchUpValueSize is the record value size of the backlog (the
// benchmarks' usual 1 KiB of JSON-like text, lz4-compressed in batches).
const catchUpValueSize = 1024

// measureCatchUp times the mirror's copy of a backlog at this shape, with
// traffic on a tenth of the partitions: the writers of partition 0 of
// every idle topic are halted (POST /mirror/halt), -catchup-bytes of
// records written to those partitions on the active cluster directly,
// and the writers restarted (POST /mirror/restart). MB/s is the backlog's
// value bytes over the time from the restart to the standby holding every
// offset the active cluster holds there, both read directly. The restart
// is part of it: each writer takes its partition over (a producer ID, the
// checks of its ownership and slots), checks the standby's tail and
// starts its session, as after a member's restart or a switch; the copy
// alone is timed too, from the
// first byte of the backlog seen on the standby.
func (b *bench) measureCatchUp(ctx context.Context, r *shapeResult) error {
	var tps []admin.TopicPartition
	var topics []string
	for i := range r.topicsNow {
		topics = append(topics, scaleTopic(i))
		tps = append(tps, admin.TopicPartition{Topic: scaleTopic(i), Partition: 0})
	}
	var halted admin.MirrorHaltResult
	if err := b.post(ctx, "/mirror/halt", admin.MirrorHaltRequest{Partitions: tps}, &halted); err != nil {
		return err
	}
	if len(halted.Halted) != len(tps) {
		return fmt.Errorf("halted %d of %d partitions (refused %d)", len(halted.Halted), len(tps), len(halted.Refused))
	}

	src, err := kgo.NewClient(kgo.SeedBrokers(b.clusters[b.active].Addrs()...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(10*time.Millisecond),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedRecords(64<<10))
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := kgo.NewClient(kgo.SeedBrokers(b.clusters[b.other()].Addrs()...))
	if err != nil {
		return err
	}
	defer dst.Close()

	values := benchutil.Values(4096, catchUpValueSize)
	perPart := int(b.o.catchUpBytes/catchUpValueSize) / len(topics)
	var sent int64
	var failed atomic.Pointer[error]
	w0 := time.Now()
	for i, t := range topics {
		for j := range perPart {
			v := values[(i*perPart+j)%len(values)]
			src.Produce(ctx, &kgo.Record{Topic: t, Partition: 0, Value: v}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			})
			sent += int64(len(v))
		}
	}
	if err := src.Flush(ctx); err != nil {
		return err
	}
	if err := failed.Load(); err != nil {
		return fmt.Errorf("writing the backlog: %w", *err)
	}
	// The same bytes written by a client straight to the source: what the
	// brokers take at this many partitions, beside the mirror's copy.
	r.catchUpDirect = append(r.catchUpDirect, float64(sent)/1e6/time.Since(w0).Seconds())
	want, err := partitionZeroEnds(ctx, src, topics)
	if err != nil {
		return err
	}

	base, err := partitionZeroEnds(ctx, dst, topics)
	if err != nil {
		return err
	}

	before, err := b.readCost()
	if err != nil {
		return err
	}
	var profiled chan error
	if b.o.profileDir != "" {
		// A CPU profile of the member from the restart, over about as
		// long as the copy takes at the largest shape here.
		profiled = make(chan error, 1)
		name := fmt.Sprintf("cpu-catchup-%v-%d.pb.gz", r.shape, len(r.catchUp)+1)
		go func() { profiled <- b.profile(ctx, "profile?seconds=4", name) }()
	}
	t0 := time.Now()
	var first time.Time // the first poll that saw a byte of the backlog on the standby
	var restarted admin.MirrorRestartResult
	if err := b.post(ctx, "/mirror/restart", admin.MirrorRestartRequest{Partitions: tps}, &restarted); err != nil {
		return err
	}
	if len(restarted.Restarted) != len(tps) {
		return fmt.Errorf("restarted %d of %d partitions", len(restarted.Restarted), len(tps))
	}
	for deadline := t0.Add(10 * time.Minute); ; {
		have, err := partitionZeroEnds(ctx, dst, topics)
		behind := 0
		for t, o := range want {
			if have[t] < o {
				behind++
			}
			if first.IsZero() && have[t] > base[t] {
				first = time.Now()
			}
		}
		if err == nil && behind == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("backlog not mirrored after %v: %d of %d partitions behind (%v)", time.Since(t0).Round(time.Second), behind, len(want), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	done := time.Now()
	took := done.Sub(t0)
	after, err := b.readCost()
	if err != nil {
		return err
	}
	if profiled != nil {
		if err := <-profiled; err != nil {
			return err
		}
	}
	p50, n := histQuantile(before.starts, after.starts, 0.5)
	last, _ := histQuantile(before.starts, after.starts, 1)
	r.catchUpStarts = append(r.catchUpStarts, [2]float64{p50, last})
	r.catchUpCPU = append(r.catchUpCPU, (after.member-before.member).Seconds()/took.Seconds())
	r.catchUpBusy = append(r.catchUpBusy, (after.busy-before.busy).Seconds()/(after.all-before.all).Seconds())
	r.catchUp = append(r.catchUp, float64(sent)/1e6/took.Seconds())
	r.catchUpFirst = append(r.catchUpFirst, first.Sub(t0))
	r.catchUpCopy = append(r.catchUpCopy, float64(sent)/1e6/done.Sub(first).Seconds())
	step("shape %v: a backlog of %s on %d partitions mirrored in %v: %.1f MB/s; its first byte on the standby after %v, %.1f MB/s from there; written directly at %.1f MB/s; the member used %.2f cores, the machine was %.0f %% busy; %.0f writer starts, half within %gs, all within %gs",
		r.shape, benchutil.HumanBytes(sent), len(topics), took.Round(time.Millisecond), r.catchUp[len(r.catchUp)-1],
		first.Sub(t0).Round(time.Millisecond), r.catchUpCopy[len(r.catchUpCopy)-1], r.catchUpDirect[len(r.catchUpDirect)-1],
		r.catchUpCPU[len(r.catchUpCPU)-1], 100*r.catchUpBusy[len(r.catchUpBusy)-1], n, p50, last)
	return nil
}

// cost is what the catch-up reads before and after the copy: the member's
// CPU, the machine's busy and total CPU time, and the writers' start
// times (cumulative buckets of ferry_mirror_writer_start_seconds).
type cost struct {
	member, busy, all time.Duration
	starts            map[float64]float64
}

func (b *bench) readCost() (cost, error) {
	var c cost
	var err1, err2, err3 error
	c.member, err1 = benchutil.PidCPU(b.ferryPID)
	c.busy, c.all, err2 = benchutil.MachineCPU()
	c.starts, err3 = b.histogram("ferry_mirror_writer_start_seconds")
	return c, errors.Join(err1, err2, err3)
}

// partitionZeroEnds lists the end offset of partition 0 of each topic, in
// one ListOffsets per leader (kadm's would list every partition of every
// topic, ten times the brokers' work, every poll).
func partitionZeroEnds(ctx context.Context, cl *kgo.Client, topics []string) (map[string]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	for _, t := range topics {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = t
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = 0, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(topics))
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("end offset of %s/%d: %w", t.Topic, p.Partition, err)
			}
			out[t.Topic] = p.Offset
		}
	}
	if len(out) != len(topics) {
		return nil, fmt.Errorf("end offsets of %d of %d topics", len(out), len(topics))
	}
	return out, nil
}

// post posts body to the member's admin API at path and decodes the
// answer into out.
func (b *bench) post(ctx context.Context, path string, body, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+b.admin+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	ans, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, ans)
	}
	return json.Unmarshal(ans, out)
}
