package mirror

import (
	"context"
	"maps"

	"go.uber.org/zap"
)

// Ownership says which partitions this member writes; nil = all (one member).
type Ownership interface {
	Owns(topic string, partition int32) bool
	// Syncs reports whether this member runs the metadata sync loop (topics, partitions, configs, ACLs, group offsets): exactly one member should.
	Syncs() bool
	Changed() <-chan struct{} // closed at the next change of ownership (each call returns the current channel)
}

// WithOwnership spreads the partition writers over several members: the
// Mirror runs writers only for the partitions o says it owns, stops the
// ones it loses as soon as o's Changed channel closes, and starts the ones
// it gains. The metadata sync loop's writing steps (creating topics and
// partitions, configs, group offsets, ACLs) run only while o.Syncs(); a
// member that does not sync still reads the topics, and starts writers for
// the partitions it owns once the syncing member has prepared them on the
// standby. Without it (or with nil) the Mirror owns every partition and
// syncs.
//
// Two members that both believe they own a partition for a moment (their
// views of the ownership converge at different times) cannot both append:
// the later writer fences the earlier one (fence.go). With an Ownership a
// fenced writer is not halted: it waits two fence periods, by when the other
// member has normally learnt that it does not own the partition, and takes
// the partition back if it still owns it.
func WithOwnership(o Ownership) Option { return func(c *config) { c.ownership = o } }

// WithWriteGate makes every writer wait, before each append to the
// standby, while gate reports false. A fleet member shuts it while it
// cannot be sure that the generation it mirrors for is still in force (a
// process that was paused through a switch, cmd/ferry): its writers must
// not append to the cluster that has since become active.
func WithWriteGate(gate func() bool) Option { return func(c *config) { c.gate = gate } }

// WithSyncGate makes the metadata sync loop only read while gate reports
// false: no topic, config, ACL or group offset is written on the standby.
// It is asked at each round and again before each group's offsets are
// copied. The owner shuts it whenever the mirror's target may be the
// active cluster — from a switch's flip until this mirror is stopped, or
// while a member restarted or paused through a switch has not learnt the
// generation after it: the offsets copied then are the old cluster's, and
// would move back a group whose members are rejoining on the new one (it
// is empty there, so it takes the commit) past what they committed since.
func WithSyncGate(gate func() bool) Option { return func(c *config) { c.syncGate = gate } }

// WithGroupSyncGate adds a gate the periodic copy of group offsets must
// pass besides the sync gate: the owner shuts it while a switch runs,
// which copies the offsets itself with commits held — a round that read
// the source's offsets before the hold must not write them over the
// switch's copy.
func WithGroupSyncGate(gate func() bool) Option { return func(c *config) { c.groupGate = gate } }

// syncOpen reports whether the sync loop may write on the standby.
func (m *Mirror) syncOpen() bool { return m.cfg.syncGate == nil || m.cfg.syncGate() }

// groupSyncOpen reports whether the sync loop may copy group offsets.
func (m *Mirror) groupSyncOpen() bool {
	return m.syncOpen() && (m.cfg.groupGate == nil || m.cfg.groupGate())
}

// owns reports whether this member writes the partition.
// Partitions returns every mirrored topic with its partition count, the
// partitions whose writers run on other members included.
func (m *Mirror) Partitions() map[string]int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.parts)
}

func (m *Mirror) owns(topic string, partition int32) bool {
	o := m.cfg.ownership
	return o == nil || o.Owns(topic, partition)
}

// syncs reports whether this member runs the metadata sync loop's writing
// steps.
func (m *Mirror) syncs() bool {
	o := m.cfg.ownership
	return o == nil || o.Syncs()
}

// watchOwnership applies every change of ownership at once, whatever the
// sync loop is doing, until ctx ends.
func (m *Mirror) watchOwnership(ctx context.Context) {
	o := m.cfg.ownership
	for {
		// The channel is taken before the ownership is read, so that a
		// change in between is not missed.
		ch := o.Changed()
		m.assign(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// assign makes the writers follow the ownership: every known partition
// (m.parts) this member owns has a writer, and the writers of partitions it
// no longer owns are stopped — their context cancelled, which closes their
// connections — and forgotten once their goroutine has returned, so that
// Status lists exactly the writers running here. One assign runs at a
// time.
func (m *Mirror) assign(ctx context.Context) {
	m.assignMu.Lock()
	defer m.assignMu.Unlock()

	m.mu.Lock()
	parts := make(map[string]int32, len(m.parts))
	total := 0
	for t, n := range m.parts {
		parts[t] = n
		total += int(n)
	}
	m.mu.Unlock()

	// Owns is the caller's code: not called under m.mu. Sized at once: a
	// round at 5,000 partitions spent half its time growing this map.
	owned := make(map[topicPartition]bool, total)
	for t, n := range parts {
		for p := range n {
			owned[topicPartition{t, p}] = m.owns(t, p)
		}
	}

	var gained, lost, count int
	var stop []topicPartition
	var stopping []*writerHandle
	m.mu.Lock()
	for tp, own := range owned {
		if own {
			count++
		}
		if prev, known := m.owned[tp]; known && prev != own {
			if own {
				gained++
			} else {
				lost++
			}
			m.log.Debug("mirror partition ownership changed", zap.String("topic", tp.topic),
				zap.Int32("partition", tp.partition), zap.Bool("owned", own))
		}
		m.owned[tp] = own
		if h := m.writers[tp]; h != nil && !own {
			h.cancel()
			stop = append(stop, tp)
			stopping = append(stopping, h)
		}
	}
	for tp := range m.owned {
		if _, ok := owned[tp]; !ok {
			delete(m.owned, tp) // a topic no longer mirrored
		}
	}
	m.mu.Unlock()

	// Wait for the lost writers to return, then forget them.
	for i, h := range stopping {
		<-h.done
		m.mu.Lock()
		if m.writers[stop[i]] == h {
			delete(m.writers, stop[i])
		}
		m.mu.Unlock()
		h.w.retire()
		m.metrics.forget(stop[i].topic, stop[i].partition)
	}

	for tp, own := range owned {
		if own {
			m.startWriter(ctx, tp.topic, tp.partition, nil)
		}
	}
	m.metrics.owned.Set(float64(count))
	if gained+lost > 0 {
		m.metrics.handovers.WithLabelValues("gained").Add(float64(gained))
		m.metrics.handovers.WithLabelValues("lost").Add(float64(lost))
		m.log.Info("mirror partition ownership changed", zap.Int("gained", gained), zap.Int("lost", lost), zap.Int("owned", count))
	}
}
