package mirror

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// The metadata sync loop, run every SyncInterval by Run:
//
//  1. Topics: every selected source topic exists on the standby with the
//     same partition count (partitions are added, never removed: Kafka
//     cannot), its carried configs equal the source's, and the configs the
//     mirror needs are forced (standbyConfigs). A new topic's configs are
//     read and copied in the first round that sees it; those of topics
//     already mirrored every configEvery rounds (30 s by default: the
//     configs of every topic, described on both clusters, are most of an
//     idle mirror's cost at a thousand topics). New partitions get a writer
//     on the member that owns them (assign). Only the syncing member
//     (Ownership.Syncs) writes any of this; the others read which topics
//     are ready.
//  2. A topic deleted on the source: its writers stop (state "stopped");
//     the standby topic and its data are kept — deleting data on the
//     standby is left to an operator, so that a mistaken delete on the
//     active cluster does not propagate. A topic recreated on the source
//     under the same name (a new topic ID) is not mirrored into the old
//     standby topic: its writers halt with ErrSourceTruncated until the
//     operator deletes the standby topic.
//  3. Consumer group offsets: copied 1:1 (offsets are equal) for groups
//     with no active members on the standby, clamped to the standby's end
//     offset (what is mirrored, whichever member writes the partition), with
//     leader epoch -1 (epochs differ between clusters).
//  4. ACLs: every source ACL is created on the standby (additive: an ACL
//     deleted on the source is not deleted on the standby).

// configEvery is how many sync rounds pass between two copies of the
// configs of topics already mirrored. MirrorMaker 2 copies them every 10
// minutes (sync.topic.configs.interval.seconds).
const configEvery = 6

// standbyConfigs are set on every standby topic regardless of the source:
//   - compression.type=producer: the broker keeps each batch as the writer
//     sends it (payload bytes untouched); any other value recompresses
//     batches whose codec differs.
//   - message.timestamp.type=CreateTime: a broker refuses LogAppendTime
//     batches from clients. Source batches with LogAppendTime are sent with
//     that flag cleared, so readers of the standby see the records' create
//     times instead of the source broker's append time.
//   - message.timestamp.before/after.max.ms: records are as old (or as far
//     in the future) as they were when the source accepted them.
var standbyConfigs = map[string]string{
	"compression.type":                "producer",
	"message.timestamp.type":          "CreateTime",
	"message.timestamp.before.max.ms": "9223372036854775807",
	"message.timestamp.after.max.ms":  "9223372036854775807",
}

// notCarried are source topic configs that are not copied, beyond
// standbyConfigs, because they describe the source cluster rather than the
// data:
//   - min.insync.replicas, unclean.leader.election.enable: durability
//     policy that depends on the standby's replication factor and brokers;
//   - leader/follower.replication.throttled.replicas: broker IDs of the
//     source cluster;
//   - remote.storage.enable, remote.log.*, local.retention.*: tiered
//     storage depends on the cluster's remote storage plugin.
var notCarried = map[string]bool{
	"min.insync.replicas":                     true,
	"unclean.leader.election.enable":          true,
	"leader.replication.throttled.replicas":   true,
	"follower.replication.throttled.replicas": true,
	"remote.storage.enable":                   true,
	"local.retention.ms":                      true,
	"local.retention.bytes":                   true,
	"message.timestamp.difference.max.ms":     true,
}

func carried(key string) bool {
	if _, forced := standbyConfigs[key]; forced {
		return false
	}
	return !notCarried[key] && !strings.HasPrefix(key, "remote.log.")
}

// syncOnce runs one round of the sync loop; each step logs and counts its
// own errors and does not stop the others. A member that does not sync
// (Ownership.Syncs) only reads the topics, to run the writers of the
// partitions it owns; it writes nothing on the standby but through them.
func (m *Mirror) syncOnce(ctx context.Context) {
	syncs := m.syncs() && m.syncOpen()
	if err := m.syncTopics(ctx, syncs); err != nil && ctx.Err() == nil {
		m.metrics.syncErrors.WithLabelValues("topics").Inc()
		m.log.Warn("mirror topic sync failed", zap.Error(err))
	}
	if syncs && m.cfg.syncGroups && m.groupSyncOpen() {
		if err := m.syncGroups(ctx, false); err != nil && ctx.Err() == nil {
			m.metrics.syncErrors.WithLabelValues("groups").Inc()
			m.log.Warn("mirror group offset sync failed", zap.Error(err))
		}
	}
	if syncs && m.cfg.syncACLs {
		if err := m.syncACLs(ctx); err != nil && ctx.Err() == nil {
			m.metrics.syncErrors.WithLabelValues("acls").Inc()
			m.log.Warn("mirror ACL sync failed", zap.Error(err))
		}
	}
}

// syncTopics learns the mirrored topics, stops the writers of topics
// deleted or recreated on the source, and has the partitions that are
// ready on the standby assigned (assign). Ready: prepared by this member
// when it syncs (prepareTopics), else found prepared by the member that
// does (preparedTopics).
func (m *Mirror) syncTopics(ctx context.Context, syncs bool) error {
	srcTopics, err := syncListTopics(ctx, m.src)
	if err != nil {
		return fmt.Errorf("listing source topics: %w", err)
	}
	var names []string
	for name, d := range srcTopics {
		if m.cfg.mirrorTopic(name, d.internal) {
			names = append(names, name)
		}
	}
	m.syncRound++
	configRound := m.syncRound%configEvery == 1
	if !configRound && m.settled.same(names, srcTopics) {
		// Nothing moved on the source since a round that found every
		// topic ready: the standby need not be listed (half of an idle
		// round's cost at 10,000 partitions). A standby topic deleted
		// behind the mirror's back is found at the next config round.
		return nil
	}
	m.settled = nil
	dstTopics, err := syncListTopics(ctx, m.dst)
	if err != nil {
		return fmt.Errorf("listing standby topics: %w", err)
	}

	// Deleted and recreated topics.
	m.mu.Lock()
	known := make(map[string][16]byte, len(m.topicIDs))
	for t, id := range m.topicIDs {
		known[t] = id
	}
	m.mu.Unlock()
	for t, id := range known {
		d, ok := srcTopics[t]
		switch {
		case !ok:
			m.log.Warn("source topic deleted: its writers stop; the standby topic is kept", zap.String("topic", t))
			m.stopTopic(t, errTopicGone)
			m.mu.Lock()
			delete(m.topicIDs, t)
			delete(m.parts, t)
			m.mu.Unlock()
		case d.id != id && d.id != [16]byte{}:
			m.log.Error("source topic recreated under the same name: not mirrored into the existing standby topic", zap.String("topic", t))
			m.stopTopic(t, &HaltError{Topic: t, Partition: -1, Offset: -1, Err: ErrSourceTruncated,
				Detail: "the source topic was deleted and recreated; delete the standby topic to mirror the new one"})
		}
	}

	// A topic prepared (and its configs copied) in an earlier round needs
	// its configs again only in a config round.
	var prepared map[string]bool
	if !configRound {
		prepared = make(map[string]bool)
		for _, n := range names {
			id, ok := known[n]
			_, onStandby := dstTopics[n]
			prepared[n] = ok && id == srcTopics[n].id && onStandby
		}
	}
	var ready map[string]int32
	if syncs {
		ready, err = m.prepareTopics(ctx, names, prepared, srcTopics, dstTopics)
	} else {
		ready, err = m.preparedTopics(ctx, names, prepared, srcTopics, dstTopics)
	}
	m.mu.Lock()
	for t, n := range ready {
		m.topicIDs[t] = srcTopics[t].id
		m.parts[t] = max(m.parts[t], n)
	}
	m.mu.Unlock()
	m.assign(ctx)
	if err == nil && len(ready) == len(names) {
		m.settled = settled(names, srcTopics, ready)
	}
	return err
}

// settledTopics is what a sync round saw of the selected source topics
// when it found every one of them ready on the standby with the source's
// partition count; nil when it did not.
type settledTopics map[string]topicMeta

func settled(names []string, src map[string]topicMeta, ready map[string]int32) settledTopics {
	s := make(settledTopics, len(names))
	for _, n := range names {
		if ready[n] != src[n].partitions {
			return nil
		}
		s[n] = src[n]
	}
	return s
}

// same reports whether the source's selected topics are those s saw, with
// the same IDs and partition counts.
func (s settledTopics) same(names []string, src map[string]topicMeta) bool {
	if s == nil || len(names) != len(s) {
		return false
	}
	for _, n := range names {
		if had, ok := s[n]; !ok || had != src[n] {
			return false
		}
	}
	return true
}

// prepareTopics creates the standby topics that are missing, adds
// partitions, and copies configs (not those of the topics marked prepared:
// in an earlier round, and this is no config round); it returns the topics
// it could prepare and how many partitions each has on both clusters.
func (m *Mirror) prepareTopics(ctx context.Context, names []string, prepared map[string]bool, srcTopics, dstTopics map[string]topicMeta) (map[string]int32, error) {
	ready := make(map[string]int32)
	var errs []error
	var describe []string
	for _, n := range names {
		if !prepared[n] {
			describe = append(describe, n)
			continue
		}
		nparts := srcTopics[n].partitions
		if err := m.addPartitions(ctx, n, dstTopics[n].partitions, nparts); err != nil {
			errs = append(errs, err)
			continue
		}
		ready[n] = nparts
	}
	if len(describe) == 0 {
		return ready, errors.Join(errs...)
	}
	cfgs, err := m.srcAdm.DescribeTopicConfigs(ctx, describe...)
	if err != nil {
		return ready, errors.Join(append(errs, fmt.Errorf("describing source topic configs: %w", err))...)
	}
	var dstNames []string
	for _, n := range describe {
		if _, ok := dstTopics[n]; ok {
			dstNames = append(dstNames, n)
		}
	}
	var dstCfgs kadm.ResourceConfigs
	if len(dstNames) > 0 {
		if dstCfgs, err = m.dstAdm.DescribeTopicConfigs(ctx, dstNames...); err != nil {
			return ready, errors.Join(append(errs, fmt.Errorf("describing standby topic configs: %w", err))...)
		}
	}
	var create []kmsg.CreateTopicsRequestTopic
	for _, rc := range cfgs {
		if rc.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rc.Name, rc.Err))
			continue
		}
		want := wantConfigs(rc.Configs)
		nparts := srcTopics[rc.Name].partitions
		dst, exists := dstTopics[rc.Name]
		if !exists {
			create = append(create, standbyTopic(rc.Name, nparts, want))
			continue
		}
		if err := m.addPartitions(ctx, rc.Name, dst.partitions, nparts); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := m.alterConfigs(ctx, rc.Name, want, dstCfgs); err != nil {
			errs = append(errs, err)
		}
		ready[rc.Name] = nparts
	}
	created, err := m.createTopics(ctx, create)
	for t, n := range created {
		ready[t] = n
	}
	return ready, errors.Join(append(errs, err)...)
}

// createTopicsBatch is how many topics one CreateTopics asks for: a mirror
// started in front of a cluster of a thousand topics used to create them one
// request after another, 5 a second here.
const createTopicsBatch = 100

func standbyTopic(name string, nparts int32, configs map[string]string) kmsg.CreateTopicsRequestTopic {
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = name, nparts, -1
	for k, v := range configs {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = k, kmsg.StringPtr(v)
		t.Configs = append(t.Configs, c)
	}
	return t
}

// createTopics creates the standby topics, createTopicsBatch to a request,
// and returns those that exist now (created, or found created) with their
// partition counts.
func (m *Mirror) createTopics(ctx context.Context, topics []kmsg.CreateTopicsRequestTopic) (map[string]int32, error) {
	created := make(map[string]int32, len(topics))
	var errs []error
	for batch := range slices.Chunk(topics, createTopicsBatch) {
		req := kmsg.NewPtrCreateTopicsRequest()
		req.TimeoutMillis = 60_000
		req.Topics = batch
		resp, err := req.RequestWith(ctx, m.dst)
		if err != nil {
			errs = append(errs, fmt.Errorf("creating %d standby topics: %w", len(batch), err))
			continue
		}
		nparts := make(map[string]int32, len(batch))
		for _, t := range batch {
			nparts[t.Topic] = t.NumPartitions
		}
		for _, t := range resp.Topics {
			err := kerr.ErrorForCode(t.ErrorCode)
			switch {
			case err == nil:
				m.log.Info("standby topic created", zap.String("topic", t.Topic), zap.Int32("partitions", nparts[t.Topic]))
			case errors.Is(err, kerr.TopicAlreadyExists):
			default:
				errs = append(errs, fmt.Errorf("creating standby topic %s: %w", t.Topic, err))
				continue
			}
			created[t.Topic] = nparts[t.Topic]
		}
	}
	return created, errors.Join(errs...)
}

// addPartitions grows the standby topic from have partitions to the
// source's nparts (have 0: not known yet, left to the next round).
func (m *Mirror) addPartitions(ctx context.Context, topic string, have, nparts int32) error {
	if have <= 0 || have >= nparts {
		return nil
	}
	resp, err := m.dstAdm.UpdatePartitions(ctx, int(nparts), topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("adding partitions to standby topic %s: %w", topic, err)
	}
	m.log.Info("standby topic partitions added", zap.String("topic", topic), zap.Int32("from", have), zap.Int32("to", nparts))
	return nil
}

// preparedTopics returns, for a member that does not sync, the topics the
// syncing member has prepared on the standby — the topic exists and has the
// configs the writers need (standbyConfigs) — and how many partitions each
// has on both clusters. A writer started earlier would retry until the
// partition exists; one started before compression.type=producer is set
// would have the standby recompress its batches.
func (m *Mirror) preparedTopics(ctx context.Context, names []string, prepared map[string]bool, srcTopics, dstTopics map[string]topicMeta) (map[string]int32, error) {
	ready := make(map[string]int32)
	var dstNames []string
	for _, n := range names {
		d, ok := dstTopics[n]
		switch {
		case !ok || d.partitions <= 0:
		case prepared[n]:
			ready[n] = min(srcTopics[n].partitions, d.partitions)
		default:
			dstNames = append(dstNames, n)
		}
	}
	if len(dstNames) == 0 {
		return ready, nil
	}
	dstCfgs, err := m.dstAdm.DescribeTopicConfigs(ctx, dstNames...)
	if err != nil {
		return ready, fmt.Errorf("describing standby topic configs: %w", err)
	}
	var errs []error
	for _, rc := range dstCfgs {
		if rc.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rc.Name, rc.Err))
			continue
		}
		have := make(map[string]string)
		for _, c := range rc.Configs {
			if c.Value != nil {
				have[c.Key] = *c.Value
			}
		}
		prepared := true
		for k, v := range standbyConfigs {
			if have[k] != v {
				prepared = false
			}
		}
		if prepared {
			ready[rc.Name] = min(srcTopics[rc.Name].partitions, dstTopics[rc.Name].partitions)
		}
	}
	return ready, errors.Join(errs...)
}

// topicMeta is what the sync loop needs of a topic's metadata.
type topicMeta struct {
	id         [16]byte
	internal   bool
	partitions int32
}

// listTopics lists the topics of cl's cluster from a fresh Metadata
// request (kadm's ListTopics may answer from kgo's metadata cache, which
// can lag a partition increase). The answer goes through the client, which
// keeps it: the listings that follow (ListEnds) find every leader there.
func listTopics(ctx context.Context, cl *kgo.Client) (map[string]topicMeta, error) {
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	return topicsOf(resp), nil
}

// syncListTopics is listTopics for the sync loop, every round: the
// request goes to a broker directly, so that kgo does not copy the answer
// into its cache (every topic and partition, every 5 s: a fifth of an idle
// member's CPU at 10,000 partitions). What needs the leaders asks for them.
func syncListTopics(ctx context.Context, cl *kgo.Client) (map[string]topicMeta, error) {
	req := kmsg.NewPtrMetadataRequest()
	brokers := cl.DiscoveredBrokers()
	for _, b := range brokers[:min(3, len(brokers))] {
		if resp, err := req.RequestWith(ctx, b); err == nil {
			return topicsOf(resp), nil
		} else if ctx.Err() != nil {
			return nil, err
		}
	}
	return listTopics(ctx, cl) // none known yet, or none answered: the client's retries
}

func topicsOf(resp *kmsg.MetadataResponse) map[string]topicMeta {
	out := make(map[string]topicMeta, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic == nil || t.ErrorCode != 0 {
			continue
		}
		out[*t.Topic] = topicMeta{id: t.TopicID, internal: t.IsInternal, partitions: int32(len(t.Partitions))}
	}
	return out
}

// wantConfigs returns the configs a standby topic should have: the
// source's dynamic topic configs that carry over, and standbyConfigs.
func wantConfigs(src []kadm.Config) map[string]string {
	want := make(map[string]string)
	for _, c := range src {
		if c.Source == kmsg.ConfigSourceDynamicTopicConfig && c.Value != nil && carried(c.Key) {
			want[c.Key] = *c.Value
		}
	}
	for k, v := range standbyConfigs {
		want[k] = v
	}
	return want
}

// alterConfigs sets the standby topic's configs that differ from want, and
// removes carried dynamic configs the source no longer has.
func (m *Mirror) alterConfigs(ctx context.Context, topic string, want map[string]string, dstCfgs kadm.ResourceConfigs) error {
	var have []kadm.Config
	for _, rc := range dstCfgs {
		if rc.Name == topic {
			have = rc.Configs
		}
	}
	haveDyn := make(map[string]string)
	for _, c := range have {
		if c.Source == kmsg.ConfigSourceDynamicTopicConfig && c.Value != nil {
			haveDyn[c.Key] = *c.Value
		}
	}
	var alter []kadm.AlterConfig
	for k, v := range want {
		if hv, ok := haveDyn[k]; !ok || hv != v {
			alter = append(alter, kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: kmsg.StringPtr(v)})
		}
	}
	for k := range haveDyn {
		if _, ok := want[k]; !ok && carried(k) {
			alter = append(alter, kadm.AlterConfig{Op: kadm.DeleteConfig, Name: k})
		}
	}
	if len(alter) == 0 {
		return nil
	}
	resps, err := m.dstAdm.AlterTopicConfigs(ctx, alter, topic)
	if err == nil {
		for _, r := range resps {
			if r.Err != nil {
				err = r.Err
			}
		}
	}
	if err != nil {
		return fmt.Errorf("altering standby topic %s configs: %w", topic, err)
	}
	m.log.Info("standby topic configs updated", zap.String("topic", topic), zap.Int("changes", len(alter)))
	return nil
}

// syncGroups copies committed offsets of the selected groups. A group with
// members on the standby is left alone (someone consumes there and owns
// its offsets) unless evict is set: then its members are removed first.
// The switchover evicts: with every client held behind Ferry, members on
// the standby are ones left from before an earlier switch, whose sessions
// have not expired yet, and their group would refuse the copy.
//
// Offsets are clamped to the standby's end offsets read from the cluster,
// not to what this member's writers have mirrored: with WithOwnership the
// other members' writers mirror the rest of the partitions.
func (m *Mirror) syncGroups(ctx context.Context, evict bool) error {
	// A switch (evict) reads the two clusters at once, and the standby's
	// two reads below too: a standby a region away costs a round trip per
	// read, with a switch's writes held. The periodic round reads the
	// source first, and the standby only for the groups whose source
	// offsets moved since it last found them in sync (groupsInSync).
	var srcGroups, dstGroups kadm.ListedGroups
	var srcErr, dstErr error
	var wg sync.WaitGroup
	wg.Go(func() { srcGroups, srcErr = m.srcAdm.ListGroups(ctx) })
	if evict {
		wg.Go(func() { dstGroups, dstErr = m.dstAdm.ListGroups(ctx) })
	}
	wg.Wait()
	if srcErr != nil {
		return fmt.Errorf("listing source groups: %w", srcErr)
	}
	if dstErr != nil {
		return fmt.Errorf("listing standby groups: %w", dstErr)
	}
	// Share groups alongside (share_groups.go).
	var shareErr error
	shared := make(chan struct{})
	go func() {
		defer close(shared)
		shareErr = m.shareGroupsRound(ctx, srcGroups, dstGroups, evict)
	}()
	err := m.syncOffsetGroups(ctx, evict, srcGroups, dstGroups)
	<-shared
	return errors.Join(err, shareErr)
}

// syncOffsetGroups is syncGroups for the groups that commit offsets
// (classic and consumer groups), from the groups listed on each side
// (dstGroups: only when evict).
func (m *Mirror) syncOffsetGroups(ctx context.Context, evict bool, srcGroups, dstGroups kadm.ListedGroups) error {
	var dstErr error
	var wg sync.WaitGroup
	var groups []string
	for _, g := range srcGroups.Sorted() {
		if m.cfg.mirrorGroup(g.Group) && g.GroupType != "share" {
			groups = append(groups, g.Group)
		}
	}
	if len(groups) == 0 {
		return nil
	}
	// Every group's offsets in one OffsetFetch per coordinator on each
	// side, and the standby's end offsets of every topic they name in one
	// ListOffsets per broker: a request per group or topic made a switch
	// with a thousand groups take seconds with writes held.
	var errs []error // appended to under mu
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	var src, dst kadm.FetchOffsetsResponses
	if evict {
		wg.Go(func() { dst = m.dstAdm.FetchManyOffsets(ctx, groups...) })
		src = m.srcAdm.FetchManyOffsets(ctx, groups...)
	} else {
		src = m.srcAdm.FetchManyOffsets(ctx, groups...)
		if groups = m.inSync.changed(groups, src); len(groups) == 0 {
			return nil
		}
		if dstGroups, dstErr = m.dstAdm.ListGroups(ctx); dstErr != nil {
			return fmt.Errorf("listing standby groups: %w", dstErr)
		}
		groups = slices.DeleteFunc(groups, func(g string) bool {
			return activeOn(dstGroups, g) // its members own the offsets there
		})
		if len(groups) == 0 {
			return nil
		}
		wg.Go(func() { dst = m.dstAdm.FetchManyOffsets(ctx, groups...) })
	}
	active := map[string]string{} // group → its type, for those with members on the standby
	if evict {
		for _, g := range groups {
			if activeOn(dstGroups, g) {
				active[g] = dstGroups[g].GroupType
			}
		}
	}
	named := map[topicPartition]bool{}
	parts := map[string][]int32{}
	for _, g := range groups {
		r, ok := src[g]
		if !ok || r.Err != nil {
			continue
		}
		r.Fetched.Each(func(o kadm.OffsetResponse) {
			tp := topicPartition{o.Topic, o.Partition}
			if !named[tp] && m.cfg.mirrorTopic(o.Topic, false) {
				named[tp] = true
				parts[o.Topic] = append(parts[o.Topic], o.Partition)
			}
		})
	}
	var ends kadm.ListedOffsets
	if len(parts) > 0 {
		var err error
		ends, err = ListEnds(ctx, m.dst, parts, false)
		if err = cmp.Or(err, ListedError(ends)); err != nil {
			// Its groups' offsets are not copied: a switch must not
			// go on without them.
			fail(fmt.Errorf("standby end offsets: %w", err))
		}
	}
	wg.Wait()

	var eg errgroup.Group
	eg.SetLimit(groupSyncParallel)
	for _, g := range groups {
		r := src[g]
		if r.Err != nil {
			fail(fmt.Errorf("fetching offsets of group %s: %w", g, r.Err)) // commits of earlier groups run meanwhile
			continue
		}
		commit := make(kadm.Offsets)
		whole := true // every source offset as it is on the source
		r.Fetched.Each(func(o kadm.OffsetResponse) {
			if o.Err != nil || o.At < 0 {
				whole = whole && o.Err == nil
				return
			}
			end, ok := ends.Lookup(o.Topic, o.Partition)
			if !ok || end.Err != nil {
				whole = false
				return // not mirrored (yet)
			}
			whole = whole && o.At <= end.Offset
			commit.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: min(o.At, end.Offset), LeaderEpoch: -1, Metadata: o.Metadata})
		})
		if len(commit) == 0 {
			continue
		}
		groupType, isActive := active[g]
		if have, ok := dst[g]; ok && have.Err == nil && !isActive && sameOffsets(have.Fetched, commit) {
			if whole && !evict {
				m.inSync.mark(g, r.Fetched)
			}
			continue
		}
		eg.Go(func() error {
			if isActive {
				if err := m.evictMembers(ctx, g, groupType); err != nil {
					fail(fmt.Errorf("removing the members of group %s from the standby: %w", g, err))
					return nil
				}
				if have, err := m.dstAdm.FetchOffsets(ctx, g); err == nil && sameOffsets(have, commit) {
					return nil
				}
			}
			if !evict && !m.groupSyncOpen() {
				return nil // the switch copies them itself (evict)
			}
			resp, err := m.dstAdm.CommitOffsets(ctx, g, commit)
			if err == nil {
				err = resp.Error()
			}
			level := zap.DebugLevel
			if evict {
				level = zap.InfoLevel // once per group and switch: what its members resume at
			}
			if ce := m.log.Check(level, "copied a group's committed offsets"); ce != nil {
				ce.Write(zap.String("group", g), zap.Bool("switch", evict), zap.Any("offsets", commitAts(commit)), zap.Error(err))
			}
			if err != nil {
				fail(fmt.Errorf("committing offsets of group %s on the standby: %w", g, err))
			} else if whole && !evict {
				m.inSync.mark(g, r.Fetched)
			}
			return nil
		})
	}
	eg.Wait()
	return errors.Join(errs...)
}

// groupsInSync are the groups the periodic group sync found in sync: the
// standby held (or took) the source's offsets, none clamped to a standby
// end. A round reads the standby's offsets and ends only for the other
// groups and those whose source offsets moved since (compared by a sum of
// hashes), so that a thousand idle groups cost one OffsetFetch per
// coordinator on the source. Every groupFullSyncRounds-th round compares
// every group, as does every switch (syncGroups with evict), whatever
// changed on the standby meanwhile.
type groupsInSync struct {
	mu    sync.Mutex
	seed  maphash.Seed
	sums  map[string]uint64
	round int
}

// groupFullSyncRounds: one periodic group sync in this many compares
// every group with the standby (a minute at the 5 s sync interval).
const groupFullSyncRounds = 12

// changed returns the groups of this round to compare with the standby.
func (s *groupsInSync) changed(groups []string, src kadm.FetchOffsetsResponses) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.round++; s.round%groupFullSyncRounds == 1 || s.sums == nil {
		s.seed = maphash.MakeSeed()
		s.sums = make(map[string]uint64)
		return groups
	}
	out := groups[:0:0]
	for _, g := range groups {
		r, ok := src[g]
		if sum, in := s.sums[g]; ok && r.Err == nil && in && sum == s.sum(r.Fetched) {
			continue
		}
		delete(s.sums, g)
		out = append(out, g)
	}
	return out
}

// mark records a group found or put in sync with these source offsets.
func (s *groupsInSync) mark(group string, src kadm.OffsetResponses) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sums != nil {
		s.sums[group] = s.sum(src)
	}
}

// sum hashes a group's offsets, in no order.
func (s *groupsInSync) sum(r kadm.OffsetResponses) uint64 {
	var sum uint64
	r.Each(func(o kadm.OffsetResponse) {
		errored := o.Err != nil
		sum += maphash.Comparable(s.seed, struct {
			topic     string
			partition int32
			at        int64
			metadata  string
			errored   bool
		}{o.Topic, o.Partition, o.At, o.Metadata, errored})
	})
	return sum
}

// activeOn reports whether group has members on the cluster listed.
func activeOn(listed kadm.ListedGroups, group string) bool {
	d, ok := listed[group]
	return ok && d.State != "" && d.State != "Empty" && d.State != "Dead"
}

// groupSyncParallel bounds the groups whose offsets are committed on the
// standby at once (an OffsetCommit names one group).
const groupSyncParallel = 16

// commitAts is commit as topic → partition → offset, for a log line.
func commitAts(commit kadm.Offsets) map[string]map[int32]int64 {
	out := make(map[string]map[int32]int64, len(commit))
	commit.Each(func(o kadm.Offset) {
		if out[o.Topic] == nil {
			out[o.Topic] = map[int32]int64{}
		}
		out[o.Topic][o.Partition] = o.At
	})
	return out
}

// evictMembers removes every member of a group on the standby, so that the
// group is empty and takes the offsets copied to it: members of a KIP-848
// consumer group leave through a heartbeat with epoch -1 sent in their
// name (LeaveGroup removes only members speaking the classic protocol,
// and the group refuses an admin's commit while it has any), then every
// member left is named in a LeaveGroup, as kafka-consumer-groups
// --delete-members does.
func (m *Mirror) evictMembers(ctx context.Context, group string, groupType string) error {
	n := 0
	switch groupType {
	case "consumer":
		k, err := m.evictConsumerMembers(ctx, group)
		if err != nil {
			return err
		}
		n += k
	case "streams":
		k, err := m.evictStreamsMembers(ctx, group)
		if err != nil {
			return err
		}
		n += k
	}
	k, err := m.evictClassicMembers(ctx, group)
	if err != nil {
		return err
	}
	if n += k; n > 0 {
		m.log.Info("removed stale members from a group on the standby before copying its offsets", zap.String("group", group), zap.Int("members", n))
	}
	return nil
}

// evictClassicMembers makes every classic-protocol member of a group on the
// standby leave (LeaveGroup naming them), and returns how many did.
func (m *Mirror) evictClassicMembers(ctx context.Context, group string) (int, error) {
	described, err := m.dstAdm.DescribeGroups(ctx, group)
	if err != nil {
		return 0, err
	}
	d, ok := described[group]
	if !ok || len(d.Members) == 0 {
		return 0, nil
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	for _, mem := range d.Members {
		lm := kmsg.NewLeaveGroupRequestMember()
		lm.MemberID = mem.MemberID
		lm.InstanceID = mem.InstanceID
		reason := evictReason
		lm.Reason = &reason
		req.Members = append(req.Members, lm)
	}
	resp, err := req.RequestWith(ctx, m.dst)
	if err != nil {
		return 0, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, err
	}
	for _, mem := range resp.Members {
		if err := kerr.ErrorForCode(mem.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
			return 0, fmt.Errorf("member %s: %w", mem.MemberID, err)
		}
	}
	return len(d.Members), nil
}

const evictReason = "ferry switchover: member left from before an earlier switch"

// evictConsumerMembers makes every KIP-848 member of a consumer group on
// the standby leave, and returns how many did.
func (m *Mirror) evictConsumerMembers(ctx context.Context, group string) (int, error) {
	dreq := kmsg.NewPtrConsumerGroupDescribeRequest()
	dreq.Groups = []string{group}
	dresp, err := dreq.RequestWith(ctx, m.dst)
	if err != nil {
		return 0, err
	}
	return evictByHeartbeat(dresp.Groups,
		func(g kmsg.ConsumerGroupDescribeResponseGroup) (int16, []kmsg.ConsumerGroupDescribeResponseGroupMember) {
			var kip848 []kmsg.ConsumerGroupDescribeResponseGroupMember
			for _, mem := range g.Members {
				if mem.MemberType == 0 { // classic protocol (v1+): LeaveGroup removes it
					continue
				}
				kip848 = append(kip848, mem)
			}
			return g.ErrorCode, kip848
		},
		func(mem kmsg.ConsumerGroupDescribeResponseGroupMember) (string, int16, error) {
			hb := kmsg.NewPtrConsumerGroupHeartbeatRequest()
			hb.Group, hb.MemberID, hb.InstanceID, hb.MemberEpoch = group, mem.MemberID, mem.InstanceID, -1
			resp, err := hb.RequestWith(ctx, m.dst)
			if err != nil {
				return mem.MemberID, 0, err
			}
			return mem.MemberID, resp.ErrorCode, nil
		})
}

// evictStreamsMembers makes every member of a Kafka Streams group
// (KIP-1071) on the standby leave, a StreamsGroupHeartbeat with epoch -1 in
// each one's name, and returns how many did.
func (m *Mirror) evictStreamsMembers(ctx context.Context, group string) (int, error) {
	// franz-go does not route these to the group's coordinator itself.
	co, ok := m.dstAdm.FindGroupCoordinators(ctx, group)[group]
	if !ok || co.Err != nil {
		return 0, fmt.Errorf("the coordinator of group %s: %v", group, co.Err)
	}
	coordinator := m.dst.Broker(int(co.NodeID))
	dreq := kmsg.NewPtrStreamsGroupDescribeRequest()
	dreq.Groups = []string{group}
	dresp, err := dreq.RequestWith(ctx, coordinator)
	if err != nil {
		return 0, err
	}
	return evictByHeartbeat(dresp.Groups,
		func(g kmsg.StreamsGroupDescribeResponseGroup) (int16, []kmsg.StreamsGroupDescribeResponseGroupMember) {
			return g.ErrorCode, g.Members
		},
		func(mem kmsg.StreamsGroupDescribeResponseGroupMember) (string, int16, error) {
			hb := kmsg.NewPtrStreamsGroupHeartbeatRequest()
			hb.Group, hb.MemberID, hb.InstanceID, hb.MemberEpoch = group, mem.MemberID, mem.InstanceID, -1
			resp, err := hb.RequestWith(ctx, coordinator)
			if err != nil {
				return mem.MemberID, 0, err
			}
			return mem.MemberID, resp.ErrorCode, nil
		})
}

// evictByHeartbeat makes members of a KIP-848 consumer group or a share
// group on the standby leave, one heartbeat with epoch -1 in each one's
// name, and returns how many did. groups is the standby's describe answer
// for the group; members reads a described group's error code and the
// members to remove; leave sends one member's heartbeat and returns the
// member's ID and the answer's error code. A group the standby does not
// know has no member to remove, and a member it does not know has left.
func evictByHeartbeat[G, M any](groups []G, members func(G) (int16, []M), leave func(M) (string, int16, error)) (int, error) {
	n := 0
	for _, g := range groups {
		code, mems := members(g)
		if err := kerr.ErrorForCode(code); err != nil {
			if errors.Is(err, kerr.GroupIDNotFound) {
				return 0, nil // gone, or (a consumer group) classic after all
			}
			return 0, err
		}
		for _, mem := range mems {
			id, code, err := leave(mem)
			if err != nil {
				return n, err
			}
			if err := kerr.ErrorForCode(code); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
				return n, fmt.Errorf("member %s: %w", id, err)
			}
			n++
		}
	}
	return n, nil
}

func sameOffsets(have kadm.OffsetResponses, want kadm.Offsets) bool {
	for t, ps := range want {
		for p, o := range ps {
			h, ok := have.Lookup(t, p)
			if !ok || h.Err != nil || h.At != o.At {
				return false
			}
		}
	}
	return true
}

// syncACLs creates every source ACL on the standby. A cluster without an
// authorizer answers SECURITY_DISABLED, which ends the step quietly.
func (m *Mirror) syncACLs(ctx context.Context) error {
	req := kmsg.NewPtrDescribeACLsRequest()
	req.ResourceType = kmsg.ACLResourceTypeAny
	req.ResourcePatternType = kmsg.ACLResourcePatternTypeAny
	req.Operation = kmsg.ACLOperationAny
	req.PermissionType = kmsg.ACLPermissionTypeAny
	resp, err := req.RequestWith(ctx, m.src)
	if err != nil {
		return fmt.Errorf("describing source ACLs: %w", err)
	}
	if resp.ErrorCode == kerr.SecurityDisabled.Code {
		return nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("describing source ACLs: %w", err)
	}
	have, err := m.describeACLs(ctx)
	if err != nil {
		return err
	}
	create := kmsg.NewPtrCreateACLsRequest()
	for _, r := range resp.Resources {
		for _, a := range r.ACLs {
			key := aclKey(r.ResourceType, r.ResourceName, r.ResourcePatternType, a.Principal, a.Host, a.Operation, a.PermissionType)
			if have[key] {
				continue
			}
			c := kmsg.NewCreateACLsRequestCreation()
			c.ResourceType = r.ResourceType
			c.ResourceName = r.ResourceName
			c.ResourcePatternType = r.ResourcePatternType
			c.Principal = a.Principal
			c.Host = a.Host
			c.Operation = a.Operation
			c.PermissionType = a.PermissionType
			create.Creations = append(create.Creations, c)
		}
	}
	if len(create.Creations) == 0 {
		return nil
	}
	cresp, err := create.RequestWith(ctx, m.dst)
	if err != nil {
		return fmt.Errorf("creating standby ACLs: %w", err)
	}
	var errs []error
	for _, r := range cresp.Results {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil && !errors.Is(err, kerr.SecurityDisabled) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		m.log.Info("standby ACLs created", zap.Int("count", len(create.Creations)))
	}
	return errors.Join(errs...)
}

func (m *Mirror) describeACLs(ctx context.Context) (map[string]bool, error) {
	req := kmsg.NewPtrDescribeACLsRequest()
	req.ResourceType = kmsg.ACLResourceTypeAny
	req.ResourcePatternType = kmsg.ACLResourcePatternTypeAny
	req.Operation = kmsg.ACLOperationAny
	req.PermissionType = kmsg.ACLPermissionTypeAny
	resp, err := req.RequestWith(ctx, m.dst)
	if err != nil {
		return nil, fmt.Errorf("describing standby ACLs: %w", err)
	}
	have := make(map[string]bool)
	if resp.ErrorCode == kerr.SecurityDisabled.Code {
		return have, nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("describing standby ACLs: %w", err)
	}
	for _, r := range resp.Resources {
		for _, a := range r.ACLs {
			have[aclKey(r.ResourceType, r.ResourceName, r.ResourcePatternType, a.Principal, a.Host, a.Operation, a.PermissionType)] = true
		}
	}
	return have, nil
}

func aclKey(rt kmsg.ACLResourceType, name string, pt kmsg.ACLResourcePatternType, principal, host string, op kmsg.ACLOperation, perm kmsg.ACLPermissionType) string {
	return strings.Join([]string{strconv.Itoa(int(rt)), name, strconv.Itoa(int(pt)), principal, host,
		strconv.Itoa(int(op)), strconv.Itoa(int(perm))}, "\x00")
}
