package kafkatest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testwait"
)

func TestMain(m *testing.M) { Main(m) }

func newClient(t *testing.T, c *Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Addrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// newClientAt is a client bootstrapped at addr only.
func newClientAt(t *testing.T, addr string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func createTopic(t *testing.T, ctx context.Context, adm *kadm.Client, topic string, partitions int32, rf int16) {
	t.Helper()
	resp, err := adm.CreateTopic(ctx, partitions, rf, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

func TestSingleNodeProduceConsume(t *testing.T) {
	start := time.Now()
	c := Start(t, 1, WithListener(Listener{Name: "EXTRA", Advertise: func(id int32) string { return fmt.Sprintf("relay-%d.invalid:9", id) }}))
	t.Logf("1-node cluster %s ready in %v at %s", c.ClusterID(), time.Since(start).Round(time.Millisecond), c.Bootstrap())

	if got := c.NodeIDs(); !slices.Equal(got, []int32{1}) {
		t.Fatalf("NodeIDs = %v, want [1]", got)
	}
	if len(c.ClusterID()) != 22 || strings.HasPrefix(c.ClusterID(), "-") {
		t.Fatalf("ClusterID %q is not a 22-character base64url ID", c.ClusterID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cl := newClient(t, c)
	createTopic(t, ctx, kadm.NewClient(cl), "one", 1, 1)
	for i, v := range []string{"first", "second"} {
		r, err := cl.ProduceSync(ctx, &kgo.Record{Topic: "one", Value: []byte(v)}).First()
		if err != nil {
			t.Fatalf("produce %q: %v", v, err)
		}
		if r.Offset != int64(i) {
			t.Fatalf("produce %q: offset %d, want %d", v, r.Offset, i)
		}
	}

	// Metadata answered on the extra listener names what Advertise said;
	// on the default one, the default listener.
	for _, tc := range []struct{ addr, want string }{{c.ListenerAddr("EXTRA", 1), "relay-1.invalid:9"}, {c.Addr(1), c.Addr(1)}} {
		md, err := kadm.NewClient(newClientAt(t, tc.addr)).BrokerMetadata(ctx)
		if err != nil {
			t.Fatalf("metadata from %s: %v", tc.addr, err)
		}
		if len(md.Brokers) != 1 || net.JoinHostPort(md.Brokers[0].Host, strconv.Itoa(int(md.Brokers[0].Port))) != tc.want {
			t.Fatalf("metadata from %s names brokers %+v, want %s", tc.addr, md.Brokers, tc.want)
		}
	}
	if c.ListenerAddr("NONE", 1) != "" || c.ListenerAddr("EXTRA", 2) != "" {
		t.Fatal("ListenerAddr names a listener or node that does not exist")
	}

	consumer := newClient(t, c, kgo.ConsumeTopics("one"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []*kgo.Record
	for len(got) < 2 {
		fs := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d records before %v", len(got), err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		got = append(got, fs.Records()...)
	}
	if len(got) != 2 || string(got[1].Value) != "second" || got[1].Offset != 1 {
		t.Fatalf("consumed %d records, last %q at %d; want 2, \"second\" at 1", len(got), got[len(got)-1].Value, got[len(got)-1].Offset)
	}

	// A perf tool through JavaCmd appends 1000 records.
	perf := JavaCmd(ctx, t, "org.apache.kafka.tools.ProducerPerformance",
		"--topic", "one", "--num-records", "1000", "--record-size", "100", "--throughput", "-1",
		"--producer-props", "bootstrap.servers="+c.Bootstrap(), "acks=all")
	if out, err := perf.CombinedOutput(); err != nil {
		t.Fatalf("ProducerPerformance: %v\n%s", err, out)
	}
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup("one", 0); o.Offset != 1002 {
		t.Fatalf("end offset after ProducerPerformance = %d (err %v), want 1002", o.Offset, o.Err)
	}

	// Stop (controlled shutdown) and Restart keep the data.
	if err := c.Stop(1); err != nil {
		t.Fatal(err)
	}
	if c.Running(1) {
		t.Fatal("node 1 running after Stop")
	}
	if err := c.Stop(1); err == nil {
		t.Fatal("Stop of a stopped node succeeded, want an error")
	}
	if err := c.Restart(1); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, "end offset after restart", func() error {
		ends, err := adm.ListEndOffsets(ctx, "one")
		if err != nil {
			return err
		}
		if o, _ := ends.Lookup("one", 0); o.Err != nil || o.Offset != 1002 {
			return errorString("end offset " + strconv.FormatInt(o.Offset, 10))
		}
		return nil
	})
}

// TestBindClashRetry occupies the first port handed to New: the node fails
// to bind, and New starts again on fresh ports.
func TestBindClashRetry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JVM")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	calls := 0
	pickPorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if calls == 1 && err == nil {
			ports[0] = taken
		}
		return ports, err
	}
	defer func() { pickPorts = freePorts }()

	c := Start(t, 1)
	t.Logf("taken %d, calls %d, addr %s", taken, calls, c.Addr(1))
	if calls != 2 {
		t.Fatalf("ports picked %d times, want 2 (one clash, one retry)", calls)
	}
	if c.Addr(1) == ln.Addr().String() {
		t.Fatalf("node listens on the occupied port %s", c.Addr(1))
	}
	if b, _ := os.ReadFile(c.LogPath(1)); !strings.Contains(string(b), "Address already in use") {
		t.Errorf("log %s does not show the bind clash", c.LogPath(1))
	}
}

func TestMissingToolsMessage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := checkTools()
	if err == nil || !strings.Contains(err.Error(), "apt-get install -y openjdk-17-jre-headless maven") {
		t.Fatalf("checkTools() = %v, want an install hint", err)
	}
}

// partitionState returns the leader and ISR of topic/partition from metadata.
func partitionState(ctx context.Context, adm *kadm.Client, topic string, partition int32) (leader int32, isr []int32, err error) {
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return -1, nil, err
	}
	p, ok := md.Topics[topic].Partitions[partition]
	if !ok {
		return -1, nil, errNoPartition
	}
	if p.Err != nil {
		return p.Leader, p.ISR, p.Err
	}
	return p.Leader, p.ISR, nil
}

var errNoPartition = errorString("partition not in metadata")

type errorString string

func (e errorString) Error() string { return string(e) }

func TestThreeNodeLeaderFailover(t *testing.T) {
	start := time.Now()
	c := Start(t, 3)
	t.Logf("3-node cluster %s ready in %v at %s", c.ClusterID(), time.Since(start).Round(time.Millisecond), c.Bootstrap())
	if got := c.NodeIDs(); !slices.Equal(got, []int32{1, 2, 3}) {
		t.Fatalf("NodeIDs = %v, want [1 2 3]", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	cl := newClient(t, c, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RequiredAcks(kgo.AllISRAcks()))
	adm := kadm.NewClient(cl)
	const topic = "spread"
	createTopic(t, ctx, adm, topic, 3, 3)

	// Leaders are spread over every node, each partition replicated 3 times.
	var leaders []int32
	testwait.Eventually(t, 30*time.Second, "leaders of "+topic, func() error {
		md, err := adm.Metadata(ctx, topic)
		if err != nil {
			return err
		}
		leaders = leaders[:0]
		for p := range int32(3) {
			pd := md.Topics[topic].Partitions[p]
			if pd.Err != nil || pd.Leader < 0 || len(pd.ISR) != 3 || len(pd.Replicas) != 3 {
				return errorString("partition not ready")
			}
			leaders = append(leaders, pd.Leader)
		}
		return nil
	})
	sorted := slices.Sorted(slices.Values(leaders))
	if !slices.Equal(sorted, []int32{1, 2, 3}) {
		t.Fatalf("partition leaders %v, want one partition led by each of nodes 1, 2, 3", leaders)
	}

	produce := func(v string) int64 {
		t.Helper()
		r, err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(v)}).First()
		if err != nil {
			t.Fatalf("produce %q to partition 0: %v", v, err)
		}
		return r.Offset
	}
	if off := produce("before"); off != 0 {
		t.Fatalf("first record at offset %d, want 0", off)
	}

	// Kill partition 0's leader: leadership moves and producing goes on.
	old := leaders[0]
	killed := time.Now()
	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	if c.Running(old) {
		t.Fatalf("node %d still running after Kill", old)
	}
	testwait.Eventually(t, 60*time.Second, "leader change after kill", func() error {
		leader, isr, err := partitionState(ctx, adm, topic, 0)
		if err != nil {
			return err
		}
		if leader == old || leader < 0 || slices.Contains(isr, old) {
			return errorString("leader still " + itoa(leader))
		}
		return nil
	})
	t.Logf("leader of %s/0 moved off node %d in %v", topic, old, time.Since(killed).Round(time.Millisecond))
	if off := produce("after-kill"); off != 1 {
		t.Fatalf("record after kill at offset %d, want 1", off)
	}

	// Restart it: it rejoins the ISR.
	restarted := time.Now()
	if err := c.Restart(old); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d back in metadata %v after Restart", old, time.Since(restarted).Round(time.Millisecond))
	testwait.Eventually(t, 60*time.Second, "node back in ISR", func() error {
		_, isr, err := partitionState(ctx, adm, topic, 0)
		if err != nil {
			return err
		}
		if !slices.Contains(isr, old) {
			return errorString("ISR without restarted node")
		}
		return nil
	})
	t.Logf("node %d in ISR of %s/0 %v after Restart", old, topic, time.Since(restarted).Round(time.Millisecond))
	if off := produce("after-restart"); off != 2 {
		t.Fatalf("record after restart at offset %d, want 2", off)
	}
	if err := c.Restart(old); err == nil {
		t.Fatalf("Restart of a running node succeeded, want an error")
	}
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

// TestReapOrphans checks that a process carrying the marker of a dead owner
// is killed and the owner directory removed, while a live owner's process
// is left alone.
func TestReapOrphans(t *testing.T) {
	base, err := pidsDir()
	if err != nil {
		t.Fatal(err)
	}
	mkOwner := func(name string) string {
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ownerLockName), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	spawn := func(owner string) *exec.Cmd {
		// A stand-in for a JVM: sh with the marker as its $0, in its own
		// process group and without a parent-death signal, like a JVM
		// whose test process died.
		cmd := exec.Command("sh", "-c", "sleep 300", markerProp+owner)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
		return cmd
	}

	dead := mkOwner("1-deadbeef")
	orphan := spawn(dead)
	live := mkOwner("2-feedface")
	lock, err := os.OpenFile(filepath.Join(live, ownerLockName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	kept := spawn(live)

	reapOwner(dead)
	reapOwner(live)

	done := make(chan error, 1)
	go func() { done <- orphan.Wait() }()
	select {
	case err := <-done:
		if ws, ok := orphan.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("orphan ended with %v, want killed by SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("orphan of a dead owner still running after reapOwner")
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Fatalf("dead owner dir still there (stat: %v)", err)
	}
	if err := syscall.Kill(kept.Process.Pid, 0); err != nil {
		t.Fatalf("process of a live owner was killed: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("live owner dir removed: %v", err)
	}
}

// TestVersions starts each version of the matrix (one node, ZooKeeper or
// KRaft) and does a produce/consume round trip; in ZooKeeper mode, Close
// kills ZooKeeper too. The ApiVersions each answers are logged: what the
// compatibility table is drawn from. `make test` runs 2.8.2 with
// ZooKeeper (the oldest, and the ZooKeeper path); FERRY_VERSIONS=all every
// variant.
func TestVersions(t *testing.T) {
	for _, v := range Matrix() {
		t.Run(v.String(), func(t *testing.T) {
			if !FullMatrix() && v != (Variant{Version: "2.8.2", ZooKeeper: true}) {
				t.Skip("FERRY_VERSIONS=all (make test-versions) runs the whole matrix")
			}
			start := time.Now()
			c := Start(t, 1, v.Options()...)
			t.Logf("Kafka %s ready in %v at %s, cluster ID %s", v, time.Since(start).Round(time.Millisecond), c.Bootstrap(), c.ClusterID())
			if c.Version() != v.Version || c.ZooKeeper() != v.ZooKeeper || c.ClusterID() == "" {
				t.Fatalf("cluster reports version %s, ZooKeeper %v, cluster ID %q", c.Version(), c.ZooKeeper(), c.ClusterID())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cl := newClient(t, c)
			logApiVersions(t, ctx, cl)
			createTopic(t, ctx, kadm.NewClient(cl), "round", 1, 1)
			for i, val := range []string{"first", "second"} {
				r, err := cl.ProduceSync(ctx, &kgo.Record{Topic: "round", Value: []byte(val)}).First()
				if err != nil || r.Offset != int64(i) {
					t.Fatalf("produce %q: offset %d, %v; want offset %d", val, r.Offset, err, i)
				}
			}
			consumer := newClient(t, c, kgo.ConsumeTopics("round"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			var got []string
			for len(got) < 2 {
				fs := consumer.PollFetches(ctx)
				if err := ctx.Err(); err != nil {
					t.Fatalf("consumed %v before %v", got, err)
				}
				fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
				fs.EachRecord(func(r *kgo.Record) { got = append(got, fmt.Sprintf("%d:%s", r.Offset, r.Value)) })
			}
			if fmt.Sprint(got) != "[0:first 1:second]" {
				t.Fatalf("consumed %v, want [0:first 1:second]", got)
			}
			if !v.ZooKeeper {
				return
			}
			zk := c.zk.addr()
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if conn, err := net.DialTimeout("tcp", zk, time.Second); err == nil {
				conn.Close()
				t.Fatalf("ZooKeeper at %s still accepts connections after Close", zk)
			}
		})
	}
}

// logApiVersions logs the versions of the APIs Ferry's compatibility
// depends on, as the broker answers them.
func logApiVersions(t *testing.T, ctx context.Context, cl *kgo.Client) {
	t.Helper()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("ApiVersions: %v", err)
	}
	max := map[int16]int16{}
	for _, k := range resp.ApiKeys {
		max[k.ApiKey] = k.MaxVersion
	}
	var b strings.Builder
	for _, key := range []int16{0, 1, 3, 22, 24, 26, 61, 65, 66, 68, 69} {
		name := kmsg.NameForKey(key)
		if v, ok := max[key]; ok {
			fmt.Fprintf(&b, " %s=v%d", name, v)
		} else {
			fmt.Fprintf(&b, " %s=absent", name)
		}
	}
	var feats []string
	for _, f := range resp.FinalizedFeatures {
		feats = append(feats, fmt.Sprintf("%s=%d", f.Name, f.MaxVersionLevel))
	}
	t.Logf("ApiVersions:%s; finalized features %v", b.String(), feats)
}
