package mirror

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// switchboard is the ownership of a test's members: owner names the member
// that owns each partition, syncer the one that syncs; set swaps both at
// once and closes the channel of the change.
type switchboard struct {
	mu     sync.Mutex
	owner  func(topic string, partition int32) int
	syncer int
	ch     chan struct{}
}

func newSwitchboard(owner func(string, int32) int, syncer int) *switchboard {
	return &switchboard{owner: owner, syncer: syncer, ch: make(chan struct{})}
}

func (s *switchboard) set(owner func(string, int32) int, syncer int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.owner, s.syncer = owner, syncer
	close(s.ch)
	s.ch = make(chan struct{})
}

func (s *switchboard) member(id int) Ownership { return memberView{s, id} }

type memberView struct {
	s  *switchboard
	id int
}

func (v memberView) Owns(topic string, partition int32) bool {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	return v.s.owner(topic, partition) == v.id
}

func (v memberView) Syncs() bool {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	return v.s.syncer == v.id
}

func (v memberView) Changed() <-chan struct{} {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	return v.s.ch
}

// byParity gives even partitions to member flip%2 and odd ones to the
// other.
func byParity(flip int) func(string, int32) int {
	return func(_ string, p int32) int { return (int(p) + flip) % 2 }
}

func allTo(member int) func(string, int32) int { return func(string, int32) int { return member } }

// metricValue sums the samples of a metric family whose labels include
// the given ones.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, mt := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range mt.GetLabel() {
					if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case mt.GetGauge() != nil:
				sum += mt.GetGauge().GetValue()
			case mt.GetCounter() != nil:
				sum += mt.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// localPartitions lists the partitions of topic whose writers run in m.
func localPartitions(m *Mirror, topic string) []int32 {
	var out []int32
	for _, st := range m.Status() {
		if st.Topic == topic {
			out = append(out, st.Partition)
		}
	}
	return out
}

// wantOwned waits until every member's writers of topic are exactly the
// partitions it owns, and its metrics say so: the gauge of owned partitions
// and the handovers counted so far (gained, lost).
func wantOwned(t *testing.T, d time.Duration, topic string, ms []*Mirror, regs []*prometheus.Registry, want [][]int32, handovers [][2]float64) {
	t.Helper()
	testwait.Eventually(t, d, "writers following the ownership", func() error {
		for i, m := range ms {
			if got := localPartitions(m, topic); !slices.Equal(got, want[i]) {
				return fmt.Errorf("member %d writes %v, owns %v", i, got, want[i])
			}
			if got := metricValue(t, regs[i], "ferry_mirror_partitions_owned"); got != float64(len(want[i])) {
				return fmt.Errorf("member %d: ferry_mirror_partitions_owned %v, want %d", i, got, len(want[i]))
			}
			g := metricValue(t, regs[i], "ferry_mirror_handovers_total", "direction", "gained")
			l := metricValue(t, regs[i], "ferry_mirror_handovers_total", "direction", "lost")
			if g != handovers[i][0] || l != handovers[i][1] {
				return fmt.Errorf("member %d: handovers gained %v lost %v, want %v", i, g, l, handovers[i])
			}
		}
		return nil
	})
}

// TestOwnershipAssign (no Kafka): two members over clusters that do not
// answer. Each runs writers for exactly the partitions it owns; a change of
// ownership stops the lost ones (their state metrics go too) and starts
// the gained ones, on both members, and the metrics count it.
func TestOwnershipAssign(t *testing.T) {
	const topic = "t"
	sb := newSwitchboard(byParity(0), 0)
	var ms []*Mirror
	var regs []*prometheus.Registry
	for i := range 2 {
		reg := prometheus.NewRegistry()
		m, err := New(Source("127.0.0.1:1"), Target("127.0.0.1:1"), SyncInterval(time.Hour),
			WithOwnership(sb.member(i)), Registerer(reg), Logger(zaptest.NewLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		// What a sync round would have learnt: a topic of 4 partitions
		// ready on the standby (the round itself fails: no cluster).
		m.parts[topic] = 4
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = m.Run(context.Background())
		}()
		t.Cleanup(func() {
			m.Close()
			<-done
		})
		ms, regs = append(ms, m), append(regs, reg)
	}
	wantOwned(t, 10*time.Second, topic, ms, regs, [][]int32{{0, 2}, {1, 3}}, [][2]float64{{0, 0}, {0, 0}})

	sb.set(byParity(1), 1)
	wantOwned(t, 10*time.Second, topic, ms, regs, [][]int32{{1, 3}, {0, 2}}, [][2]float64{{2, 2}, {2, 2}})
	// The lost writers' per-partition metrics are gone with them.
	if v := metricValue(t, regs[0], "ferry_mirror_partition_state", "partition", "0"); v != 0 {
		t.Errorf("member 0 still exports a state for partition 0, which it lost: %v", v)
	}
	if n := len(mustGather(t, regs[0], "ferry_mirror_partition_state")); n != 2 {
		t.Errorf("member 0 exports the state of %d partitions, owns 2", n)
	}

	sb.set(allTo(1), 1)
	wantOwned(t, 10*time.Second, topic, ms, regs, [][]int32{nil, {0, 1, 2, 3}}, [][2]float64{{2, 4}, {4, 2}})

	// A topic learnt later is assigned the same way.
	for _, m := range ms {
		m.mu.Lock()
		m.parts["u"] = 2
		m.mu.Unlock()
	}
	sb.set(byParity(0), 0)
	testwait.Eventually(t, 10*time.Second, "the new topic assigned", func() error {
		for i, want := range [][]int32{{0}, {1}} {
			if got := localPartitions(ms[i], "u"); !slices.Equal(got, want) {
				return fmt.Errorf("member %d writes u%v, want u%v", i, got, want)
			}
		}
		return nil
	})
}

func mustGather(t *testing.T, reg *prometheus.Registry, name string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, mt := range mf.GetMetric() {
				out = append(out, mt.String())
			}
		}
	}
	return out
}
