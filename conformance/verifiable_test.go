package conformance

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/verifiable"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// Apache Kafka's own verifiable clients — the ones its system tests use to
// show that no acknowledged record is lost — through `ferry serve` across
// two planned switches: a VerifiableProducer (idempotent, acks=all) and a
// VerifiableConsumer in a classic group and one in a KIP-848 group, each
// committing after every batch it reads.
//
// Checked: every record the producer acknowledged is on the cluster active
// at the end at the offset it was acknowledged at; each consumer read every
// acknowledged offset; no commit failed; each group read again no more than
// the records produced while the switches ran (what a consumer can have read
// and not yet committed when its group moves).
func TestVerifiableClientsAcrossSwitches(t *testing.T) {
	if testing.Short() {
		t.Skip("conformance: real Kafka is not run in -short mode")
	}
	const (
		topic      = "verifiable"
		partitions = 6
		rate       = 300 // records a second
		total      = 9000
	)
	bin, primary, standby := startPair(t, "verifiable-primary", "verifiable-standby")
	m := startFerryServe(t, bin, primary, standby)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	viaCl, err := kgo.NewClient(kgo.SeedBrokers(m.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer viaCl.Close()
	createReadyTopic(ctx, t, kadm.NewClient(viaCl), topic, partitions, 1)

	prod := verifiable.StartProducer(ctx, t, verifiable.ProducerConfig{Bootstrap: m.addr, Topic: topic, Throughput: rate, Max: total,
		Properties: map[string]string{"enable.idempotence": "true", "retries": "2147483647"}})
	cons := []*verifiable.Consumer{
		verifiable.StartConsumer(ctx, t, verifiable.ConsumerConfig{Bootstrap: m.addr, Topic: topic, Group: "verifiable-classic", Protocol: "classic"}),
		verifiable.StartConsumer(ctx, t, verifiable.ConsumerConfig{Bootstrap: m.addr, Topic: topic, Group: "verifiable-consumer", Protocol: "consumer"}),
	}
	defer func() {
		if t.Failed() {
			t.Logf("VerifiableProducer stderr:\n%s\nnot events: %q", tail(prod.Stderr(), 3000), head(strings.Join(prod.NotEvents(), "\n"), 2000))
			for _, c := range cons {
				t.Logf("%s stderr:\n%s", c.Group, tail(c.Stderr(), 3000))
			}
		}
	}()

	// acked waits until the producer has n acknowledged.
	acked := func(n int) {
		t.Helper()
		testwait.Eventually(t, time.Minute, fmt.Sprintf("the producer to have %d acknowledged", n), func() error {
			if a := prod.Acked(); a < n {
				if ctx.Err() != nil {
					t.Fatalf("the producer has %d acknowledged, waited for %d: %v", a, n, ctx.Err())
				}
				return fmt.Errorf("%d acknowledged", a)
			}
			return nil
		})
	}
	var switched time.Duration
	for i, sw := range []struct {
		to    string
		after int
	}{{"standby", 1500}, {"primary", 4500}} {
		acked(sw.after)
		start := time.Now()
		d := m.switchover(t, ctx, sw.to, uint32(i+1))
		switched += time.Since(start)
		t.Logf("switched to %s after %d acknowledged: %s by Ferry's account, %v answered", sw.to, sw.after, d, time.Since(start).Round(time.Millisecond))
	}
	if err := prod.Wait(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	acks := prod.Acks()
	if errs := prod.Errors(); len(errs) > 0 {
		t.Errorf("the producer failed %d sends, e.g. %s", len(errs), errs[0])
	}
	if len(acks) != total {
		t.Errorf("the producer had %d of %d records acknowledged", len(acks), total)
	}
	if bad := prod.NotEvents(); len(bad) > 0 {
		t.Errorf("the producer printed %d lines that are not events, e.g. %q", len(bad), bad[0])
	}

	// Each consumer reads every acknowledged offset.
	missing := func(c *verifiable.Consumer) int { return verifiable.Unread(acks, c.Ranges()) }
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		left := 0
		for _, c := range cons {
			left += missing(c)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, c := range cons {
				t.Errorf("%s: %d acknowledged offsets never read", c.Group, missing(c))
			}
			break
		}
	}
	for _, c := range cons {
		if err := c.Stop(60 * time.Second); err != nil {
			t.Error(err)
		}
	}

	// Every acknowledged record is on the cluster active at the end, at
	// its offset.
	on := readCommitted(t, ctx, primary, []string{topic})[topic]
	bad := 0
	for _, a := range acks {
		if got := on[partOff{a.Partition, a.Offset}]; got != a.Value {
			if bad++; bad <= 3 {
				t.Errorf("acknowledged %q at %d/%d; the primary holds %q there", a.Value, a.Partition, a.Offset, got)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d acknowledged records not at their offsets", bad, len(acks))
	}

	// What each group read again, and its commits.
	bound := int(switched.Seconds()*rate) + rate/2
	for _, c := range cons {
		_, again := verifiable.Read(c.Ranges())
		failed := 0
		var errs []string
		for _, cm := range c.Commits() {
			if !cm.Success {
				if failed++; failed <= 3 {
					errs = append(errs, cm.Error)
				}
			}
		}
		t.Logf("%s: read %d records again; %d of %d commits failed %s", c.Group, again, failed, len(c.Commits()), strings.Join(errs, "; "))
		if failed > 0 {
			t.Errorf("%s: %d commits failed, e.g. %s", c.Group, failed, errs[0])
		}
		if again > bound {
			t.Errorf("%s read %d records again across the switches, more than the %d produced while they ran (%v at %d/s)", c.Group, again, bound, switched.Round(time.Millisecond), rate)
		}
		if bad := c.NotEvents(); len(bad) > 0 {
			t.Errorf("%s printed %d lines that are not events, e.g. %q", c.Group, len(bad), bad[0])
		}
	}
}
