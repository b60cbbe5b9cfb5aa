package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// switchover runs one switch of the active cluster on this member (the
// admin API's POST /switchover).
func (n *node) switchover(ctx context.Context, req routing.Request) (routing.State, error) {
	return n.switcher.Switch(ctx, req)
}

// switchMirror is the mirror as a switch drives it (routing.Mirror). With
// the mirror disabled the switcher gets nil instead.
type switchMirror struct{ r *mirrorRunner }

var _ routing.Mirror = switchMirror{}

func (m switchMirror) Halted() []string {
	var out []string
	for _, st := range m.r.Info().Partitions {
		if st.State == mirror.StateHalted {
			out = append(out, fmt.Sprintf("%s[%d]: %v", st.Topic, st.Partition, st.Err))
		}
	}
	sort.Strings(out)
	return out
}

func (m switchMirror) Drain(ctx context.Context) error {
	c := m.r.cur.Load()
	if c == nil {
		return errors.New("mirror: not running")
	}
	m.r.warmListers() // for Stop's listing
	err := c.m.Drain(ctx)
	var lag *mirror.LagError
	if errors.As(err, &lag) {
		return &routing.LagError{Partitions: lag.Partitions}
	}
	return err
}

func (m switchMirror) SyncGroups(ctx context.Context) error {
	c := m.r.cur.Load()
	if c == nil {
		return errors.New("mirror: not running")
	}
	return c.m.SyncGroups(ctx)
}

func (m switchMirror) Stop() []routing.Position {
	c := m.r.cur.Load()
	if c == nil {
		return nil
	}
	m.r.Stop()
	return m.r.positions(c.source, c.target, c.m.Status())
}

// sourceEndsTimeout bounds the listing of the source's end offsets when
// the mirror stops: a forced switch is asked for most often because the
// source is gone, and must not wait long on it.
const sourceEndsTimeout = 3 * time.Second

// positions is where each partition in sts stands once the mirror from
// source to target has stopped. On the standby: its end offset, listed, or
// what the writer mirrored if larger or the listing failed. On the source:
// its end offset, listed, or the writer's last reading if larger or the
// listing failed. A writer that has not fetched yet has read no source
// end at all (-1): without the listing, what the source acknowledged in
// that partition would be lost unreported. Both are listed at once.
func (r *mirrorRunner) positions(source, target string, sts []mirror.PartitionStatus) []routing.Position {
	var standbyEnds, standbyStable, sourceEnds map[string]map[int32]int64
	var wg sync.WaitGroup
	wg.Go(func() { standbyEnds, standbyStable = r.endOffsets(target, "standby", sts, 10*time.Second, true) })
	wg.Go(func() { sourceEnds, _ = r.endOffsets(source, "source", sts, sourceEndsTimeout, false) })
	wg.Wait()
	out := make([]routing.Position, 0, len(sts))
	for _, st := range sts {
		standby, src := st.Mirrored, st.SourceEnd
		if e, ok := standbyEnds[st.Topic][st.Partition]; ok {
			standby = max(standby, e)
		}
		if e, ok := sourceEnds[st.Topic][st.Partition]; ok {
			src = max(src, e)
		}
		pos := routing.Position{Topic: st.Topic, Partition: st.Partition, Standby: standby, Source: src}
		if e, ok := standbyStable[st.Topic][st.Partition]; ok && e < standby {
			pos.Committed = &e
		}
		if st.State == mirror.StateHalted && mirror.Parted(st.Err) && st.Mirrored >= 0 {
			pos.Matches = &st.Mirrored
		}
		out = append(out, pos)
	}
	return out
}

// endOffsets lists the end offsets of the partitions in sts on cluster
// (role names it in the log), within timeout, by topic and partition, and
// with stable their last stable offsets too (a transaction left open
// below the end); on error, what it could, logged. On the standby a
// stopped mirror wrote to:
// a writer stopped with appends in flight may have had them written
// without reading the answers, so its mirrored offset can be below the
// standby's end; the end is what the new generation's fence must hold, and
// where the lost ranges start.
func (r *mirrorRunner) endOffsets(cluster, role string, sts []mirror.PartitionStatus, timeout time.Duration, stable bool) (ends, stableEnds map[string]map[int32]int64) {
	ends, stableEnds = map[string]map[int32]int64{}, map[string]map[int32]int64{}
	parts := map[string][]int32{}
	for _, st := range sts {
		parts[st.Topic] = append(parts[st.Topic], st.Partition)
	}
	if len(parts) == 0 {
		return ends, stableEnds
	}
	cl, err := r.lister(cluster)
	if err != nil {
		r.log.Error("listing end offsets at the switch", zap.String("cluster", cluster), zap.String("role", role), zap.Error(err))
		return ends, stableEnds
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	list := func(lastStable bool, into map[string]map[int32]int64) {
		listed, err := mirror.ListEnds(ctx, cl, parts, lastStable)
		if err = cmp.Or(err, mirror.ListedError(listed)); err != nil {
			r.log.Warn("listing end offsets at the switch: the mirror's own readings are used where the listing failed", zap.String("cluster", cluster), zap.String("role", role), zap.Bool("last_stable", lastStable), zap.Error(err))
		}
		listed.Each(func(o kadm.ListedOffset) {
			if o.Err == nil {
				if into[o.Topic] == nil {
					into[o.Topic] = map[int32]int64{}
				}
				into[o.Topic][o.Partition] = o.Offset
			}
		})
	}
	if !stable {
		list(false, ends)
		return ends, stableEnds
	}
	// Both at once: a round trip each to a standby a region away, with
	// the switch's writes held.
	var wg sync.WaitGroup
	wg.Go(func() { list(true, stableEnds) })
	list(false, ends)
	wg.Wait()
	// A last stable offset counts only with the end beside it.
	for t, ps := range stableEnds {
		for p := range ps {
			if _, ok := ends[t][p]; !ok {
				delete(ps, p)
			}
		}
	}
	return ends, stableEnds
}

func (m switchMirror) Follow(st routing.State) error { return m.r.Follow(st) }

var _ routing.LeftOpenAborter = switchMirror{}

// AbortLeftOpen implements routing.LeftOpenAborter: the transactions the
// stopped writers left open on cluster (mirror.AbortLeftOpen).
func (m switchMirror) AbortLeftOpen(ctx context.Context, cluster string) error {
	cl, err := m.r.client(cluster, kgo.ClientID("ferry-switch"))
	if err != nil {
		return err
	}
	defer cl.Close()
	ids, err := mirror.AbortLeftOpen(ctx, cl, mirror.DefaultTransactionalIDPrefix)
	if len(ids) > 0 {
		m.r.log.Warn("aborted the transactions the mirror left open on the new active cluster: their source's outcome never came, and what they held is in the lost ranges",
			zap.String("cluster", cluster), zap.Strings("transactional_ids", ids))
	}
	return err
}

// Unanswered implements fleetswitch.LocalMirror: each mirrored partition
// no member answered for at the stop (its writer ran on a member the call
// did not reach: alive to gossip, but cut off or dying) gets the standby's
// end offset, so that the ended generation's fence covers it (what
// OffsetForLeaderEpoch answers), and what the source's end, listed, holds
// beyond it is a lost range; the log names them.
func (m switchMirror) Unanswered() func(got []routing.Position) []routing.Position {
	local := m.r.cur.Load()
	if local == nil {
		return nil
	}
	return func(got []routing.Position) []routing.Position {
		have := map[string]map[int32]bool{}
		for _, p := range got {
			if have[p.Topic] == nil {
				have[p.Topic] = map[int32]bool{}
			}
			have[p.Topic][p.Partition] = true
		}
		var missing []mirror.PartitionStatus
		for t, n := range local.m.Partitions() {
			for p := range n {
				if !have[t][p] {
					missing = append(missing, mirror.PartitionStatus{Topic: t, Partition: p, Mirrored: -1, SourceEnd: -1})
				}
			}
		}
		if len(missing) == 0 {
			return nil
		}
		var out []routing.Position
		var names []string
		for _, p := range m.r.positions(local.source, local.target, missing) {
			if p.Standby < 0 {
				continue // the standby's end could not be listed: no fence
			}
			out = append(out, p)
			names = append(names, fmt.Sprintf("%s[%d]", p.Topic, p.Partition))
		}
		sort.Strings(names)
		m.r.log.Error("no member answered for some mirrored partitions at the switch: their fence is the standby's end, and what the source holds beyond it, where it could be listed, is reported lost",
			zap.Strings("partitions", names), zap.Int("unlisted", len(missing)-len(out)))
		return out
	}
}
