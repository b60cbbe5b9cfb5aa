package main

// The automatic case (-automatic N): automatic failover on, a producer and
// the groups running through Ferry, the active cluster's broker killed.
// Measured: from the kill to the first produce acknowledged by the standby
// after the flip (an ack, later than the kill plus after, at an offset at
// or above the standby's end at the flip: the fence the switch recorded),
// against the floor of
// failover.after plus 3 s; and the acknowledged records lost (acks inside
// the switch's lost ranges) against the mirror's lag at the moment of the
// kill (summed over the partitions, from /status); an ack counts when it
// came before the standby could ack anything (the kill plus after), so
// from the old cluster. Each round runs on
// fresh clusters and a fresh member: the fleet never fails back by itself,
// and the return after a forced switch is a person's (docs/RUNBOOK.md).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// automaticRound is one automatic failover measured.
type automaticRound struct {
	firstAck   time.Duration // the kill to the first ack on the standby
	switched   time.Duration // the kill to the member serving the standby
	lagAtKill  int64         // the mirror's lag, summed, just before the kill
	lostAcked  int           // acknowledged records in the lost ranges
	lostRanges int
}

func runAutomatic(ctx context.Context, o options) error {
	var rounds []automaticRound
	for r := range o.rounds {
		ar, err := automaticOnce(ctx, o)
		if err != nil {
			return fmt.Errorf("automatic round %d: %w", r+1, err)
		}
		step("automatic %d: first ack on the standby %v after the kill (member serving it at %v); lag at the kill %d records, acknowledged records lost %d in %d ranges",
			r+1, ar.firstAck.Round(time.Millisecond), ar.switched.Round(time.Millisecond), ar.lagAtKill, ar.lostAcked, ar.lostRanges)
		rounds = append(rounds, ar)
	}
	return reportAutomatic(os.Stdout, o, rounds)
}

func automaticOnce(ctx context.Context, o options) (automaticRound, error) {
	var ar automaticRound
	b := &bench{o: o, active: "primary", consume: map[int][]float64{}, planned: map[string][]time.Duration{}}
	step("starting two 1-broker Kafka %s clusters (primary, standby)", kafkatest.Version())
	var err error
	real, err := benchutil.StartClustersWith("switchbench-", func(string, *kafkatest.Config) {}, "primary", "standby")
	if err != nil {
		return ar, err
	}
	defer benchutil.CloseClusters(real)
	b.clusters = realClusters(real)
	b.standbyAddr = real["standby"].Bootstrap()
	dir, err := os.MkdirTemp("", "switchbench-")
	if err != nil {
		return ar, err
	}
	defer os.RemoveAll(dir)
	stop, err := b.startFerry(ctx, dir)
	if err != nil {
		return ar, err
	}
	defer stop()
	tr, stopTraffic, err := b.startTraffic(ctx, "switchbench-automatic")
	if err != nil {
		return ar, err
	}
	defer stopTraffic()
	if err := b.waitCaughtUp(ctx, int64(o.rate/10), o.partitions); err != nil {
		return ar, err
	}
	time.Sleep(2 * time.Second) // the detector's lag read, at steady state
	st, err := b.status(ctx)
	if err != nil {
		return ar, err
	}
	for _, p := range st.Mirror.Partitions {
		ar.lagAtKill += p.Lag
	}
	primary := real["primary"]
	kill := time.Now()
	if err := primary.Kill(primary.NodeIDs()[0]); err != nil {
		return ar, err
	}
	deadline := kill.Add(o.failoverAfter + 2*time.Minute)
	var routing routingAnswer
	for {
		if routing, err = b.routing(ctx); err == nil && routing.Generation > 0 {
			ar.switched = time.Since(kill)
			break
		}
		if time.Now().After(deadline) {
			return ar, fmt.Errorf("no automatic switch within %v of the kill (last: %+v, %v)", time.Since(kill), routing, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if routing.Active != "standby" || routing.LastSwitch == nil || !routing.LastSwitch.Automatic {
		return ar, fmt.Errorf("the switch made: %+v", routing)
	}
	fence := map[int32]int64{}
	for _, f := range routing.Fences {
		if f.Generation == 0 {
			for p, end := range f.Ends[tr.topic] {
				fence[int32(p)] = end
			}
		}
	}
	if len(fence) == 0 {
		return ar, fmt.Errorf("the switch recorded no fence for %s: %+v", tr.topic, routing.Fences)
	}
	for {
		// After the kill plus after, an ack at or above the fence is
		// the standby's: the old cluster died that long before (those
		// it acknowledged in its last moments, above what the mirror
		// had, came just after the kill).
		if a, ok := tr.acks.first(kill.Add(o.failoverAfter), fence); ok {
			ar.firstAck = a.Sub(kill)
			break
		}
		if time.Now().After(deadline) {
			return ar, fmt.Errorf("no produce acknowledged by the standby within %v of the kill", time.Since(kill))
		}
		time.Sleep(5 * time.Millisecond)
	}
	ar.lostRanges = len(routing.LastSwitch.Lost)
	tr.acks.mu.Lock()
	for _, e := range tr.acks.events {
		for _, l := range routing.LastSwitch.Lost {
			if l.Topic == tr.topic && l.Partition == e.partition && e.offset >= l.From && (l.To < 0 || e.offset < l.To) && e.at.Before(kill.Add(o.failoverAfter)) {
				ar.lostAcked++
			}
		}
	}
	tr.acks.mu.Unlock()
	return ar, nil
}

// routingAnswer is the part of GET /status/routing the automatic case reads.
type routingAnswer struct {
	Generation uint32 `json:"generation"`
	Active     string `json:"active"`
	LastSwitch *struct {
		Automatic bool `json:"automatic"`
		Lost      []struct {
			Topic     string `json:"topic"`
			Partition int32  `json:"partition"`
			From      int64  `json:"from"`
			To        int64  `json:"to"`
		} `json:"lost"`
	} `json:"last_switch"`
	Fences []struct {
		Generation uint32             `json:"generation"`
		Ends       map[string][]int64 `json:"ends"`
	} `json:"fences"`
}

func (b *bench) routing(ctx context.Context) (routingAnswer, error) {
	var r routingAnswer
	err := b.getJSON(ctx, "/status/routing", &r)
	return r, err
}

// mirrorStatus is the part of GET /status the automatic case reads.
type mirrorStatus struct {
	Mirror struct {
		Partitions []struct {
			Lag int64 `json:"lag_records"`
		} `json:"partitions"`
	} `json:"mirror"`
}

func (b *bench) status(ctx context.Context) (mirrorStatus, error) {
	var st mirrorStatus
	err := b.getJSON(ctx, "/status", &st)
	return st, err
}

func (b *bench) getJSON(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.admin+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func reportAutomatic(w io.Writer, o options, rounds []automaticRound) error {
	var acks, switched []time.Duration
	lost, lag := 0, int64(0)
	for _, r := range rounds {
		acks, switched = append(acks, r.firstAck), append(switched, r.switched)
		lost += r.lostAcked
		lag += r.lagAtKill
	}
	med, lo, hi := benchutil.Spread(acks)
	smed, slo, shi := benchutil.Spread(switched)
	floor := o.failoverAfter + 3*time.Second
	verdict := "met"
	if med > floor {
		verdict = "NOT met"
	}
	fmt.Fprintf(w, "\nAutomatic failover, failover.after %v, %d rounds, %d records/s through Ferry, %d partitions:\n", o.failoverAfter, len(rounds), o.rate, o.partitions)
	fmt.Fprintf(w, "  the broker's kill to the first produce acknowledged by the standby: median %v (min %v, max %v); floor after + 3 s = %v: %s\n",
		med.Round(time.Millisecond), lo.Round(time.Millisecond), hi.Round(time.Millisecond), floor, verdict)
	fmt.Fprintf(w, "  the kill to the member serving the standby: median %v (min %v, max %v)\n", smed.Round(time.Millisecond), slo.Round(time.Millisecond), shi.Round(time.Millisecond))
	fmt.Fprintf(w, "  acknowledged records lost: %d in all, against a mirror lag of %d records summed over the rounds' kills\n", lost, lag)
	return nil
}
