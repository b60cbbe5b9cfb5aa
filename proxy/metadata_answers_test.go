package proxy

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/connstats"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/routing"
)

// TestMetadataKeptAnswerFollowsChanges: the member answers a Metadata
// request for every topic from the answer it kept while the cluster's
// answer is unchanged, and never after anything that goes into it changed:
// a topic created, a leader moved, the generation, the members.
func TestMetadataKeptAnswerFollowsChanges(t *testing.T) {
	kf := newKfake(t, 2, kfake.SeedTopics(3, "first"))
	table := routing.NewTable(routing.State{Generation: 0, Active: "a"})
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(table))
	cl := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ask := func() *kmsg.MetadataResponse {
		t.Helper()
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// check compares every partition's leader epoch with the cluster's,
	// shifted by gen, and the topics and brokers listed with those wanted.
	check := func(resp *kmsg.MetadataResponse, gen uint32, topics []string, brokers int) {
		t.Helper()
		if len(resp.Brokers) != brokers {
			t.Fatalf("%d brokers listed, want %d", len(resp.Brokers), brokers)
		}
		got := map[string]bool{}
		for _, rt := range resp.Topics {
			got[*rt.Topic] = true
			for _, p := range rt.Partitions {
				want := routing.VirtualEpoch(gen, kf.PartitionInfo(*rt.Topic, p.Partition).Epoch)
				if p.LeaderEpoch != want {
					t.Fatalf("%s[%d]: leader epoch %d, want %d", *rt.Topic, p.Partition, p.LeaderEpoch, want)
				}
			}
		}
		if len(got) != len(topics) {
			t.Fatalf("topics %v, want %v", got, topics)
		}
		for _, n := range topics {
			if !got[n] {
				t.Fatalf("topics %v, want %v", got, topics)
			}
		}
	}

	check(ask(), 0, []string{"first"}, s.Lanes())
	kept := s.metaAnswers.last.Load()
	if kept == nil {
		t.Fatal("no answer kept")
	}
	// Unchanged (kfake lists topics and partitions in a new order each
	// time): the same kept answer.
	for range 3 {
		check(ask(), 0, []string{"first"}, s.Lanes())
	}
	if s.metaAnswers.last.Load() != kept {
		t.Fatal("the cluster's answer did not change, the kept answer did")
	}

	if err := kf.CreateTopic("second", 2, nil); err != nil {
		t.Fatal(err)
	}
	check(ask(), 0, []string{"first", "second"}, s.Lanes())

	leader := kf.PartitionInfo("first", 1).Leader
	if err := kf.MoveTopicPartition("first", 1, 1-leader); err != nil {
		t.Fatal(err)
	}
	check(ask(), 0, []string{"first", "second"}, s.Lanes())

	table.Advance(routing.State{Generation: 3, Active: "a"})
	check(ask(), 3, []string{"first", "second"}, s.Lanes())

	members := s.brokers.(*routing.StaticBrokerSet)
	one := members.Brokers()[0]
	members.Set([]routing.Broker{one, {NodeID: 1, Host: "127.0.0.1", Port: one.Port + 1}})
	check(ask(), 3, []string{"first", "second"}, 2*s.Lanes())

	// Another request installs a snapshot of its own (here: one without
	// any topic): an answer from the kept one installs the cluster's
	// again, which the member routes by.
	s.cluster("a").Install(kmsg.NewPtrMetadataResponse(), true)
	check(ask(), 3, []string{"first", "second"}, 2*s.Lanes())
	if snap := s.cluster("a").Snapshot(); len(snap.Topics) != 2 {
		t.Fatalf("snapshot holds %d topics after an answer from the kept one, want 2", len(snap.Topics))
	}
}

// TestSameMetadata: two answers are the same whatever the order of their
// topics and partitions, and differ in any field the member reads.
func TestSameMetadata(t *testing.T) {
	build := func() *kmsg.MetadataResponse {
		r := kmsg.NewPtrMetadataResponse()
		r.ClusterID = kmsg.StringPtr("c")
		r.ControllerID = 1
		for b := range int32(3) {
			r.Brokers = append(r.Brokers, kmsg.MetadataResponseBroker{NodeID: b, Host: "h", Port: 9092 + b, Rack: kmsg.StringPtr("r")})
		}
		for i := range 4 {
			rt := kmsg.NewMetadataResponseTopic()
			rt.Topic = kmsg.StringPtr(fmt.Sprintf("t%d", i))
			rt.TopicID = [16]byte{byte(i + 1)}
			for p := range int32(5) {
				rt.Partitions = append(rt.Partitions, kmsg.MetadataResponseTopicPartition{
					Partition: p, Leader: p % 3, LeaderEpoch: 7, Replicas: []int32{p % 3, (p + 1) % 3}, ISR: []int32{p % 3}, OfflineReplicas: []int32{},
				})
			}
			r.Topics = append(r.Topics, rt)
		}
		return r
	}
	a := build()
	idx := indexTopics(a)

	shuffled := build()
	rand.Shuffle(len(shuffled.Topics), func(i, j int) { shuffled.Topics[i], shuffled.Topics[j] = shuffled.Topics[j], shuffled.Topics[i] })
	for _, rt := range shuffled.Topics {
		rand.Shuffle(len(rt.Partitions), func(i, j int) { rt.Partitions[i], rt.Partitions[j] = rt.Partitions[j], rt.Partitions[i] })
	}
	if !sameMetadata(a, idx, shuffled) {
		t.Fatal("the same answer in another order is not the same")
	}
	// The controller ID, which a KRaft broker picks at random among the
	// live brokers for each answer, goes into neither the translation nor
	// the snapshot (upstream.Cluster.Controller).
	otherController := build()
	otherController.ControllerID = 2
	if !sameMetadata(a, idx, otherController) {
		t.Fatal("the same answer naming another controller is not the same")
	}

	for _, change := range []struct {
		name string
		fn   func(*kmsg.MetadataResponse)
	}{
		{"error code", func(r *kmsg.MetadataResponse) { r.ErrorCode = 1 }},
		{"cluster ID", func(r *kmsg.MetadataResponse) { r.ClusterID = kmsg.StringPtr("d") }},
		{"cluster operations", func(r *kmsg.MetadataResponse) { r.AuthorizedOperations = 8 }},
		{"a broker's host", func(r *kmsg.MetadataResponse) { r.Brokers[1].Host = "g" }},
		{"a broker's port", func(r *kmsg.MetadataResponse) { r.Brokers[1].Port++ }},
		{"a broker's rack", func(r *kmsg.MetadataResponse) { r.Brokers[1].Rack = nil }},
		{"a broker more", func(r *kmsg.MetadataResponse) { r.Brokers = append(r.Brokers, r.Brokers[0]) }},
		{"a topic less", func(r *kmsg.MetadataResponse) { r.Topics = r.Topics[1:] }},
		{"a topic renamed", func(r *kmsg.MetadataResponse) { r.Topics[2].Topic = kmsg.StringPtr("u") }},
		{"a topic's error", func(r *kmsg.MetadataResponse) { r.Topics[2].ErrorCode = 3 }},
		{"a topic's ID", func(r *kmsg.MetadataResponse) { r.Topics[2].TopicID[5] = 9 }},
		{"a topic internal", func(r *kmsg.MetadataResponse) { r.Topics[2].IsInternal = true }},
		{"a topic's operations", func(r *kmsg.MetadataResponse) { r.Topics[2].AuthorizedOperations = 8 }},
		{"a partition less", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions = r.Topics[2].Partitions[1:] }},
		{"a partition renumbered", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions[4].Partition = 9 }},
		{"a partition's error", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions[3].ErrorCode = 5 }},
		{"a partition's leader", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions[3].Leader = 2 }},
		{"a partition's epoch", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions[3].LeaderEpoch++ }},
		{"a partition's replicas", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions[3].Replicas = []int32{0, 2} }},
		{"a partition's ISR", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions[3].ISR = []int32{0, 1} }},
		{"a partition's offline replicas", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions[3].OfflineReplicas = []int32{1} }},
		// As many topics and partitions, one listed twice, another not.
		{"a topic twice", func(r *kmsg.MetadataResponse) { r.Topics[3] = r.Topics[2] }},
		{"a partition twice", func(r *kmsg.MetadataResponse) { r.Topics[2].Partitions[4] = r.Topics[2].Partitions[3] }},
	} {
		b := build()
		change.fn(b)
		if sameMetadata(a, idx, b) {
			t.Errorf("%s: taken as the same answer", change.name)
		}
	}

	// An answer with a topic asked for by an unknown ID (no name) or two
	// topics of one name is never kept.
	noName := build()
	noName.Topics[0].Topic = nil
	dup := build()
	dup.Topics[1].Topic = dup.Topics[0].Topic
	for _, r := range []*kmsg.MetadataResponse{noName, dup} {
		if indexTopics(r) != nil || sameMetadata(r, indexTopics(r), r) {
			t.Error("an answer that cannot be indexed by name is kept")
		}
	}
}

// TestKeptMetadataAnswerCountsErrors: each answer given from the kept one
// counts its error codes in the connection's statistics, as an answer
// translated anew does.
func TestKeptMetadataAnswerCountsErrors(t *testing.T) {
	kf := newKfake(t, 1)
	host, port, err := net.SplitHostPort(kf.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	// Every topic: one, whose partition has no leader.
	kf.ControlKey(kmsg.Metadata.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		resp := kr.ResponseKind().(*kmsg.MetadataResponse)
		resp.Brokers = []kmsg.MetadataResponseBroker{{NodeID: 0, Host: host, Port: int32(p)}}
		resp.ControllerID = 0
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic, rt.TopicID = kmsg.StringPtr("leaderless"), [16]byte{1}
		rt.Partitions = []kmsg.MetadataResponseTopicPartition{{Partition: 0, ErrorCode: kerr.LeaderNotAvailable.Code, Leader: -1}}
		resp.Topics = []kmsg.MetadataResponseTopic{rt}
		return resp, nil, true
	})
	s, addr := startFerry(t, kf.ListenAddrs())
	cl := newClient(t, addr, kgo.ClientID("asker"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const asks = 3
	for range asks {
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 || resp.Topics[0].Partitions[0].ErrorCode != kerr.LeaderNotAvailable.Code {
			t.Fatalf("topics %+v, want leaderless with LEADER_NOT_AVAILABLE", resp.Topics)
		}
	}
	// The client asks over its seed connection and its broker's: summed.
	sum := func(cz *connstats.Report) (named, total uint64) {
		for _, c := range cz.Connections {
			named, total = named+c.Errors["LEADER_NOT_AVAILABLE"], total+c.ErrorsTotal
		}
		return named, total
	}
	cz := waitConnz(t, s, connstats.Query{ClientID: "asker"}, "errors counted", func(cz *connstats.Report) bool {
		_, total := sum(cz)
		return total >= asks
	})
	if named, total := sum(cz); named != asks || total != asks {
		t.Fatalf("LEADER_NOT_AVAILABLE counted %d times (errors in all %d), want %d", named, total, asks)
	}
}

// TestMetadataSameBytes: an answer from the cluster with the bytes of the
// one the kept translation came from is not decoded, and gives the kept
// translation; any change to the bytes, or to the generation or the
// members the translation was made under, gives a new translation that
// says what the cluster does. The broker here lists topics and partitions
// in one order, as Kafka does from one request to the next (kfake's own
// answers do not: its maps), and names another controller each time, as a
// KRaft broker does.
func TestMetadataSameBytes(t *testing.T) {
	kf := newKfake(t, 1)
	host, port, err := net.SplitHostPort(kf.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	var (
		mu         sync.Mutex
		epochs     = []int32{5, 5, 5, 5}
		reversed   bool  // the partitions listed last to first
		controller int32 // named in the next answer: a KRaft broker picks one at random each time
	)
	kf.ControlKey(kmsg.Metadata.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		resp := kr.ResponseKind().(*kmsg.MetadataResponse)
		resp.Brokers = []kmsg.MetadataResponseBroker{{NodeID: 0, Host: host, Port: int32(p)}}
		controller++
		resp.ControllerID = controller
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic, rt.TopicID = kmsg.StringPtr("orders"), [16]byte{1}
		for i, e := range epochs {
			rt.Partitions = append(rt.Partitions, kmsg.MetadataResponseTopicPartition{
				Partition: int32(i), Leader: 0, LeaderEpoch: e, Replicas: []int32{0}, ISR: []int32{0}, OfflineReplicas: []int32{},
			})
		}
		if reversed {
			slices.Reverse(rt.Partitions)
		}
		resp.Topics = []kmsg.MetadataResponseTopic{rt}
		return resp, nil, true
	})
	table := routing.NewTable(routing.State{Generation: 0, Active: "a"})
	s, addr := startFerry(t, kf.ListenAddrs(), WithRoutingTable(table))
	cl := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	counts := func() (c [len(metaHowNames)]float64) {
		for i := range c {
			c[i] = testutil.ToFloat64(s.metrics.metaAllBy[i])
		}
		return c
	}
	// ask asks for every topic and checks each partition's epoch against
	// the cluster's under gen, and that it was answered as want.
	ask := func(gen uint32, want metaHow) {
		t.Helper()
		before := counts()
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != len(epochs) {
			t.Fatalf("answer: %+v", resp.Topics)
		}
		for _, rp := range resp.Topics[0].Partitions {
			if w := routing.VirtualEpoch(gen, epochs[rp.Partition]); rp.LeaderEpoch != w {
				t.Fatalf("partition %d: leader epoch %d, want %d", rp.Partition, rp.LeaderEpoch, w)
			}
		}
		// The controller last named is the cluster's, however answered.
		if got := s.cluster("a").Controller(); got != controller {
			t.Fatalf("controller %d, the last answer named %d", got, controller)
		}
		after := counts()
		for i := range after {
			if d, w := after[i]-before[i], map[bool]float64{true: 1}[metaHow(i) == want]; d != w {
				t.Fatalf("answered %s %v times, want %v (wanted %s; before %v, after %v)", metaHowNames[i], d, w, metaHowNames[want], before, after)
			}
		}
	}

	ask(0, metaTranslated)
	// The client's connection to its broker (the lane) asks too: the
	// kept answer was made for the seed connection's request; both get it.
	ask(0, metaSameBytes)
	ask(0, metaSameBytes)

	mu.Lock()
	epochs[2]++ // a leader elected: one field, four bytes
	mu.Unlock()
	ask(0, metaTranslated)
	ask(0, metaSameBytes)

	// The same answer in another order: the same fields; its bytes are
	// then the ones compared.
	mu.Lock()
	reversed = true
	mu.Unlock()
	ask(0, metaSameFields)
	ask(0, metaSameBytes)

	// The same bytes under another generation: translated again.
	table.Advance(routing.State{Generation: 2, Active: "a"})
	ask(2, metaTranslated)
	ask(2, metaSameBytes)

	// And under other members.
	members := s.brokers.(*routing.StaticBrokerSet)
	one := members.Brokers()[0]
	members.Set([]routing.Broker{one, {NodeID: 1, Host: "127.0.0.1", Port: one.Port + 1}})
	ask(2, metaTranslated)
	ask(2, metaSameBytes)
}

// TestMetadataRequestsShareFlights: client requests for every topic that
// arrive while one is asked of the cluster share the next request, sent
// once that one is answered: twenty clients asking at once cost the
// cluster two answers, each client gets what the cluster's answer to its
// request says, and the changed answer is translated once for the twenty.
func TestMetadataRequestsShareFlights(t *testing.T) {
	kf := newKfake(t, 1)
	s, addr := startFerry(t, kf.ListenAddrs())
	host, port, err := net.SplitHostPort(kf.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	// Enough partitions that translating an answer takes a while: the
	// twenty requests woken at once would each translate it.
	const partitions = 5000
	var every atomic.Int32
	held, release := make(chan struct{}, 1), make(chan struct{})
	// The cluster's answers for every topic: the leader epoch is the
	// request's number, so that each answer differs from the one before.
	kf.ControlKey(kmsg.Metadata.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if kr.(*kmsg.MetadataRequest).Topics != nil {
			return nil, nil, false
		}
		n := every.Add(1)
		if n == 1 { // the first held until the others wait
			held <- struct{}{}
			kf.SleepControl(func() { <-release })
		}
		resp := kr.ResponseKind().(*kmsg.MetadataResponse)
		resp.Brokers = []kmsg.MetadataResponseBroker{{NodeID: 0, Host: host, Port: int32(p)}}
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic, rt.TopicID = kmsg.StringPtr("orders"), [16]byte{1}
		for i := range int32(partitions) {
			rt.Partitions = append(rt.Partitions, kmsg.MetadataResponseTopicPartition{Partition: i, LeaderEpoch: n, Replicas: []int32{0}, ISR: []int32{0}, OfflineReplicas: []int32{}})
		}
		resp.Topics = []kmsg.MetadataResponseTopic{rt}
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const clients = 20
	type answer struct {
		epoch int32
		err   error
	}
	answers := make(chan answer, clients+1)
	askFrom := func(cl *kgo.Client) {
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			answers <- answer{err: err}
			return
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != partitions {
			answers <- answer{err: fmt.Errorf("answer: %d topics", len(resp.Topics))}
			return
		}
		answers <- answer{epoch: resp.Topics[0].Partitions[0].LeaderEpoch}
	}
	go askFrom(newClient(t, addr))
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the first request did not reach the cluster")
	}
	for range clients {
		go askFrom(newClient(t, addr))
	}
	k := flightKey{up: s.cluster("a")}
	testwait.Until(t, 20*time.Second, "every client waiting for the next request", func() bool {
		s.metaAnswers.mu.Lock()
		defer s.metaAnswers.mu.Unlock()
		f := s.metaAnswers.waiting[k]
		return f != nil && f.joined == clients
	})
	translated := testutil.ToFloat64(s.metrics.metaAllBy[metaTranslated])
	close(release)
	epochs := map[int32]int{}
	for range clients + 1 {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		epochs[a.epoch]++
	}
	if n := every.Load(); n != 2 {
		t.Fatalf("%d requests for every topic reached the cluster for %d clients, want 2", n, clients+1)
	}
	// The first client the first answer's epoch, the others the second's.
	if want := map[int32]int{routing.VirtualEpoch(0, 1): 1, routing.VirtualEpoch(0, 2): clients}; !maps.Equal(epochs, want) {
		t.Fatalf("leader epochs answered %v, want %v", epochs, want)
	}
	if n := testutil.ToFloat64(s.metrics.metaAllBy[metaTranslated]) - translated; n != 2 {
		t.Fatalf("%v translations for two answers of the cluster", n)
	}
}
