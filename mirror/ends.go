package mirror

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The source's end offsets, listed.
//
// A writer learns the source's high watermark from its own fetches, and it
// fetches again only once its appends to the standby are acknowledged: what
// the source acknowledged in the meantime showed nowhere, neither in the
// lag nor in what a forced switch lists as lost. So every endsInterval the
// Mirror lists the latest offset (the high watermark, read_uncommitted) of
// every partition whose writer runs here, in one ListOffsets request per
// source broker leading any of them (the client shards it by leader, from
// its cached metadata), and each writer's SourceEnd is the larger of the
// high watermark of its last fetch and the one last listed. Nothing of this
// runs per record or per fetch. A parked partition (watch.go) is left out:
// its watcher's fetch session answers whenever its high watermark moves.
// One listing in parkedListEvery names the parked partitions too, and wakes
// each whose end is past where its writer parked: whatever the watcher
// might miss (it answers on a broker's word that nothing changed) waits at
// most that long, and shows in the lag meanwhile.

// defaultEndsInterval is how often the source's end offsets of the
// mirrored partitions are listed for the lag: SourceEnd, the lag and a
// forced switch's lost ranges miss at most what the source acknowledged in
// the last interval (plus a ListOffsets round trip).
const defaultEndsInterval = time.Second

// refreshEnds lists the source's end offsets every endsInterval until ctx
// ends.
func (m *Mirror) refreshEnds(ctx context.Context) {
	t := time.NewTicker(m.cfg.endsInterval)
	defer t.Stop()
	for round := 1; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.listEnds(ctx, round%m.cfg.parkedListEvery == 0)
	}
}

// listEnds lists the source's end offset of every partition whose writer
// runs here (stopped ones aside) and hands each to its writer. A source
// that does not answer within an interval is skipped: the ends stay as last
// seen.
func (m *Mirror) listEnds(ctx context.Context, parked bool) {
	m.mu.Lock()
	ws := make(map[topicPartition]*writer, len(m.writers))
	for tp, h := range m.writers {
		ws[tp] = h.w
	}
	m.mu.Unlock()
	byTopic := map[string][]int32{}
	for tp, w := range ws {
		if w.parked.Load() && !parked || w.Status().State == StateStopped {
			continue // a parked partition's watcher reports its end
		}
		byTopic[tp.topic] = append(byTopic[tp.topic], tp.partition)
	}
	if len(byTopic) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, m.cfg.endsInterval)
	defer cancel()
	listed, _ := ListEnds(rctx, m.src, byTopic, false) // the high watermark, as Fetch reports it
	listed.Each(func(o kadm.ListedOffset) {
		if o.Err != nil || o.Offset < 0 {
			return
		}
		if w := ws[topicPartition{o.Topic, o.Partition}]; w != nil {
			w.listed(o.Offset)
			if w.parked.Load() {
				w.watcher.nudge(topicPartition{o.Topic, o.Partition}, o.Offset)
			}
		}
	})
}

// ListEnds lists, on cl, the end of each partition in parts: the high
// watermark, or with lastStable the last stable offset, one ListOffsets
// per leader. The leaders come from the client's metadata,
// which kgo keeps from the last Metadata answer for a few seconds: kadm's
// listings ask for metadata first, a round trip more each, which a cluster
// a region away turned into a third of a switch's drain. A partition the
// cluster does not have is left out; one whose leader could not be asked
// (none: its replicas' brokers are down), or that answered an error, is in
// the listing with that error. Only ctx's end fails the listing.
func ListEnds(ctx context.Context, cl *kgo.Client, parts map[string][]int32, lastStable bool) (kadm.ListedOffsets, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	if lastStable {
		req.IsolationLevel = 1 // read committed
	}
	for t, ps := range parts {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = t
		for _, p := range ps {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition = p
			rp.CurrentLeaderEpoch = -1
			rp.Timestamp = -1 // the end
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	out := kadm.ListedOffsets{}
	add := func(o kadm.ListedOffset) {
		if errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
			return // not on this cluster
		}
		if out[o.Topic] == nil {
			out[o.Topic] = map[int32]kadm.ListedOffset{}
		}
		out[o.Topic][o.Partition] = o
	}
	for _, sh := range cl.RequestSharded(ctx, req) {
		if sh.Err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("ListOffsets: %w", sh.Err)
			}
			for _, t := range sh.Req.(*kmsg.ListOffsetsRequest).Topics {
				for _, p := range t.Partitions {
					add(kadm.ListedOffset{Topic: t.Topic, Partition: p.Partition, Err: sh.Err})
				}
			}
			continue
		}
		for _, t := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range t.Partitions {
				add(kadm.ListedOffset{Topic: t.Topic, Partition: p.Partition, Timestamp: p.Timestamp, Offset: p.Offset, LeaderEpoch: p.LeaderEpoch, Err: kerr.ErrorForCode(p.ErrorCode)})
			}
		}
	}
	return out, nil
}

// listed records the source's end offset as listed by listEnds.
func (w *writer) listed(end int64) {
	w.mu.Lock()
	if w.retired {
		w.mu.Unlock()
		return
	}
	w.listedEnd = end
	w.updateLocked()
	w.mu.Unlock()
}

// retire makes a writer that has been replaced or forgotten touch neither
// its status nor the metrics any more.
func (w *writer) retire() {
	w.mu.Lock()
	w.retired = true
	w.mu.Unlock()
}
