package mirror

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// fakeClusterWithout is a kfake cluster that answers ApiVersions without
// the given keys, as a broker older than Kafka 3.0 lacks ListTransactions
// and DescribeTransactions (KIP-664).
func fakeClusterWithout(t *testing.T, keys ...kmsg.Key) *kfake.Cluster {
	t.Helper()
	v := kversion.Stable()
	for _, k := range keys {
		v.SetMaxKeyVersion(int16(k), -1)
	}
	return fakeClusterAt(t, v)
}

// fakeClusterAt is a kfake cluster that offers the versions v.
func fakeClusterAt(t *testing.T, v *kversion.Versions) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.MaxVersions(v))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestDrainSourceWithoutListTransactions: a source without
// ListTransactions (Kafka 2.8) is drained by the last stable offsets alone.
// Before, every listing failed and the drain ran to its deadline, naming
// "transactions still open on the source" where none was (the 2.8 → 4.4
// switch of TestVersionsMigration, rolled back after its minute).
func TestDrainSourceWithoutListTransactions(t *testing.T) {
	a, b := fakeClusterWithout(t, kmsg.ListTransactions), fakeCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "old-source"
	acl := fakeClient(t, a)
	if _, err := kadm.NewClient(acl).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	produceFake(t, acl, topic, 0, numbered("a", 0, 10)...)
	m, _ := runFakeMirror(t, a, b, nil, Topics([]string{topic}, nil))
	standbyEndReaches(t, b, topic, 0, 10, "the partition mirrored")
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	start := time.Now()
	if err := m.Drain(dctx); err != nil {
		t.Fatalf("drain of a source without ListTransactions: %v after %v", err, time.Since(start))
	}
}

// TestTargetWithoutDescribeTransactionsHalts: a target without
// DescribeTransactions (Kafka 2.8), which the writers' fence check needs,
// halts every partition at once with target_too_old, saying why, and
// nothing is written to it; a switch to it is then refused as halted.
func TestTargetWithoutDescribeTransactionsHalts(t *testing.T) {
	a, b := fakeCluster(t), fakeClusterWithout(t, kmsg.ListTransactions, kmsg.DescribeTransactions)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "old-target"
	acl := fakeClient(t, a)
	if _, err := kadm.NewClient(acl).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	produceFake(t, acl, topic, 0, numbered("a", 0, 10)...)
	reg := prometheus.NewRegistry()
	m, _ := runFakeMirror(t, a, b, reg, Topics([]string{topic}, nil))
	var st PartitionStatus
	testwait.Eventually(t, 30*time.Second, "the partition halted", func() error {
		var ok bool
		if st, ok = partitionStatus(m, topic, 0); !ok || st.State != StateHalted {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	if !errors.Is(st.Err, ErrTargetTooOld) || HaltReason(st.Err) != "target_too_old" || !strings.Contains(st.Err.Error(), "DescribeTransactions") {
		t.Fatalf("halted with %v (reason %s), want ErrTargetTooOld naming DescribeTransactions", st.Err, HaltReason(st.Err))
	}
	if e := fakeEnd(t, b, topic, 0); e != 0 {
		t.Fatalf("the target's end is %d, want 0: nothing written", e)
	}
	// Nothing of the source is known to be on the standby: its lag is the
	// source's whole end (what a forced switch would lose, which automatic
	// failover bounds), not 0, and it keeps its age while halted.
	testwait.Eventually(t, 30*time.Second, "the halted partition's lag", func() error {
		st, _ = partitionStatus(m, topic, 0)
		if st.Mirrored != -1 || st.SourceEnd != 10 || st.LagRecords != 10 || st.LagTime <= 0 {
			return fmt.Errorf("mirrored %d, source end %d, lag %d records and %v, want -1, 10, 10 and more than 0",
				st.Mirrored, st.SourceEnd, st.LagRecords, st.LagTime)
		}
		return nil
	})
	// And so in the metrics, which have no mirrored offset to give.
	if v := metricValue(t, reg, "ferry_mirror_lag_records", "topic", topic); v != 10 {
		t.Errorf("ferry_mirror_lag_records %v, want 10", v)
	}
	if v := metricValue(t, reg, "ferry_mirror_lag_seconds", "topic", topic); v <= 0 {
		t.Errorf("ferry_mirror_lag_seconds %v, want more than 0", v)
	}
	if n, err := testutil.GatherAndCount(reg, "ferry_mirror_mirrored_offset"); err != nil || n != 0 {
		t.Errorf("ferry_mirror_mirrored_offset exported %d times (%v) for a partition that never started", n, err)
	}
}

// TestHaltedEmptyPartitionLosesNothing: a partition halted before it
// started whose source holds nothing lags by nothing, in records or in
// time (a forced switch loses nothing of it), where one that holds records
// lags by all of them (TestTargetWithoutDescribeTransactionsHalts).
func TestHaltedEmptyPartitionLosesNothing(t *testing.T) {
	a, b := fakeCluster(t), fakeClusterWithout(t, kmsg.ListTransactions, kmsg.DescribeTransactions)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "old-target-empty"
	if _, err := kadm.NewClient(fakeClient(t, a)).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	m, _ := runFakeMirror(t, a, b, nil, Topics([]string{topic}, nil))
	testwait.Eventually(t, 30*time.Second, "the empty partition halted, lagging by nothing", func() error {
		st, ok := partitionStatus(m, topic, 0)
		switch {
		case !ok || st.State != StateHalted:
			return fmt.Errorf("status %+v", st)
		case st.SourceEnd != 0 || st.LagRecords != 0:
			return fmt.Errorf("source end %d, lag %d records, want 0 and 0", st.SourceEnd, st.LagRecords)
		case time.Since(start) < 3*time.Second || st.LagTime > time.Since(start)-2*time.Second:
			// Its age counts from the last listing that found the
			// source empty, not from the writer's start.
			return fmt.Errorf("lag time %v after %v", st.LagTime, time.Since(start))
		}
		return nil
	})
}

// TestTargetWithOlderProduce: a target serving Produce up to v9 (Kafka
// before 3.7) is written at v9. Before, the writers sent v11, the broker
// closed each connection, and the partition retried its session ("EOF")
// for ever: 4.4 → 3.6, the failback of TestVersionsMigration.
func TestTargetWithOlderProduce(t *testing.T) {
	v := kversion.Stable()
	v.SetMaxKeyVersion(int16(kmsg.Produce), 9)
	a, b := fakeCluster(t), fakeClusterAt(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "produce-v9"
	acl := fakeClient(t, a)
	if _, err := kadm.NewClient(acl).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	produceFake(t, acl, topic, 0, numbered("a", 0, 10)...)
	runFakeMirror(t, a, b, nil, Topics([]string{topic}, nil))
	standbyEndReaches(t, b, topic, 0, 10, "the partition mirrored into a target with Produce v9")
}
