package mirror

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Share groups (KIP-932) keep no committed offsets: each share partition
// has a start offset, below which every record is acknowledged, and above
// it, up to the records the group has fetched, the state of each record
// in flight (acquired by a member, acknowledged, released; its delivery
// count). Of that, what another cluster can take is the start offset,
// through the share-group offsets admin APIs (as KIP-1279 copies it):
// DescribeShareGroupOffsets on the source, AlterShareGroupOffsets on the
// standby, which takes it only while the group has no members there and
// starts each partition afresh from it: no record in flight, every
// delivery count back to zero. So after a switch a share group resumes at
// the start offset it had: records it had acknowledged are not delivered
// again; records in flight (acquired and not yet acknowledged, or
// acknowledged above the start offset, out of order) are delivered again,
// counted from one. At least once, as share groups promise; never skipped.
//
// The group's configs (share.auto.offset.reset, the record lock duration,
// the delivery count limit) are copied with them, at the switch: a
// partition the group had not started on starts on the new cluster as it
// would have on the old one.
//
// shareGroupsRound runs syncShareGroups when the source has share
// groups, listing the standby's groups first outside a switch (dst is
// listed only for one).
func (m *Mirror) shareGroupsRound(ctx context.Context, src, dst kadm.ListedGroups, evict bool) error {
	has := false
	for _, g := range src {
		has = has || g.GroupType == "share" && m.cfg.mirrorGroup(g.Group)
	}
	if !has {
		return nil
	}
	if !evict {
		var err error
		if dst, err = m.dstAdm.ListGroups(ctx); err != nil {
			return fmt.Errorf("listing standby groups: %w", err)
		}
	}
	return m.syncShareGroups(ctx, src, dst, evict)
}

// syncShareGroups runs with the consumer groups' sync (syncGroups): every
// round for groups with no members on the standby, and at the switch
// (evict) for every group, removing the members a group still has on the
// standby (left from before an earlier switch) first.
func (m *Mirror) syncShareGroups(ctx context.Context, src, dst kadm.ListedGroups, evict bool) error {
	var groups []string
	for _, g := range src.Sorted() {
		if g.GroupType != "share" || !m.cfg.mirrorGroup(g.Group) {
			continue
		}
		if !evict && activeOn(dst, g.Group) {
			continue // its members own its state there
		}
		groups = append(groups, g.Group)
	}
	if len(groups) == 0 {
		return nil
	}
	// The standby's are compared only to skip a copy that would change
	// nothing, outside a switch (which copies every group); on an error
	// the copy is made anyway.
	var dstOffs kadm.DescribedShareGroupsOffsets
	var wg sync.WaitGroup
	if !evict {
		wg.Go(func() {
			if d, err := m.dstAdm.DescribeShareGroupOffsets(ctx, groups...); err == nil {
				dstOffs = d
			}
		})
	}
	srcOffs, srcErr := m.srcAdm.DescribeShareGroupOffsets(ctx, groups...)
	wg.Wait()
	if srcErr != nil {
		return fmt.Errorf("describing the share groups' start offsets: %w", srcErr)
	}
	parts := map[string][]int32{}
	named := map[topicPartition]bool{}
	for _, g := range groups {
		for t, ps := range srcOffs[g].Offsets {
			if !m.cfg.mirrorTopic(t, false) {
				continue
			}
			for p := range ps {
				if tp := (topicPartition{t, p}); !named[tp] {
					named[tp] = true
					parts[t] = append(parts[t], p)
				}
			}
		}
	}
	// At the switch, the start offsets a group's finished partitions can
	// resume at (resumeEnds); the describe read after them replaces the
	// first one.
	var finished kadm.ListedOffsets
	if evict && len(parts) > 0 {
		var err error
		if finished, srcOffs, err = m.resumeEnds(ctx, groups, parts); err != nil {
			return fmt.Errorf("describing the share groups' start offsets: %w", err)
		}
	}
	var ends kadm.ListedOffsets
	if len(parts) > 0 {
		var err error
		if ends, err = ListEnds(ctx, m.dst, parts, false); err != nil {
			return fmt.Errorf("standby end offsets: %w", err)
		}
	}
	var errs []error
	for _, g := range groups {
		d := srcOffs[g]
		if d.Err != nil {
			errs = append(errs, fmt.Errorf("share group %s: %w", g, d.Err))
			continue
		}
		want := make(kadm.Offsets)
		for t, ps := range d.Offsets {
			if !m.cfg.mirrorTopic(t, false) {
				continue
			}
			for p, o := range ps {
				if o.Err != nil || o.StartOffset < 0 {
					continue // not started on that partition: nothing to carry
				}
				end, ok := ends.Lookup(t, p)
				if !ok || end.Err != nil {
					continue // not mirrored (yet)
				}
				start := o.StartOffset
				if f, ok := finished.Lookup(t, p); ok && f.Err == nil && o.Lag == 0 {
					start = max(start, f.Offset)
				}
				want.Add(kadm.Offset{Topic: t, Partition: p, At: min(start, end.Offset), LeaderEpoch: -1})
			}
		}
		if len(want) == 0 {
			continue
		}
		if have, ok := dstOffs[g]; ok && have.Err == nil && sameShareOffsets(have.Offsets, want) {
			continue
		}
		if !evict && !m.groupSyncOpen() {
			return errors.Join(errs...) // the switch copies them itself
		}
		if err := m.copyShareGroup(ctx, g, want, evict, evict && activeOn(dst, g)); err != nil {
			errs = append(errs, fmt.Errorf("share group %s: %w", g, err))
		}
	}
	return errors.Join(errs...)
}

// resumeEnds reads, for a switch, the source's last stable offsets of
// parts, then the groups' start offsets again. The start offset a broker
// reports is the one it persisted, which is one acknowledgement behind
// the one it holds: it moves it once an acknowledgement's state write is
// answered, and that write carried the old one. A partition the second
// describe reports with lag 0 has every record below the broker's end
// finished (acknowledged or archived), and that end is not below the
// offset read before it (the last stable one: the end of a group reading
// committed records, at most the end of one that does not), so the group
// can resume there without a record skipped, rather than deliver the
// records of its last acknowledgement again. With writes held by the
// switch the two ends are the same.
func (m *Mirror) resumeEnds(ctx context.Context, groups []string, parts map[string][]int32) (kadm.ListedOffsets, kadm.DescribedShareGroupsOffsets, error) {
	stable, err := ListEnds(ctx, m.src, parts, true)
	if err != nil {
		return nil, nil, fmt.Errorf("source last stable offsets: %w", err)
	}
	again, err := m.srcAdm.DescribeShareGroupOffsets(ctx, groups...)
	if err != nil {
		return nil, nil, err
	}
	return stable, again, nil
}

// copyShareGroup sets a share group's start offsets on the standby (and,
// with evict, first removes its members there and copies its configs).
func (m *Mirror) copyShareGroup(ctx context.Context, group string, want kadm.Offsets, switching, evict bool) error {
	if evict {
		n, err := m.evictShareMembers(ctx, group)
		if err != nil {
			return fmt.Errorf("removing its members from the standby: %w", err)
		}
		if n > 0 {
			m.log.Info("removed stale members from a share group on the standby before copying its start offsets", zap.String("group", group), zap.Int("members", n))
		}
	}
	if switching {
		if err := m.copyShareGroupConfigs(ctx, group); err != nil {
			return fmt.Errorf("copying its configs: %w", err)
		}
	}
	resp, err := m.dstAdm.AlterShareGroupOffsets(ctx, group, want)
	if err == nil {
		err = resp.Error()
	}
	m.log.Info("copied a share group's start offsets", zap.String("group", group), zap.Any("offsets", commitAts(want)), zap.Error(err))
	if err != nil {
		return fmt.Errorf("altering its start offsets on the standby: %w", err)
	}
	return nil
}

// copyShareGroupConfigs sets the standby's configs of a share group to
// the source's (those set for the group: source GROUP_CONFIG).
func (m *Mirror) copyShareGroupConfigs(ctx context.Context, group string) error {
	dreq := kmsg.NewPtrDescribeConfigsRequest()
	dres := kmsg.NewDescribeConfigsRequestResource()
	dres.ResourceType, dres.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	dreq.Resources = append(dreq.Resources, dres)
	dresp, err := dreq.RequestWith(ctx, m.src)
	if err != nil {
		return err
	}
	areq := kmsg.NewPtrIncrementalAlterConfigsRequest()
	ares := kmsg.NewIncrementalAlterConfigsRequestResource()
	ares.ResourceType, ares.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	for _, r := range dresp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return err
		}
		for _, c := range r.Configs {
			if c.Source == kmsg.ConfigSourceGroupConfig && c.Value != nil {
				ac := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
				ac.Name, ac.Op, ac.Value = c.Name, kmsg.IncrementalAlterConfigOpSet, c.Value
				ares.Configs = append(ares.Configs, ac)
			}
		}
	}
	if len(ares.Configs) == 0 {
		return nil
	}
	areq.Resources = append(areq.Resources, ares)
	aresp, err := areq.RequestWith(ctx, m.dst)
	if err != nil {
		return err
	}
	for _, r := range aresp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return err
		}
	}
	return nil
}

// evictShareMembers makes every member of a share group on the standby
// leave (a heartbeat with epoch -1 in its name), and returns how many did.
func (m *Mirror) evictShareMembers(ctx context.Context, group string) (int, error) {
	dreq := kmsg.NewPtrShareGroupDescribeRequest()
	dreq.GroupIDs = []string{group}
	dresp, err := dreq.RequestWith(ctx, m.dst)
	if err != nil {
		return 0, err
	}
	return evictByHeartbeat(dresp.Groups,
		func(g kmsg.ShareGroupDescribeResponseGroup) (int16, []kmsg.ShareGroupDescribeResponseGroupMember) {
			return g.ErrorCode, g.Members
		},
		func(mem kmsg.ShareGroupDescribeResponseGroupMember) (string, int16, error) {
			hb := kmsg.NewPtrShareGroupHeartbeatRequest()
			hb.GroupID, hb.MemberID, hb.MemberEpoch = group, mem.MemberID, -1
			resp, err := hb.RequestWith(ctx, m.dst)
			if err != nil {
				return mem.MemberID, 0, err
			}
			return mem.MemberID, resp.ErrorCode, nil
		})
}

func sameShareOffsets(have kadm.ShareOffsets, want kadm.Offsets) bool {
	for t, ps := range want {
		for p, o := range ps {
			h, ok := have[t][p]
			if !ok || h.Err != nil || h.StartOffset != o.At {
				return false
			}
		}
	}
	return true
}
