package mirror

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestMirrorMarkerTwice: the standby's transaction coordinator writes a
// writer transaction's COMMIT marker a second time, as it does when its
// broker restarts after writing the marker and before recording the
// transaction complete (seen in the 30-minute fault schedule with the
// standby's broker killed; Kafka accepts the resent marker under
// transaction version 0 and, since KAFKA-19999, under version 2 too).
// Here the resend is the coordinator's own request, WriteTxnMarkers with
// the marker's producer, epoch and coordinator epoch. The standby is then
// one offset ahead of the source; the writer halts, naming that cause
// (marker_twice), not a crash inside a transaction, and appends nothing.
func TestMirrorMarkerTwice(t *testing.T) {
	a, s := clusters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic = "marker-twice"
	createTopic(t, a, topic, 1, nil)
	tx := txnClient(t, "marker-twice-tx")
	begin(t, tx)
	produceN(t, tx, topic, 0, 3, 1, "txn")
	end(t, tx, true) // the source: data at 0..2, COMMIT at 3
	m := startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false))
	waitCaughtUp(t, m, topic)
	m.Close()

	// The standby's COMMIT at 3: its producer and epoch from the batch,
	// its coordinator epoch from the partition's producer state.
	var marker *struct {
		pid   int64
		epoch int16
	}
	for _, b := range rawBatches(t, s, topic, 0) {
		if b.IsControl() && b.BaseOffset() == 3 {
			marker = &struct {
				pid   int64
				epoch int16
			}{b.ProducerID(), b.ProducerEpoch()}
		}
	}
	if marker == nil {
		t.Fatal("the standby holds no marker at 3")
	}
	if err := resendCommit(ctx, t, s, topic, marker.pid, marker.epoch); err != nil {
		t.Fatal(err)
	}
	if _, end := offsetsOf(t, s, topic, 0); end != 5 {
		t.Fatalf("the standby ends at %d after the resent marker, want 5 (the marker at 3 and again at 4)", end)
	}

	// The source goes on with data where the standby holds the copy.
	plain := newClient(t, a, manualPartitioner())
	produceN(t, plain, topic, 0, 2, 1, "after")
	m = startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false))
	testwait.Eventually(t, time.Minute, "the partition halted", func() error {
		st := m.Status()
		if len(st) != 1 || st[0].State != StateHalted {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	herr := m.Status()[0].Err
	if !errors.Is(herr, ErrMarkerTwice) || haltReason(herr) != "marker_twice" {
		t.Fatalf("halted with %v (reason %s), want ErrMarkerTwice (marker_twice)", herr, haltReason(herr))
	}
	if msg := herr.Error(); !strings.Contains(msg, "at 3 again at 4") {
		t.Errorf("the halt does not say where the marker is twice: %s", msg)
	}
	if _, end := offsetsOf(t, s, topic, 0); end != 5 {
		t.Fatalf("the standby moved from 5 to %d after the halt", end)
	}
}

// TestMirrorMarkerTwiceWhileCopying: the standby's coordinator writes the
// COMMIT marker of the transaction the writer has just ended a second time
// (here by resending it right after EndTxn is answered: while the writer
// waits for the marker, or once it saw it and before its next append), so
// the standby's end passes the offset after the marker. The writer halts
// naming that cause (marker_twice) and where, not a bare offset mismatch.
func TestMirrorMarkerTwiceWhileCopying(t *testing.T) {
	a, s := clusters(t)
	for _, tc := range []struct {
		name   string
		waited bool // resent once the writer saw the marker
		when   string
	}{{"while the writer waits for it", false, "just after the writer ended its transaction"},
		{"before the next append", true, "before the writer's next append"}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			topic := "marker-twice-copying-" + strconv.FormatBool(tc.waited)
			createTopic(t, a, topic, 1, nil)
			tx := txnClient(t, topic+"-tx")
			begin(t, tx)
			produceN(t, tx, topic, 0, 3, 1, "txn")
			end(t, tx, true) // the source: data at 0..2, COMMIT at 3
			produceN(t, newClient(t, a, manualPartitioner()), topic, 0, 2, 1, "after")

			resend := func(at int64) error {
				var pid int64 = -1
				var epoch int16
				for deadline := time.Now().Add(30 * time.Second); pid < 0; time.Sleep(20 * time.Millisecond) {
					for _, b := range rawBatches(t, s, topic, 0) {
						if b.IsControl() && b.BaseOffset() == at {
							pid, epoch = b.ProducerID(), b.ProducerEpoch()
						}
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("no marker at %d on the standby", at)
					}
				}
				return resendCommit(ctx, t, s, topic, pid, epoch)
			}
			var once sync.Once
			var hookErr error
			testHookEndedTxn = func(at int64, waited bool) {
				if waited == tc.waited {
					once.Do(func() { hookErr = resend(at) })
				}
			}
			t.Cleanup(func() { testHookEndedTxn = nil })

			m := startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false))
			testwait.Eventually(t, time.Minute, "the partition halted", func() error {
				st := m.Status()
				if len(st) != 1 || st[0].State != StateHalted {
					return fmt.Errorf("%+v", st)
				}
				return nil
			})
			if hookErr != nil {
				t.Fatal(hookErr)
			}
			herr := m.Status()[0].Err
			if !errors.Is(herr, ErrMarkerTwice) || haltReason(herr) != "marker_twice" {
				t.Fatalf("halted with %v (reason %s), want ErrMarkerTwice (marker_twice)", herr, haltReason(herr))
			}
			if msg := herr.Error(); !strings.Contains(msg, "at 3 again at 4, "+tc.when) {
				t.Errorf("the halt does not say where and when the marker is twice: %s", msg)
			}
		})
	}
}

// resendCommit writes the COMMIT marker of producer pid at epoch to
// partition 0 of topic on cluster c again, as its transaction coordinator
// would: WriteTxnMarkers with the coordinator epoch the partition's
// producer state holds.
func resendCommit(ctx context.Context, t *testing.T, c *kafkatest.Cluster, topic string, pid int64, epoch int16) error {
	dp, err := kadm.NewClient(newClient(t, c)).DescribeProducers(ctx, kadm.TopicsSet{topic: {0: {}}})
	if err != nil {
		return err
	}
	coordEpoch := int32(-1)
	dp.EachProducer(func(p kadm.DescribedProducer) {
		if p.ProducerID == pid {
			coordEpoch = p.CoordinatorEpoch
		}
	})
	if coordEpoch < 0 {
		return fmt.Errorf("the partition has no state for producer %d", pid)
	}
	w := kmsg.NewPtrWriteTxnMarkersRequest()
	wm := kmsg.NewWriteTxnMarkersRequestMarker()
	wm.ProducerID, wm.ProducerEpoch, wm.Committed, wm.CoordinatorEpoch = pid, epoch, true, coordEpoch
	wm.Topics = []kmsg.WriteTxnMarkersRequestMarkerTopic{{Topic: topic, Partitions: []int32{0}}}
	w.Markers = append(w.Markers, wm)
	resp, err := w.RequestWith(ctx, newClient(t, c))
	if err != nil {
		return err
	}
	for _, rm := range resp.Markers {
		for _, rt := range rm.Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return fmt.Errorf("the resent marker: %w", err)
				}
			}
		}
	}
	return nil
}
