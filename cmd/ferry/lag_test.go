package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// TestLagCoversSourceAcks: the standby stops acknowledging (every Produce
// to it held, then dropped) while producers keep writing to the source, so
// the mirror's writer never fetches again. The lag read in the status (and
// ferry_mirror_lag_records) still covers what the source acknowledged up
// to about one refresh interval ago (the source's ends are listed every
// second), and, the producer stopped more than an interval before, a forced
// switch lists as lost exactly the acknowledged offsets the standby lacks.
func TestLagCoversSourceAcks(t *testing.T) {
	a, b := kfakeCluster(t), kfakeCluster(t)
	cfg := kfakePairConfig(t, a, b, `mirror: {sync_interval: 1s}`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic = "lag"
	if _, err := kadm.NewClient(newClient(t, kgo.SeedBrokers(a.ListenAddrs()...))).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	produceTo(t, a.ListenAddrs(), topic, 0, "r0", "r1", "r2", "r3", "r4")
	reg := prometheus.NewRegistry()
	r := newMirrorRunner(cfg, zaptest.NewLogger(t), reg, nil, nil, nil)
	t.Cleanup(r.Close)
	table := routing.NewTable(routing.State{Active: "a"})
	if err := r.Follow(table.Current()); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitCaughtUp(ctx, topic); err != nil {
		t.Fatal(err)
	}
	status := func() mirror.PartitionStatus {
		for _, p := range r.Info().Partitions {
			if p.Topic == topic && p.Partition == 0 {
				return p
			}
		}
		t.Fatalf("no status for %s[0]: %+v", topic, r.Info().Partitions)
		return mirror.PartitionStatus{}
	}
	testwait.Eventually(t, 10*time.Second, "caught up", func() error {
		if st := status(); st.State != mirror.StateCaughtUp || st.Mirrored != 5 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})

	// From now on the standby accepts nothing: each Produce sleeps until
	// the test releases it, then its connection is closed unanswered.
	release := make(chan struct{})
	var released sync.Once
	t.Cleanup(func() { released.Do(func() { close(release) }) })
	b.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		b.KeepControl()
		b.SleepControl(func() { <-release })
		return nil, errors.New("dropped by the test"), true
	})

	// A producer writes to the source as fast as it is acknowledged.
	var acked atomic.Int64 // the source's end as its acknowledgements say
	acked.Store(5)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		cl := newClient(t, kgo.SeedBrokers(a.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			rec := &kgo.Record{Topic: topic, Partition: 0, Value: fmt.Appendf(nil, "p%d", i)}
			if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			acked.Store(rec.Offset + 1)
			time.Sleep(2 * time.Millisecond)
		}
	})
	time.Sleep(1500 * time.Millisecond)
	// What the source had acknowledged more than an interval ago is in the
	// lag now.
	before := acked.Load()
	time.Sleep(1300 * time.Millisecond)
	st := status()
	if st.SourceEnd < before || st.LagRecords != st.SourceEnd-st.Mirrored || st.State != mirror.StateMirroring {
		t.Fatalf("under traffic: status %+v; the source had acknowledged up to %d more than an interval ago", st, before)
	}
	t.Logf("under traffic: source end %d (acknowledged %d an interval before, %d now), mirrored %d, lag %d; the writer's last fetch saw the source at %d (a lag of %d)",
		st.SourceEnd, before, acked.Load(), st.Mirrored, st.LagRecords, st.SourceStable, st.SourceStable-st.Mirrored)
	close(stop)
	wg.Wait()
	end := acked.Load()

	// The producer stopped: one interval later the lag is exact, in the
	// status and in /metrics.
	time.Sleep(1500 * time.Millisecond)
	st = status()
	bEnd := endOffsets(t, b.ListenAddrs(), topic)[0]
	if st.SourceEnd != end || st.Mirrored != bEnd || st.LagRecords != end-bEnd {
		t.Fatalf("producer stopped: status %+v; want source end %d, mirrored %d (the standby's end), lag %d", st, end, bEnd, end-bEnd)
	}
	if body := metricsText(t, reg); !strings.Contains(body, fmt.Sprintf(`ferry_mirror_lag_records{partition="0",topic="lag"} %d`, end-bEnd)) {
		t.Fatalf("ferry_mirror_lag_records is not %d:\n%s", end-bEnd, body)
	}

	// A forced switch to the standby: the lost range is exactly the
	// acknowledged offsets the standby lacks.
	sw := routing.NewSwitcher(table, routing.Local{Table: table}, switchMirror{r}, nil, []string{"a", "b"}, zaptest.NewLogger(t))
	next, err := sw.Switch(ctx, routing.Request{To: "b", Mode: routing.Forced})
	if err != nil {
		t.Fatal(err)
	}
	released.Do(func() { close(release) })
	bAfter := endOffsets(t, b.ListenAddrs(), topic)[0]
	want := []routing.LostRange{{Topic: topic, Partition: 0, From: bAfter, To: end}}
	if fmt.Sprint(next.Last.Lost) != fmt.Sprint(want) || bAfter != bEnd {
		t.Fatalf("forced switch lost %+v, want %+v (the standby ends at %d, the source acknowledged up to %d)", next.Last.Lost, want, bAfter, end)
	}
	t.Logf("forced switch: lost %+v; the source acknowledged %d offsets the standby lacks", next.Last.Lost, end-bAfter)
}

// metricsText is reg's exposition, one sample a line, as
// `name{labels} value`.
func metricsText(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			fmt.Fprintf(&b, "%s{%s} %v\n", mf.GetName(), strings.Join(ls, ","), v)
		}
	}
	return b.String()
}
