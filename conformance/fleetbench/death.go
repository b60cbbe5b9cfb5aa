package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// sent is one produced record: when it was produced, its partition, and
// when its acknowledgement (or failure) came.
type sent struct {
	at, acked time.Time
	partition int32
	err       error
}

// producer is one franz-go client producing a keyed record every interval
// through the fleet.
type producer struct {
	name      string
	cl        *kgo.Client // franz-go; nil for the Java producer
	mu        sync.Mutex
	rs        []*sent
	leaderMap map[int32]int32 // the Java producer's metadata, as it last printed it
}

func (p *producer) snapshot() []sent {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]sent, len(p.rs))
	for i, r := range p.rs {
		out[i] = *r
	}
	return out
}

// deathRound is one kill -9 of a member under the producers.
type deathRound struct {
	victim        int32
	led           int             // partitions the victim led, in the producers' view at the kill (union)
	recovered     time.Duration   // kill → every franz-go producer acknowledged again (the slowest)
	each          []time.Duration // each franz-go producer
	java          time.Duration   // the Java producer (-1: none ran)
	views         string          // partitions each member led, in each producer's metadata at the kill
	distinctViews string          // the same, once per distinct view
	aliveAfter    time.Duration   // the victim's restart → every member's /status lists three alive
	metadataAfter time.Duration   // the victim's restart → Metadata through every member names all three
	lagging       string          // whose Metadata lacked whom in between
	mirrorAfter   time.Duration   // the victim's restart → the fleet's mirror caught up (writers handed back)
	gone          time.Duration   // kill → both survivors' gossip no longer lists the victim alive
	errs          int             // records that failed (none expected: delivery is retried)
	worst         time.Duration   // the longest any record waited for its ack, of those sent around the kill
}

// variant is a set of client settings the death rounds run with.
type variant struct {
	name     string
	opts     []kgo.Opt
	desc     string
	java     []string // the Java producer's settings
	javaDesc string
}

func (b *bench) variants() []variant {
	lowered := b.o.maxAge
	minAge := min(5*time.Second, lowered)
	return []variant{
		{name: "default", desc: "franz-go defaults: metadata max age 5m, min age 5s",
			javaDesc: "kafka-clients defaults (metadata.max.age.ms 300000)"},
		{name: "lowered", opts: []kgo.Opt{kgo.MetadataMaxAge(lowered), kgo.MetadataMinAge(minAge)},
			desc:     fmt.Sprintf("kgo.MetadataMaxAge(%v), kgo.MetadataMinAge(%v) (franz-go refuses a max age below the min age, 5s by default)", lowered, minAge),
			java:     []string{fmt.Sprintf("metadata.max.age.ms=%d", lowered.Milliseconds())},
			javaDesc: fmt.Sprintf("metadata.max.age.ms=%d, defaults otherwise", lowered.Milliseconds())},
	}
}

func (b *bench) startProducers(ctx context.Context, topic string, v variant) ([]*producer, func(), error) {
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var ps []*producer
	var stopJava func()
	stop := func() {
		cancel()
		wg.Wait()
		for _, p := range ps {
			if p.cl == nil {
				continue
			}
			fctx, fcancel := context.WithTimeout(context.Background(), 30*time.Second)
			p.cl.Flush(fctx)
			fcancel()
			p.cl.Close()
		}
		if stopJava != nil {
			stopJava()
		}
	}
	opts := v.opts
	for i := range b.o.producers {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.fleet.bootstrap()...), kgo.DefaultProduceTopic(topic)}, opts...)...)
		if err != nil {
			stop()
			return nil, nil, err
		}
		p := &producer{name: fmt.Sprintf("franz-go %d", i), cl: cl}
		ps = append(ps, p)
		wg.Go(func() {
			tick := time.NewTicker(b.o.interval)
			defer tick.Stop()
			for seq := 0; ; seq++ {
				select {
				case <-pctx.Done():
					return
				case <-tick.C:
				}
				s := &sent{at: time.Now(), partition: -1}
				p.mu.Lock()
				p.rs = append(p.rs, s)
				p.mu.Unlock()
				rec := &kgo.Record{Key: fmt.Appendf(nil, "p%d-k%d", i, seq%257), Value: fmt.Appendf(nil, "fleetbench producer %d record %d", i, seq)}
				// The record's context is not pctx: records outstanding
				// when the round ends are flushed, not cancelled.
				cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) {
					now := time.Now()
					p.mu.Lock()
					s.acked, s.partition, s.err = now, r.Partition, err
					p.mu.Unlock()
				})
			}
		})
	}
	if b.javaCP != "" {
		p, st, err := b.startJava(ctx, topic, v.java)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("the Java producer: %w", err)
		}
		ps, stopJava = append(ps, p), st
	}
	return ps, stop, nil
}

// laneStride is proxy's: a member's virtual brokers (its lanes) are
// node_id × 1000 + lane.
const laneStride = 1000

// leaders is the victim's partitions of topic in producer p's metadata.
func leaders(p *producer, topic string, partitions int, victim int32) []int32 {
	var out []int32
	for part := range int32(partitions) {
		if l, ok := p.leader(topic, part); ok && l >= 0 && l/laneStride == victim {
			out = append(out, part)
		}
	}
	return out
}

// leader is partition part's leader in p's metadata.
func (p *producer) leader(topic string, part int32) (int32, bool) {
	if p.cl != nil {
		l, _, err := p.cl.PartitionLeader(topic, part)
		return l, err == nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.leaderMap[part]
	return l, ok
}

// measureDeath runs the death rounds of variant v: fresh producers, warm,
// then kill -9 of one member (in turn), until every producer is
// acknowledged again; then the member is restarted and the fleet waited
// for.
func (b *bench) measureDeath(ctx context.Context, v variant, topic string) error {
	for r := range b.o.rounds {
		victim := b.fleet.members[r%len(b.fleet.members)]
		ps, stop, err := b.startProducers(ctx, topic, v)
		if err != nil {
			return err
		}
		dr, err := b.deathRound(ctx, ps, topic, victim)
		stop()
		if err != nil {
			return fmt.Errorf("%s round %d: %w", v.name, r+1, err)
		}
		for _, p := range ps {
			for _, s := range p.snapshot() {
				if s.err != nil {
					dr.errs++
				}
			}
		}
		b.cur.deaths[v.name] = append(b.cur.deaths[v.name], dr)
		step("death (%s) %d: leaders by member at the kill: %s", v.name, r+1, dr.views)
		step("death (%s) %d: kill -9 of member %d (leading %d partitions): every franz-go producer acknowledged again %v after the kill (each: %v; Java: %v); survivors stopped listing it alive after %v; longest ack wait %v; %d records failed",
			v.name, r+1, victim.id, dr.led, ms2(dr.recovered), durs(dr.each), ms2(dr.java), ms2(dr.gone), ms2(dr.worst), dr.errs)
		restarted := time.Now()
		if err := b.fleet.start(victim, b.fleet.allSeeds()); err != nil {
			return err
		}
		if err := b.fleet.waitAlive(ctx, b.fleet.ids()...); err != nil {
			return err
		}
		alive := time.Now()
		lagging, err := b.waitMetadata(ctx)
		if err != nil {
			return err
		}
		rs := &b.cur.deaths[v.name][len(b.cur.deaths[v.name])-1]
		rs.aliveAfter, rs.metadataAfter, rs.lagging = alive.Sub(restarted), time.Since(restarted), lagging
		if lagging != "" {
			step("death (%s) %d: after the restart every member's /status listed all alive %v after the start, but %s; every member's Metadata named them all %v after the start",
				v.name, r+1, ms2(rs.aliveAfter), lagging, ms2(rs.metadataAfter))
		}
		// The next kill with the restarted member's writers handed back
		// and caught up, not still starting.
		if _, _, err := b.waitCaughtUp(ctx, 5*time.Minute); err != nil {
			return fmt.Errorf("%s round %d, after the restart: %w", v.name, r+1, err)
		}
		rs.mirrorAfter = time.Since(restarted)
		step("death (%s) %d: the fleet's mirror caught up %v after the restart", v.name, r+1, ms2(rs.mirrorAfter))
	}
	return nil
}

// waitMetadata waits until a Metadata request through each member names
// every member's broker, and says which members' answers lacked whom
// before ("" if none did).
func (b *bench) waitMetadata(ctx context.Context) (string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	var lagging []string
	for {
		ok := true
		for _, m := range b.fleet.members {
			ids, err := metadataMembers(ctx, m)
			if err == nil && len(ids) == len(b.fleet.members) {
				continue
			}
			ok = false
			what := fmt.Sprintf("member %d's Metadata named members %v", m.id, ids)
			if err != nil {
				what = fmt.Sprintf("member %d's Metadata failed: %v", m.id, err)
			}
			if !slices.Contains(lagging, what) {
				lagging = append(lagging, what)
			}
		}
		if ok {
			return strings.Join(lagging, "; "), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("Metadata through the members did not name them all within 2 minutes: %s", strings.Join(lagging, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// metadataMembers is the members whose brokers a Metadata request through
// m names.
func metadataMembers(ctx context.Context, m *member) ([]int32, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(m.kafka))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).BrokerMetadata(mctx)
	if err != nil {
		return nil, err
	}
	var ids []int32
	for _, br := range md.Brokers {
		if id := br.NodeID / laneStride; !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

func (b *bench) deathRound(ctx context.Context, ps []*producer, topic string, victim *member) (deathRound, error) {
	dr := deathRound{victim: victim.id}
	// Warm: every producer has had records acknowledged on every
	// partition, and none has a record waiting longer than a second.
	deadline := time.Now().Add(time.Minute)
	for {
		time.Sleep(100 * time.Millisecond)
		ok := true
		for _, p := range ps {
			parts := map[int32]bool{}
			for _, s := range p.snapshot() {
				if s.err != nil {
					return dr, fmt.Errorf("a record failed before the kill: %w", s.err)
				}
				if s.acked.IsZero() && time.Since(s.at) > time.Second {
					ok = false
				}
				if !s.acked.IsZero() {
					parts[s.partition] = true
				}
			}
			ok = ok && len(parts) == b.o.partitions
		}
		if ok {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return dr, errors.New("the producers were not all acknowledged on every partition within a minute")
		}
	}
	time.Sleep(2 * time.Second)
	// Which partitions the victim leads in each producer's view.
	led := make([][]int32, len(ps))
	union := map[int32]bool{}
	for i, p := range ps {
		led[i] = leaders(p, topic, b.o.partitions, victim.id)
		if len(led[i]) == 0 {
			var all []string
			for part := range int32(b.o.partitions) {
				l, ok := p.leader(topic, part)
				all = append(all, fmt.Sprintf("%d:%d(%v)", part, l, ok))
			}
			return dr, fmt.Errorf("member %d leads no partition of %s in %s's metadata: %v", victim.id, topic, p.name, all)
		}
		for _, part := range led[i] {
			union[part] = true
		}
	}
	dr.led = len(union)
	// Each producer's leaders by member, as it saw them at the kill.
	var views, distinct []string
	for _, p := range ps {
		count := map[int32]int{}
		for part := range int32(b.o.partitions) {
			if l, ok := p.leader(topic, part); ok {
				count[l/laneStride]++
			}
		}
		var v []string
		for id := range int32(len(b.fleet.members)) {
			v = append(v, fmt.Sprintf("%d:%d", id, count[id]))
		}
		view := strings.Join(v, " ")
		views = append(views, fmt.Sprintf("%s %s", p.name, view))
		if !slices.Contains(distinct, view) {
			distinct = append(distinct, view)
		}
	}
	dr.views = strings.Join(views, "; ")
	dr.distinctViews = strings.Join(distinct, "; ")

	// The survivors' gossip, watched from their /metrics.
	var survivors []*member
	for _, m := range b.fleet.members {
		if m != victim {
			survivors = append(survivors, m)
		}
	}
	goneCh := make(chan time.Time, 1)
	gctx, gcancel := context.WithTimeout(ctx, time.Minute)
	defer gcancel()
	go func() {
		for gctx.Err() == nil {
			n := 0
			for _, m := range survivors {
				if v, err := b.fleet.metric(gctx, m, `ferry_fleet_members{state="alive"}`); err == nil && int(v) == len(survivors) {
					n++
				}
			}
			if n == len(survivors) {
				goneCh <- time.Now()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	killed := victim.kill()
	deadline = killed.Add(2 * time.Minute)
	for {
		time.Sleep(10 * time.Millisecond)
		done := true
		dr.each = dr.each[:0]
		dr.java = -1
		for i, p := range ps {
			rec, ok := recoveredAt(p.snapshot(), killed, led[i])
			done = done && ok
			if p.cl == nil {
				dr.java = rec.Sub(killed)
			} else {
				dr.each = append(dr.each, rec.Sub(killed))
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return dr, fmt.Errorf("the producers were not all acknowledged again within 2 minutes of the kill of member %d (franz-go: %v, Java: %v)", victim.id, durs(dr.each), ms2(dr.java))
		}
	}
	dr.recovered = slices.Max(dr.each)
	// The longest wait of a record produced from 1 s before the kill to
	// the recovery.
	end := killed.Add(dr.recovered)
	for _, p := range ps {
		for _, s := range p.snapshot() {
			if s.at.After(killed.Add(-time.Second)) && !s.at.After(end) && !s.acked.IsZero() {
				dr.worst = max(dr.worst, s.acked.Sub(s.at))
			}
		}
	}
	select {
	case at := <-goneCh:
		dr.gone = at.Sub(killed)
	case <-gctx.Done():
		dr.gone = -1
	}
	return dr, nil
}

// recoveredAt is when a producer was acknowledged again after the kill:
// every record it had produced before the kill acknowledged (those the
// victim had in flight included), and a record it produced after the kill
// to a partition the victim led acknowledged. ok is false until both.
func recoveredAt(rs []sent, killed time.Time, led []int32) (time.Time, bool) {
	var before, after time.Time
	for _, s := range rs {
		if s.at.Before(killed) {
			if s.acked.IsZero() {
				return time.Time{}, false
			}
			if s.acked.After(before) {
				before = s.acked
			}
			continue
		}
		if !s.acked.IsZero() && s.err == nil && slices.Contains(led, s.partition) && (after.IsZero() || s.acked.Before(after)) {
			after = s.acked
		}
	}
	if after.IsZero() {
		return time.Time{}, false
	}
	if before.After(after) {
		return before, true
	}
	return after, true
}

func durs(ds []time.Duration) string {
	var out []string
	for _, d := range ds {
		out = append(out, ms2(d))
	}
	return fmt.Sprint(out)
}

// createTopic creates topic through member m (on the active cluster).
func (b *bench) createTopic(ctx context.Context, m *member, topic string, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(m.kafka))
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	return err
}
