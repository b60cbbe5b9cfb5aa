package main

// Ferry in front of, mirroring from and switching between Apache Kafka
// versions (kafkatest.Matrix: 2.8 with ZooKeeper, 3.6 and 3.9 with KRaft
// and with ZooKeeper, 4.4): what docs/COMPATIBILITY.md claims is what these
// tests show. `make test` runs a slice of the matrix (frontSlice,
// migrationSlice); FERRY_VERSIONS=all (`make test-versions`) all of it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// The variants `make test` runs: Ferry in front of 3.9 (KRaft), and a
// migration from 3.9 with ZooKeeper to 4.4 and back.
var (
	frontSlice     = kafkatest.Variant{Version: "3.9.1"}
	migrationSlice = kafkatest.Variant{Version: "3.9.1", ZooKeeper: true}
)

// inMatrix skips a variant the run does not cover.
func inMatrix(t *testing.T, v, slice kafkatest.Variant) {
	t.Helper()
	if testing.Short() {
		t.Skip("real Kafka")
	}
	if !kafkatest.FullMatrix() && v != slice {
		t.Skip("FERRY_VERSIONS=all (make test-versions) runs the whole version matrix")
	}
}

// versionFlow is a producer, a consumer group and a transactional producer
// through Ferry, kept across switches, and what each was acknowledged.
type versionFlow struct {
	t                 *testing.T
	addr              string
	topic, txnTopic   string
	group             string
	prod, cons, txn   *kgo.Client
	next              map[int32]int64  // topic: the offset the next record of each partition goes to
	committedTxn      map[int64]string // txnTopic partition 0: committed record values by offset
	abortedTxn        map[string]bool  // values of aborted transactions
	consumedUpTo      map[int32]int64  // what the group has read and committed
	txnRound, plainNo int
}

const flowParts = 2

func newVersionFlow(t *testing.T, ctx context.Context, addr, name string) *versionFlow {
	t.Helper()
	f := &versionFlow{t: t, addr: addr, topic: name, txnTopic: name + "-txn", group: name + "-group",
		next: map[int32]int64{}, committedTxn: map[int64]string{}, abortedTxn: map[string]bool{}, consumedUpTo: map[int32]int64{}}
	createTopicVia(t, ctx, addr, f.topic, flowParts)
	createTopicVia(t, ctx, addr, f.txnTopic, 1)
	// Idempotent (franz-go's default), one partition chosen per record.
	f.prod = newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(f.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RecordDeliveryTimeout(2*time.Minute))
	f.cons = newClient(t, kgo.SeedBrokers(addr), kgo.ConsumeTopics(f.topic), kgo.ConsumerGroup(f.group),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	f.txn = newClient(t, kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(f.txnTopic), kgo.TransactionalID(name+"-txn"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(2*time.Minute))
	return f
}

// produce writes n records to each partition and asserts each was
// acknowledged at the offset after the last.
func (f *versionFlow) produce(ctx context.Context, n int) map[int32]map[int64]string {
	f.t.Helper()
	f.plainNo++
	var rs []*kgo.Record
	for p := int32(0); p < flowParts; p++ {
		for i := range n {
			rs = append(rs, &kgo.Record{Partition: p, Value: []byte(fmt.Sprintf("plain%d-p%d-%03d", f.plainNo, p, i))})
		}
	}
	want := map[int32]map[int64]string{}
	for _, r := range f.prod.ProduceSync(ctx, rs...) {
		if r.Err != nil {
			f.t.Fatalf("idempotent produce %s through Ferry: %v", r.Record.Value, r.Err)
		}
		p := r.Record.Partition
		if r.Record.Offset != f.next[p] {
			f.t.Fatalf("%s acknowledged at %d/%d, want offset %d", r.Record.Value, p, r.Record.Offset, f.next[p])
		}
		if want[p] == nil {
			want[p] = map[int64]string{}
		}
		want[p][f.next[p]] = string(r.Record.Value)
		f.next[p]++
	}
	return want
}

// consume has the group read exactly want (nothing before it: the group
// resumes where it committed), commits, and asserts the committed offsets
// through Ferry.
func (f *versionFlow) consume(ctx context.Context, want map[int32]map[int64]string) {
	f.t.Helper()
	left := 0
	for _, offs := range want {
		left += len(offs)
	}
	for left > 0 {
		fs := f.cons.PollFetches(ctx)
		if ctx.Err() != nil {
			f.t.Fatalf("the group read all but %d of the records produced", left)
		}
		fs.EachError(func(topic string, p int32, err error) { f.t.Logf("fetch %s[%d] through Ferry: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			v, ok := want[r.Partition][r.Offset]
			if !ok || v != string(r.Value) {
				f.t.Fatalf("the group read %q at %d/%d; want %q (the group resumes at %v, its committed offsets)", r.Value, r.Partition, r.Offset, v, f.consumedUpTo)
			}
			delete(want[r.Partition], r.Offset)
			left--
		})
	}
	if err := f.cons.CommitUncommittedOffsets(ctx); err != nil {
		f.t.Fatalf("commit through Ferry: %v", err)
	}
	for p := int32(0); p < flowParts; p++ {
		f.consumedUpTo[p] = f.next[p]
	}
	offs, err := kadm.NewClient(newClient(f.t, kgo.SeedBrokers(f.addr))).FetchOffsets(ctx, f.group)
	if err != nil {
		f.t.Fatalf("committed offsets through Ferry: %v", err)
	}
	for p := int32(0); p < flowParts; p++ {
		if o, _ := offs.Lookup(f.topic, p); o.At != f.consumedUpTo[p] {
			f.t.Fatalf("partition %d: committed offset %d through Ferry, want %d", p, o.At, f.consumedUpTo[p])
		}
	}
}

// checkCommittedOn asserts the group's committed offsets read directly on
// a cluster.
func (f *versionFlow) checkCommittedOn(addrs []string) {
	f.t.Helper()
	got := committed(f.t, addrs, f.group, f.topic)
	for p := int32(0); p < flowParts; p++ {
		if got[p] != f.consumedUpTo[p] {
			f.t.Fatalf("committed offsets of %s on %v: %v, want %v", f.group, addrs, got, f.consumedUpTo)
		}
	}
}

// transactions commits a transaction, aborts one and commits another, and
// asserts their records' offsets: each after the last one's marker. After
// a switch (afterSwitch) a transaction may fail once, as an application
// meets it: aborted (which gives the producer a new epoch) and begun again;
// the aborted attempt's records must never be read read_committed.
func (f *versionFlow) transactions(ctx context.Context, afterSwitch bool) {
	f.t.Helper()
	failed := 0
	for _, commit := range []bool{true, false, true} {
		for {
			f.txnRound++
			err := f.transaction(ctx, commit)
			if err == nil {
				break
			}
			if failed++; !afterSwitch || failed > 1 {
				f.t.Fatalf("transaction %d (commit %v) through Ferry: %v (%d failed since the last switch)", f.txnRound, commit, err, failed)
			}
			f.t.Logf("transaction %d, the first after a switch, failed and was aborted: %v", f.txnRound, err)
		}
	}
	f.readCommitted(ctx)
}

// transaction runs one transaction of 5 records on partition 0, ended as
// commit says. An error is returned once the transaction is aborted.
func (f *versionFlow) transaction(ctx context.Context, commit bool) error {
	f.t.Helper()
	if err := f.txn.BeginTransaction(); err != nil {
		f.t.Fatal(err)
	}
	var rs []*kgo.Record
	for i := range 5 {
		rs = append(rs, &kgo.Record{Partition: 0, Value: []byte(fmt.Sprintf("txn%d-commit=%v-%d", f.txnRound, commit, i))})
	}
	res := f.txn.ProduceSync(ctx, rs...)
	err := res.FirstErr()
	if err == nil {
		err = f.txn.EndTransaction(ctx, kgo.TransactionEndTry(commit))
	}
	if err != nil {
		for _, r := range rs {
			f.abortedTxn[string(r.Value)] = true
		}
		if aerr := f.txn.EndTransaction(ctx, kgo.TryAbort); aerr != nil {
			f.t.Fatalf("aborting transaction %d after %v: %v", f.txnRound, err, aerr)
		}
		return err
	}
	first := res[0].Record.Offset
	for i, r := range res {
		if r.Record.Offset != first+int64(i) {
			f.t.Fatalf("transactional record %d at %d, want %d", i, r.Record.Offset, first+int64(i))
		}
		if commit {
			f.committedTxn[r.Record.Offset] = string(r.Record.Value)
		} else {
			f.abortedTxn[string(r.Record.Value)] = true
		}
	}
	return nil
}

// readCommitted reads the transactional topic through Ferry,
// read_committed, from the start: exactly the committed records, at their
// offsets (the last round ends with a commit, so reading up to it passes
// every aborted one).
func (f *versionFlow) readCommitted(ctx context.Context) {
	f.t.Helper()
	cl := newClient(f.t, kgo.SeedBrokers(f.addr), kgo.ConsumeTopics(f.txnTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	defer cl.Close()
	var last int64
	for o := range f.committedTxn {
		last = max(last, o)
	}
	seen := map[int64]string{}
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			f.t.Fatalf("read_committed through Ferry read %d of %d committed records", len(seen), len(f.committedTxn))
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if f.abortedTxn[string(r.Value)] {
				f.t.Fatalf("read_committed through Ferry read %q of an aborted transaction at %d", r.Value, r.Offset)
			}
			seen[r.Offset] = string(r.Value)
			done = done || r.Offset >= last
		})
		if done {
			break
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(f.committedTxn) {
		f.t.Fatalf("read_committed through Ferry read %v, want the committed records %v", seen, f.committedTxn)
	}
}

// apiMax is what an ApiVersions answer from bootstrap offers, by key.
func apiMax(t *testing.T, ctx context.Context, bootstrap string) map[int16]int16 {
	t.Helper()
	resp := apiVersions(t, ctx, bootstrap)
	out := map[int16]int16{}
	for _, k := range resp.ApiKeys {
		out[k.ApiKey] = k.MaxVersion
	}
	return out
}

// watchedKeys are the APIs docs/COMPATIBILITY.md tabulates.
var watchedKeys = []int16{0, 1, 3, 22, 24, 61, 65, 66, 68}

func describeKeys(m map[int16]int16) string {
	var b []string
	for _, k := range watchedKeys {
		if v, ok := m[k]; ok {
			b = append(b, fmt.Sprintf("%s v%d", kmsg.NameForKey(k), v))
		} else {
			b = append(b, kmsg.NameForKey(k)+" absent")
		}
	}
	return strings.Join(b, ", ")
}

// checkAdvertised asserts that Ferry advertises no API at a version beyond
// what every configured cluster answers, nor one any lacks.
func checkAdvertised(t *testing.T, ctx context.Context, ferry string, clusters ...string) {
	t.Helper()
	via := apiMax(t, ctx, ferry)
	for _, c := range clusters {
		direct := apiMax(t, ctx, c)
		t.Logf("cluster at %s offers %s", c, describeKeys(direct))
		var keys []int
		for k := range via {
			keys = append(keys, int(k))
		}
		sort.Ints(keys)
		for _, k := range keys {
			if k == int(kmsg.SASLHandshake) || k == int(kmsg.ApiVersions) {
				continue // answered by Ferry itself
			}
			if d, ok := direct[int16(k)]; !ok || via[int16(k)] > d {
				t.Fatalf("Ferry advertises %s up to v%d; the cluster at %s offers %v (present %v)", kmsg.NameForKey(int16(k)), via[int16(k)], c, d, ok)
			}
		}
	}
	t.Logf("Ferry advertises %s", describeKeys(via))
}

// TestVersionsFront: Ferry in front of one cluster of each version: an
// idempotent producer's records at their offsets, a group reads them and
// its commits are read back, transactions committed and aborted read
// read_committed; Ferry advertises no more than the cluster.
func TestVersionsFront(t *testing.T) {
	for _, v := range kafkatest.Matrix() {
		t.Run(v.String(), func(t *testing.T) {
			inMatrix(t, v, frontSlice)
			c := kafkatest.Start(t, 1, append(v.Options(), kafkatest.WithName("front"))...)
			_, addr := startNode(t, fmt.Sprintf(`
cluster_id: ferry-versions-front
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
clusters:
  - {name: primary, bootstrap: [%s]}
`, c.Bootstrap()))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			checkAdvertised(t, ctx, addr, c.Bootstrap())
			f := newVersionFlow(t, ctx, addr, "front")
			f.consume(ctx, f.produce(ctx, 10))
			f.checkCommittedOn(c.Addrs())
			f.transactions(ctx, false)
			f.consume(ctx, f.produce(ctx, 5))

			// A KIP-848 consumer's first heartbeat gets the answer the
			// cluster gives: 3.9 offers the API with the protocol off by
			// default and refuses it UNSUPPORTED_VERSION (which the Java
			// consumer reports as the cluster not supporting the CONSUMER
			// protocol); 4.x admits the member. Older clusters do not
			// offer it, nor does Ferry in front of them (checkAdvertised).
			key := int16(kmsg.ConsumerGroupHeartbeat)
			if v, ok := apiMax(t, ctx, c.Bootstrap())[key]; ok {
				direct := firstHeartbeat(t, ctx, c.Bootstrap(), "kip848-direct", f.topic, v)
				via := firstHeartbeat(t, ctx, addr, "kip848-via", f.topic, v)
				if via != direct {
					t.Fatalf("ConsumerGroupHeartbeat v%d: %v through Ferry, %v from the cluster", v, kerr.ErrorForCode(via), kerr.ErrorForCode(direct))
				}
				t.Logf("ConsumerGroupHeartbeat v%d: %v, through Ferry as from the cluster", v, kerr.ErrorForCode(via))
			}
		})
	}
}

// firstHeartbeat sends a new KIP-848 member's first ConsumerGroupHeartbeat
// (version v, subscribed to topic) to group through bootstrap and returns
// its error code; a member admitted leaves again.
func firstHeartbeat(t *testing.T, ctx context.Context, bootstrap, group, topic string, v int16) int16 {
	t.Helper()
	cl := newClient(t, kgo.SeedBrokers(bootstrap)) // asks at v: the highest both offer
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Version = v
	req.Group = group
	if v >= 1 {
		req.MemberID = "kip848-member-0000000" // from v1 the client names itself
	}
	req.RebalanceTimeoutMillis = 30000
	req.SubscribedTopicNames = []string{topic}
	req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("ConsumerGroupHeartbeat v%d through %s: %v", v, bootstrap, err)
	}
	if resp.ErrorCode == 0 {
		leave := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		leave.Version, leave.Group, leave.MemberEpoch = v, group, -1
		if resp.MemberID != nil {
			leave.MemberID = *resp.MemberID
		}
		if _, err := leave.RequestWith(ctx, cl); err != nil {
			t.Fatalf("ConsumerGroupHeartbeat leave through %s: %v", bootstrap, err)
		}
	}
	return resp.ErrorCode
}

// TestVersionsMigration: each older variant as the active cluster, 4.4 the
// standby, mirrored at the same offsets; a planned switch to 4.4 with the
// producer, the group and the transactional producer carrying on (records
// at the offsets after the old cluster's, the group resuming at its
// committed offsets); the failback to the older cluster and the switch to
// 4.4 again; then the older cluster retired from the configuration (the
// member restarted with 4.4 alone): clients are offered 4.4's versions and
// feature levels, and carry on.
func TestVersionsMigration(t *testing.T) {
	for _, v := range kafkatest.Matrix() {
		if v.Version == kafkatest.Version() {
			continue
		}
		t.Run(v.String(), func(t *testing.T) {
			inMatrix(t, v, migrationSlice)
			old := kafkatest.Start(t, 1, append(v.Options(), kafkatest.WithName("old"))...)
			nu := kafkatest.Start(t, 1, kafkatest.WithName("new"))
			listen := freeAddr(t)
			config := func(clusters ...*kafkatest.Cluster) string {
				y := fmt.Sprintf("cluster_id: ferry-versions-migration\nlisten: %s\nadmin_listen: 127.0.0.1:0\nclusters:\n", listen)
				for _, c := range clusters {
					name := "new"
					if c == old {
						name = "old"
					}
					y += fmt.Sprintf("  - {name: %s, bootstrap: [%s]}\n", name, c.Bootstrap())
				}
				if len(clusters) == 2 {
					y += "mirror: {sync_interval: 1s}\n"
				}
				return y
			}
			path := writeConfig(t, config(old, nu))
			n, addr := startNode(t, config(old, nu))
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			// Both configured: clients are offered what both clusters
			// support, the older one's versions.
			checkAdvertised(t, ctx, addr, old.Bootstrap(), nu.Bootstrap())

			f := newVersionFlow(t, ctx, addr, "migrated")
			f.consume(ctx, f.produce(ctx, 10))
			f.transactions(ctx, false)
			mirrored := func(from, to *kafkatest.Cluster) {
				t.Helper()
				wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
				defer wcancel()
				if err := n.mirror.WaitCaughtUp(wctx, f.topic, f.txnTopic); err != nil {
					t.Fatalf("mirror %s → %s: %v", from.Version(), to.Version(), err)
				}
				for _, topic := range []string{f.topic, f.txnTopic} {
					ends := settledEndOffsets(t, from.Addrs(), topic)
					if got := endOffsets(t, to.Addrs(), topic); fmt.Sprint(got) != fmt.Sprint(ends) {
						t.Fatalf("%s: end offsets %v on the %s cluster, %v on the %s one", topic, got, to.Version(), ends, from.Version())
					}
				}
			}
			switchTo := func(to string, gen uint32) {
				t.Helper()
				start := time.Now()
				st, err := n.switchover(ctx, routing.Request{To: to, Timeout: time.Minute})
				var se *routing.Error
				if errors.As(err, &se) {
					t.Fatalf("switch to %s refused after %v: %s (%v)", to, time.Since(start), se.Reason, err)
				}
				if err != nil || st.Generation != gen || st.Active != to {
					t.Fatalf("switch to %s: %+v, %v", to, st, err)
				}
				t.Logf("switched to %s in %v (steps %v)", to, time.Since(start).Round(time.Millisecond), st.Last.Steps)
			}
			// The same clients go on after each switch: the producer's
			// records after the other cluster's, the group at its
			// committed offsets, on the cluster switched to.
			for i, to := range []*kafkatest.Cluster{nu, old, nu} {
				from, name := old, "new"
				if to == old {
					from, name = nu, "old"
				}
				if to == old && strings.HasPrefix(v.Version, "2.") {
					// Before 3.0 (no DescribeTransactions) the
					// mirror cannot write to it: its partitions halt
					// saying so, and the failback is refused naming
					// them. The clients stay on 4.4.
					failbackRefused(t, ctx, n, f.topic, f.txnTopic)
					break
				}
				mirrored(from, to)
				switchTo(name, uint32(i+1))
				f.consume(ctx, f.produce(ctx, 10))
				f.checkCommittedOn(to.Addrs())
				f.transactions(ctx, true)
			}

			// The older cluster retired from the configuration while
			// the member runs (SIGHUP's reload): the clients carry on
			// over the connections they have, new connections are
			// offered 4.4's versions and feature levels.
			retired := func() {
				t.Helper()
				checkAdvertised(t, ctx, addr, nu.Bootstrap())
				via, direct := apiMax(t, ctx, addr), apiMax(t, ctx, nu.Bootstrap())
				for _, k := range []int16{0, 1, 3} {
					if via[k] != direct[k] {
						t.Fatalf("with the older cluster retired Ferry advertises %s v%d; 4.4 offers v%d", kmsg.NameForKey(k), via[k], direct[k])
					}
				}
				if fv, nv := finalized(t, ctx, addr), finalized(t, ctx, nu.Bootstrap()); fv["transaction.version"] != nv["transaction.version"] || fv["group.version"] != nv["group.version"] {
					t.Fatalf("with the older cluster retired Ferry finalizes %v; 4.4 %v", fv, nv)
				}
				f.consume(ctx, f.produce(ctx, 10))
				f.checkCommittedOn(nu.Addrs())
				f.transactions(ctx, true)
				var se *routing.Error
				if _, err := n.switchover(ctx, routing.Request{To: "old"}); !errors.As(err, &se) || se.Reason != routing.ReasonUnknownCluster {
					t.Fatalf("a switch to the retired cluster: %v; want it refused, %s", err, routing.ReasonUnknownCluster)
				}
			}
			sf := &serveFlags{config: path}
			cfg, err := serveConfigEnv(sf, nil)
			if err != nil {
				t.Fatal(err)
			}
			r := newReloader(sf, cfg, zap.NewAtomicLevelAt(zap.InfoLevel), zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
			r.attach(n)
			if err := os.WriteFile(path, []byte(config(nu)), 0o644); err != nil {
				t.Fatal(err)
			}
			if applied, restart := r.reload(nil); !slices.Contains(applied, "clusters") || len(restart) != 0 {
				t.Fatalf("reload without the older cluster: applied %v, restart_needed %v; want clusters applied", applied, restart)
			}
			if st := n.admin.Status(ctx); len(st.Clusters) != 1 || st.Clusters[0].Name != "new" || n.mirror.cur.Load() != nil {
				t.Fatalf("after the retire /status lists clusters %+v, a mirror runs: %v", st.Clusters, n.mirror.cur.Load() != nil)
			}
			retired()

			// A restart with 4.4 alone, at the same address, serves as
			// the reload left it.
			n.Close()
			n, addr = startNode(t, config(nu))
			retired()
		})
	}
}

// failbackRefused waits for the mirror into a cluster older than 3.0 to
// halt every partition of topics with target_too_old, and asserts that a
// planned switch to it is refused at once, naming them and why.
func failbackRefused(t *testing.T, ctx context.Context, n *node, topics ...string) {
	t.Helper()
	testwait.Eventually(t, time.Minute, "the mirror into the older cluster to halt", func() error {
		halted := map[string]int{}
		for _, st := range n.mirror.Info().Partitions {
			if st.State == mirror.StateHalted && mirror.HaltReason(st.Err) == "target_too_old" {
				halted[st.Topic]++
			}
		}
		for _, topic := range topics {
			if halted[topic] == 0 {
				return fmt.Errorf("halted with target_too_old: %v; partitions %+v", halted, n.mirror.Info().Partitions)
			}
		}
		return nil
	})
	start := time.Now()
	_, err := n.switchover(ctx, routing.Request{To: "old", Timeout: time.Minute})
	var se *routing.Error
	if !errors.As(err, &se) || se.Reason != routing.ReasonHalted || !strings.Contains(strings.Join(se.Partitions, "\n"), "DescribeTransactions") {
		t.Fatalf("failback to a cluster older than 3.0: %v; want it refused as halted, naming DescribeTransactions", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the failback was refused after %v, not at once", took)
	}
	t.Logf("failback refused in %v: %v", time.Since(start).Round(time.Millisecond), err)
}
