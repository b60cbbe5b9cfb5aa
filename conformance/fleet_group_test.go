package conformance

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A franz-go group consumer (classic protocol, auto-commit) through a fleet
// of three: a planned switch to the standby, then the member that is the
// group's coordinator is killed and a switch back to the primary is asked
// of another member. The group goes on where it committed: it reads every
// acknowledged record, and again no more than the records produced while
// the switch ran. (Before a member of the old cluster was told to rebalance and
// its commits carried, it dropped its partitions without committing and
// read 2,147–2,260 records again here.)
func TestFleetGroupAcrossCoordinatorDeathAndSwitch(t *testing.T) {
	if testing.Short() {
		t.Skip("conformance: real Kafka is not run in -short mode")
	}
	const (
		topic, group = "fleet-group", "fleet-group"
		rate         = 500 // records a second
	)
	bin, primary, standby := startPair(t, "fleet-group-primary", "fleet-group-standby")
	ms := startFerryFleet(t, bin, primary, standby, fleetSize)
	addrs := fleetAddrs(ms)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	adm := kadm.NewClient(client())
	createReadyTopic(ctx, t, adm, topic, 6, 1)

	var mu sync.Mutex
	sent := map[int64]time.Time{} // by sequence: when produced
	acked := map[[2]int64]bool{}  // partition, offset
	read := map[[2]int64]int{}
	tctx, stop := context.WithCancel(ctx)     // the producer
	cctx, stopCons := context.WithCancel(ctx) // the consumer
	prod := client(kgo.DefaultProduceTopic(topic), kgo.RecordDeliveryTimeout(time.Minute))
	var wg, cwg sync.WaitGroup
	defer cwg.Wait()
	defer stopCons()
	defer wg.Wait()
	defer stop()
	wg.Go(func() {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for seq := int64(0); tctx.Err() == nil; seq++ {
			<-tick.C
			mu.Lock()
			sent[seq] = time.Now()
			mu.Unlock()
			prod.Produce(tctx, &kgo.Record{Value: strconv.AppendInt(nil, seq, 10)}, func(r *kgo.Record, err error) {
				if err == nil {
					mu.Lock()
					acked[[2]int64{int64(r.Partition), r.Offset}] = true
					mu.Unlock()
				}
			})
		}
	})
	cons := client(kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	cwg.Go(func() {
		for cctx.Err() == nil {
			cons.PollFetches(cctx).EachRecord(func(r *kgo.Record) {
				mu.Lock()
				read[[2]int64{int64(r.Partition), r.Offset}]++
				mu.Unlock()
			})
		}
	})
	again := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range read {
			n += c - 1
		}
		return n
	}

	time.Sleep(6 * time.Second)
	ms[2].switchover(t, ctx, "standby", 1)
	time.Sleep(6 * time.Second)

	// The member FindCoordinator names for the group.
	var port int32
	adm.FindGroupCoordinators(ctx, group).Each(func(d kadm.FindCoordinatorResponse) { port = d.Port })
	var victim, other *ferryServe
	for _, m := range ms {
		if _, p, _ := net.SplitHostPort(m.addr); p == strconv.Itoa(int(port)) {
			victim = m
		} else if other == nil {
			other = m
		}
	}
	if victim == nil || other == nil {
		t.Fatalf("no member serves the group's coordinator port %d", port)
	}
	before := again()
	victim.kill(t)
	waitAlive(t, ms, victim, 30*time.Second)
	start := time.Now()
	d := other.switchover(t, ctx, "primary", 2)
	took := time.Since(start)
	t.Logf("killed %s (the group's coordinator), switched back through %s: %s by Ferry's account, %v answered", victim.name(), other.name(), d, took.Round(time.Millisecond))
	time.Sleep(10 * time.Second)
	stop()
	wg.Wait()
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The consumer reads every acknowledged offset.
	missing := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for at := range acked {
			if read[at] == 0 {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(time.Minute); missing() > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	stopCons()
	cwg.Wait()

	// Read again no more than what was produced while the switch ran.
	mu.Lock()
	defer mu.Unlock()
	produced := 0
	for _, at := range sent {
		if at.After(start) && at.Before(start.Add(took)) {
			produced++
		}
	}
	n := 0
	for _, c := range read {
		n += c - 1
	}
	t.Logf("read again: %d before the kill, %d after; %d records produced while the switch ran; %d acknowledged", before, n-before, produced, len(acked))
	if n-before > produced {
		t.Errorf("the group read %d records again after the coordinator's death and the switch, more than the %d produced while the switch ran", n-before, produced)
	}
	missed := 0
	for at := range acked {
		if read[at] == 0 {
			missed++
		}
	}
	if missed > 0 {
		t.Errorf("%d acknowledged offsets never read within a minute of the producer's end", missed)
	}
}
