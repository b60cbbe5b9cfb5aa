package mirror

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// startChild runs a Mirror in a child process (the test binary, see
// runChild) and returns it; the caller kills it.
func startChild(t *testing.T, topics string, env ...string) *exec.Cmd {
	t.Helper()
	a, s := clusters(t)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1", "FERRY_MIRROR_SOURCE="+a.Bootstrap(),
		"FERRY_MIRROR_TARGET="+s.Bootstrap(), "FERRY_MIRROR_TOPICS="+topics)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// backgroundProducer produces to every partition of topic until stop is
// closed, alternating idempotent batches of several records and single
// records from a non-idempotent producer.
func backgroundProducer(t *testing.T, topic string, partitions int32, stop <-chan struct{}) *sync.WaitGroup {
	return pacedProducer(t, topic, partitions, stop, 0)
}

// pacedProducer is backgroundProducer with a pause after each produce.
func pacedProducer(t *testing.T, topic string, partitions int32, stop <-chan struct{}, pause time.Duration) *sync.WaitGroup {
	a, _ := clusters(t)
	idem := newClient(t, a, manualPartitioner(), kgo.ProducerBatchCompression(kgo.Lz4Compression()))
	plain := newClient(t, a, manualPartitioner(), kgo.DisableIdempotentWrite())
	var wg sync.WaitGroup
	for p := range partitions {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				cl, n := idem, 20
				if i%3 == 2 {
					cl, n = plain, 1
				}
				var rs []*kgo.Record
				for j := range n {
					rs = append(rs, &kgo.Record{Topic: topic, Partition: p, Key: []byte(fmt.Sprint(j)), Value: []byte(fmt.Sprintf("bg %d %d", i, j))})
				}
				// Errors while a broker restarts are retried by kgo; a
				// record that finally fails is simply not in either log.
				_ = cl.ProduceSync(ctx, rs...)
				time.Sleep(pause)
			}
		})
	}
	return &wg
}

// txnProducer runs source transactions on partition 0 of topic until stop
// is closed: two or three batches each, committed and aborted in turn.
func txnProducer(t *testing.T, topic string, stop <-chan struct{}) *sync.WaitGroup {
	return pacedTxnProducer(t, topic, stop, 5*time.Millisecond)
}

// pacedTxnProducer is txnProducer with the given pause between
// transactions.
func pacedTxnProducer(t *testing.T, topic string, stop <-chan struct{}, pause time.Duration) *sync.WaitGroup {
	a, _ := clusters(t)
	cl := newClient(t, a, kgo.TransactionalID("bg-"+topic), manualPartitioner(), kgo.ProducerLinger(0))
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := cl.BeginTransaction(); err != nil {
				return
			}
			for j := range 2 + i%2 {
				_ = cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(fmt.Sprintf("txn %d %d", i, j))})
			}
			if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(i%3 != 2)); err != nil {
				return
			}
			time.Sleep(pause)
		}
	})
	return &wg
}

// waitEqualEnds waits until the standby's end offset equals the source's
// for every partition.
func waitEqualEnds(t *testing.T, topic string, partitions int32) {
	t.Helper()
	testwait.Eventually(t, 90*time.Second, "standby ends equal to source ends", func() error {
		for p := range partitions {
			_, se := offsetsOf(t, active, topic, p)
			_, de := offsetsOf(t, standby, topic, p)
			if se != de {
				return fmt.Errorf("partition %d: source %d, standby %d", p, se, de)
			}
		}
		return nil
	})
}

// TestMirrorKillRestart: the mirror process is SIGKILLed twice mid-stream
// (plain, idempotent and transactional source producers) and restarted;
// the standby ends with no gap, no duplicate and no divergence.
// TestMirrorKillInTxn kills it at chosen points inside its transactions.
func TestMirrorKillRestart(t *testing.T) {
	a, _ := clusters(t)
	const topic = "crash"
	createTopic(t, a, topic, 2, nil)
	stop := make(chan struct{})
	wg := backgroundProducer(t, topic, 2, stop)
	twg := txnProducer(t, topic, stop)
	for range 2 {
		child := startChild(t, topic)
		time.Sleep(2500 * time.Millisecond)
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait()
	}
	close(stop)
	wg.Wait()
	twg.Wait()
	startChild(t, topic)
	waitEqualEnds(t, topic, 2)
	for p := range int32(2) {
		sameBatches(t, topic, p)
		sameRecords(t, topic, p)
	}
}

// TestMirrorBrokerRestart: the standby's broker and then the source's are
// restarted while records flow; the writers resume by themselves.
func TestMirrorBrokerRestart(t *testing.T) {
	a, s := clusters(t)
	const topic = "restart"
	createTopic(t, a, topic, 2, nil)
	m := startMirror(t, Topics([]string{topic}, nil))
	stop := make(chan struct{})
	wg := backgroundProducer(t, topic, 2, stop)
	testwait.Eventually(t, time.Minute, "mirroring under way", func() error {
		for _, st := range m.Status() {
			if st.Mirrored <= 0 {
				return fmt.Errorf("%+v", st)
			}
		}
		if len(m.Status()) != 2 {
			return fmt.Errorf("no writers")
		}
		return nil
	})
	for _, c := range []*struct {
		name string
		c    interface {
			Stop(int32) error
			Restart(int32) error
		}
	}{{"standby", s}, {"active", a}} {
		if err := c.c.Stop(1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := c.c.Restart(1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	close(stop)
	wg.Wait()
	waitCaughtUp(t, m, topic)
	for p := range int32(2) {
		sameBatches(t, topic, p)
		sameRecords(t, topic, p)
	}
	for _, st := range m.Status() {
		if st.State == StateHalted {
			t.Fatalf("halted: %+v", st)
		}
	}
}
