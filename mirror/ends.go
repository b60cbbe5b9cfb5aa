package mirror

import (
	"context"
	"time"

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
// runs per record or per fetch.

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
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.listEnds(ctx)
	}
}

// listEnds lists the source's end offset of every partition whose writer
// runs here (stopped ones aside) and hands each to its writer. A source
// that does not answer within an interval is skipped: the ends stay as last
// seen.
func (m *Mirror) listEnds(ctx context.Context) {
	m.mu.Lock()
	ws := make(map[topicPartition]*writer, len(m.writers))
	for tp, h := range m.writers {
		ws[tp] = h.w
	}
	m.mu.Unlock()
	byTopic := map[string][]int32{}
	for tp, w := range ws {
		if w.Status().State == StateStopped {
			continue
		}
		byTopic[tp.topic] = append(byTopic[tp.topic], tp.partition)
	}
	if len(byTopic) == 0 {
		return
	}
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	req.IsolationLevel = 0 // the high watermark, as Fetch reports it
	for topic, parts := range byTopic {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for _, p := range parts {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition = p
			rp.CurrentLeaderEpoch = -1
			rp.Timestamp = -1 // latest
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	rctx, cancel := context.WithTimeout(ctx, m.cfg.endsInterval)
	defer cancel()
	for _, shard := range m.src.RequestSharded(rctx, req) {
		if shard.Err != nil {
			continue
		}
		resp, ok := shard.Resp.(*kmsg.ListOffsetsResponse)
		if !ok {
			continue
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				if rp.ErrorCode != 0 || rp.Offset < 0 {
					continue
				}
				if w := ws[topicPartition{rt.Topic, rp.Partition}]; w != nil {
					w.listed(rp.Offset)
				}
			}
		}
	}
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
