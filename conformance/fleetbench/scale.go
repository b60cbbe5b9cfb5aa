package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/admin"
)

// idleTopicPartitions is the partitions of each idle topic.
const idleTopicPartitions = 10

func idleTopic(i int) string { return fmt.Sprintf("fleetbench-idle-%05d", i) }

// shape is the gossip and death phases measured with a number of idle
// partitions mirrored.
type shape struct {
	idle     int           // idle partitions
	mirrored int           // partitions the fleet's mirror listed, caught up, before the phases
	grow     time.Duration // the growth began → the mirror listed them all caught up
	memStart memUse        // after the growth
	memEnd   memUse        // after the phases
	switches []switchRound
	deaths   map[string][]deathRound // variant → rounds
}

// memUse is each member's resident set and open descriptors.
type memUse struct {
	rss []int64 // bytes, -1 when not read
	fds []int
}

func (m memUse) String() string {
	var out []string
	for i := range m.rss {
		out = append(out, fmt.Sprintf("member %d %d MiB, %d fds", i, m.rss[i]>>20, m.fds[i]))
	}
	return strings.Join(out, "; ")
}

// maxRSS is the largest member's resident set, in MiB.
func (m memUse) maxRSS() int64 {
	var out int64
	for _, r := range m.rss {
		out = max(out, r>>20)
	}
	return out
}

// memory reads each member's VmRSS from /proc and its open descriptors
// from its /status.
func (b *bench) memory(ctx context.Context) memUse {
	var u memUse
	for _, m := range b.fleet.members {
		rss, fds := int64(-1), -1
		m.mu.Lock()
		cmd := m.cmd
		m.mu.Unlock()
		if cmd != nil && m.running() {
			if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)); err == nil {
				for _, line := range strings.Split(string(raw), "\n") {
					if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
						if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
							rss = kb << 10
						}
					}
				}
			}
			if st, err := b.fleet.status(ctx, m); err == nil && st.Process.FDsOpen != nil {
				fds = *st.Process.FDsOpen
			}
		}
		u.rss, u.fds = append(u.rss, rss), append(u.fds, fds)
	}
	return u
}

// grow creates idle topics on the active cluster directly until there are
// n idle partitions, one record in each partition (so that each is a
// mirrored partition with something to copy), and waits until the fleet's
// mirror lists them all caught up.
func (b *bench) grow(ctx context.Context, n int) error {
	t0 := time.Now()
	want := n / idleTopicPartitions
	if want > b.idleTopics {
		st, err := b.fleet.status(ctx, b.fleet.members[0])
		if err != nil {
			return err
		}
		active := b.primary
		if st.Routing.Active == "standby" {
			active = b.standby
		}
		step("creating %d idle topics of %d partitions on the %s cluster, one record in each partition", want-b.idleTopics, idleTopicPartitions, st.Routing.Active)
		adm, cl, err := adminClient(active.Addrs())
		if err != nil {
			return err
		}
		defer cl.Close()
		// New topics reach the broker's metadata a moment after they are
		// created: unknown topics are retried.
		prod, err := kgo.NewClient(kgo.SeedBrokers(active.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
			kgo.UnknownTopicRetries(-1), kgo.RecordDeliveryTimeout(2*time.Minute))
		if err != nil {
			return err
		}
		defer prod.Close()
		// 100 topics at a time, each step's records produced before the
		// next step's topics are created: 10,000 partitions created at
		// once, while the members' mirror starts a writer for each as it
		// appears, left the records undelivered after 2 minutes.
		for i := b.idleTopics; i < want; i += 100 {
			var names []string
			var recs []*kgo.Record
			for j := i; j < min(i+100, want); j++ {
				names = append(names, idleTopic(j))
				for p := range int32(idleTopicPartitions) {
					recs = append(recs, &kgo.Record{Topic: idleTopic(j), Partition: p, Value: []byte("idle")})
				}
			}
			resps, err := adm.CreateTopics(ctx, idleTopicPartitions, 1, nil, names...)
			if err == nil {
				err = resps.Error()
			}
			if err != nil {
				return fmt.Errorf("creating idle topics: %w", err)
			}
			t := time.Now()
			if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				return fmt.Errorf("a record in each partition of idle topics %d–%d: %w", i, i+len(names)-1, err)
			}
			step("  idle topics %d–%d created, a record in each partition %v after", i, i+len(names)-1, ms2(time.Since(t)))
			b.idleTopics = i + len(names)
		}
	}
	mirrored, _, err := b.waitCaughtUp(ctx, 10*time.Minute)
	if err != nil {
		return err
	}
	b.cur.mirrored, b.cur.grow = mirrored, time.Since(t0)
	b.cur.memStart = b.memory(ctx)
	step("%d idle partitions: the fleet's mirror lists %d partitions caught up, %v after the growth began; members: %s", n, mirrored, ms2(b.cur.grow), b.cur.memStart)
	return nil
}

// waitCaughtUp waits until member 0's /status (the fleet's mirror, merged
// from every live member's answer) lists every idle partition and the
// death phase's topic, none of them starting or halted, and every
// partition caught up; it returns how many partitions were listed and how
// long it waited. A switch restarts
// every writer the other way and a member's restart hands writers back,
// so at thousands of partitions this takes tens of seconds.
func (b *bench) waitCaughtUp(ctx context.Context, within time.Duration) (int, time.Duration, error) {
	start := time.Now()
	deadline := start.Add(within)
	lastLog := start
	for {
		sent := time.Now()
		st, err := b.fleet.status(ctx, b.fleet.members[0])
		took := time.Since(sent)
		idle, death, states := 0, 0, map[string]int{}
		for _, p := range st.Mirror.Partitions {
			states[p.State]++
			if strings.HasPrefix(p.Topic, "fleetbench-idle-") {
				idle++
			}
			if p.Topic == deathTopic {
				death++
			}
		}
		want := b.idleTopics * idleTopicPartitions
		if err == nil && st.Mirror.Summary.AllCaughtUp && idle == want && death == b.deathPartitions && states["starting"] == 0 && states["halted"] == 0 {
			return len(st.Mirror.Partitions), time.Since(start), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, 0, fmt.Errorf("mirror not caught up within %v: running %v, %d partitions (%d of %d idle) by state %v, the most lag %d records; halted: %s (%v)",
				within, st.Mirror.Running, len(st.Mirror.Partitions), idle, want, states, st.Mirror.Summary.MaxLagRecords, halted(st.Mirror), err)
		}
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			step("  waiting for the mirror: %d partitions (%d of %d idle) by state %v; /status answered in %v", len(st.Mirror.Partitions), idle, want, states, ms2(took))
		}
		// At thousands of partitions /status is megabytes gathered from
		// every member: poll no more than a fifth of the time.
		time.Sleep(max(100*time.Millisecond, 4*took))
	}
}

// halted is the first few halted partitions with their errors.
func halted(ms admin.MirrorStatus) string {
	var out []string
	for _, p := range ms.Partitions {
		if p.State == "halted" && len(out) < 3 {
			out = append(out, fmt.Sprintf("%s[%d] on member %d: %s", p.Topic, p.Partition, p.Owner, p.Error))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}
