package mirror

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// TestMirrorFencing: while a writer mirrors a partition under load, two
// more writers for the same partition start at the same instant. Exactly one
// is left mirroring; the others stop with ErrFenced; the standby equals the
// source with no duplicate and no gap.
func TestMirrorFencing(t *testing.T) {
	a, _ := clusters(t)
	const topic = "fence"
	createTopic(t, a, topic, 1, nil)
	stop := make(chan struct{})
	wg := backgroundProducer(t, topic, 1, stop)
	m1 := startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false))
	testwait.Eventually(t, time.Minute, "first writer mirroring", func() error {
		if st := m1.Status(); len(st) != 1 || st[0].Mirrored <= 0 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	ms := []*Mirror{m1,
		startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false)),
		startMirror(t, Topics([]string{topic}, nil), SyncGroups(false), SyncACLs(false))}
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()

	var survivor *Mirror
	testwait.Eventually(t, time.Minute, "one writer left, the others fenced", func() error {
		survivor = nil
		fenced := 0
		for i, m := range ms {
			st := m.Status()
			if len(st) != 1 {
				return fmt.Errorf("mirror %d: %+v", i+1, st)
			}
			switch {
			case st[0].State == StateHalted && errors.Is(st[0].Err, ErrFenced):
				fenced++
			case st[0].State == StateHalted:
				t.Fatalf("mirror %d halted, but not fenced: %v", i+1, st[0].Err)
			default:
				survivor = m
			}
		}
		if fenced != 2 || survivor == nil {
			return fmt.Errorf("%d fenced, survivor %v", fenced, survivor != nil)
		}
		return nil
	})
	if survivor == m1 {
		t.Fatal("the first writer survived writers started after it")
	}
	for i, m := range ms {
		t.Logf("mirror %d: %v", i+1, m.Status()[0].Err)
	}
	waitCaughtUp(t, survivor, topic)
	sameBatches(t, topic, 0)
	sameRecords(t, topic, 0)
}
