package proxy

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// setShareEarliest sets a share group's share.auto.offset.reset to
// earliest through addr (a GROUP config; the default, latest, would skip
// what was produced before the group first fetched).
func setShareEarliest(ctx context.Context, t *testing.T, cl *kgo.Client, group string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name, cfg.Value = "share.auto.offset.reset", kmsg.StringPtr("earliest")
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("setting share.auto.offset.reset on group %s: %v", group, err)
	}
}

// TestShareGroupThroughFerry: two franz-go share consumers in one share
// group read a three-partition topic (one partition per physical broker,
// so each on its own lane) through Ferry. Between them they get every
// record produced, as produced, and dial nothing but Ferry's lanes; once
// they acknowledged everything, the group's start offsets read through
// Ferry are the partitions' end offsets.
func TestShareGroupThroughFerry(t *testing.T) {
	kf := newKfake(t, 3)
	s, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lanes := map[string]bool{}
	for _, b := range s.virtualBrokers() {
		lanes[net.JoinHostPort(b.Host, fmt.Sprint(b.Port))] = true
	}
	if len(lanes) != 3 {
		t.Fatalf("lanes %v, want 3", lanes)
	}

	admCl := newClient(t, addr)
	adm := kadm.NewClient(admCl)
	const topic, group, n = "jobs", "workers", 300
	if _, err := adm.CreateTopic(ctx, 3, 3, nil, topic); err != nil {
		t.Fatal(err)
	}
	setShareEarliest(ctx, t, admCl, group)
	prod := newClient(t, addr, kgo.DefaultProduceTopic(topic))
	want := map[string]*kgo.Record{}
	for i := range n {
		r := &kgo.Record{Value: fmt.Appendf(nil, "v-%d", i)}
		prod.Produce(ctx, r, nil)
		want[string(r.Value)] = r
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var dialed []string
	dial := func(ctx context.Context, network, host string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, host)
		mu.Unlock()
		return (&net.Dialer{}).DialContext(ctx, network, host)
	}
	got := map[string]int{} // value → deliveries
	// Ended once every record is in: the other consumer waits in a poll.
	pollCtx, allIn := context.WithCancel(ctx)
	defer allIn()
	var wg sync.WaitGroup
	for range 2 {
		cl := newClient(t, addr, kgo.ConsumeTopics(topic), kgo.ShareGroup(group), kgo.FetchMaxWait(200*time.Millisecond), kgo.Dialer(dial))
		wg.Go(func() {
			for {
				mu.Lock()
				done := len(got) == n
				mu.Unlock()
				if done || pollCtx.Err() != nil {
					break
				}
				fs := cl.PollFetches(pollCtx)
				fs.EachError(func(tp string, p int32, err error) {
					if pollCtx.Err() == nil {
						t.Errorf("share fetch %s/%d: %v", tp, p, err)
					}
				})
				fs.EachRecord(func(r *kgo.Record) {
					w := want[string(r.Value)]
					if w == nil || w.Partition != r.Partition || w.Offset != r.Offset {
						t.Errorf("record %q at %d/%d was not produced there", r.Value, r.Partition, r.Offset)
					}
					mu.Lock()
					got[string(r.Value)]++
					if len(got) == n {
						allIn()
					}
					mu.Unlock()
					r.Ack(kgo.AckAccept)
				})
			}
			fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer fcancel()
			if err := cl.FlushAcks(fctx); err != nil {
				t.Errorf("flushing acknowledgements: %v", err)
			}
		})
	}
	wg.Wait()
	if len(got) != n {
		t.Fatalf("the share consumers got %d distinct records of %d", len(got), n)
	}
	// The clients may still dial (their telemetry push): read under mu.
	mu.Lock()
	seen := slices.Clone(dialed)
	mu.Unlock()
	for _, h := range seen {
		if !lanes[h] {
			t.Fatalf("a share consumer dialled %s, not one of Ferry's lanes %v", h, lanes)
		}
	}

	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for ctx.Err() == nil {
		d, err := adm.DescribeShareGroupOffsets(ctx, group)
		if err == nil {
			err = d.Error()
		}
		last = fmt.Sprint(d, err)
		ok := err == nil
		ends.Each(func(e kadm.ListedOffset) {
			o, found := d[group].Offsets[topic][e.Partition]
			ok = ok && found && o.Err == nil && o.StartOffset == e.Offset
		})
		if ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("share group start offsets never reached the end offsets %v: %s", ends, last)
}

// TestShareRequestsUnknownTopics: share requests naming a topic ID Ferry
// did not issue are answered UNKNOWN_TOPIC_ID for it, the rest forwarded,
// and the connection kept.
func TestShareRequestsUnknownTopics(t *testing.T) {
	kf := newKfake(t, 1)
	_, addr := startFerry(t, kf.ListenAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient(t, addr)
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "known"); err != nil {
		t.Fatal(err)
	}
	md, err := kadm.NewClient(cl).Metadata(ctx, "known")
	if err != nil {
		t.Fatal(err)
	}
	known := [16]byte(md.Topics["known"].ID)
	bogus := [16]byte{1, 2, 3}

	group, member := "g", "m-1"
	fetch := kmsg.NewPtrShareFetchRequest()
	fetch.GroupID, fetch.MemberID, fetch.ShareSessionEpoch = &group, &member, 0
	fetch.MaxWaitMillis, fetch.MaxBytes, fetch.MaxRecords, fetch.BatchSize = 10, 1<<20, 100, 100
	for _, id := range [][16]byte{bogus, known} {
		ft := kmsg.NewShareFetchRequestTopic()
		ft.TopicID = id
		ft.Partitions = []kmsg.ShareFetchRequestTopicPartition{{Partition: 0}, {Partition: 7}}
		fetch.Topics = append(fetch.Topics, ft)
	}
	fetch.ForgottenTopicsData = []kmsg.ShareFetchRequestForgottenTopicsData{{TopicID: bogus, Partitions: []int32{0}}}
	// To the one lane, as a share consumer sends it: the client's
	// routing of a bare request is not what is tested.
	b := cl.Broker(0)
	fr, err := fetch.RequestWith(ctx, b)
	if err != nil {
		t.Fatalf("ShareFetch: %v", err)
	}
	codes := map[[16]byte]int16{}
	for _, rt := range fr.Topics {
		for _, p := range rt.Partitions {
			if rt.TopicID == bogus {
				codes[bogus] = p.ErrorCode
			}
		}
		if rt.TopicID != bogus && rt.TopicID != known {
			t.Errorf("answer names topic ID %x, which the request did not", rt.TopicID)
		}
	}
	if codes[bogus] != kerr.UnknownTopicID.Code {
		t.Errorf("unknown topic ID answered %d, want UNKNOWN_TOPIC_ID; answer %+v", codes[bogus], fr)
	}

	ack := kmsg.NewPtrShareAcknowledgeRequest()
	ack.GroupID, ack.MemberID, ack.ShareSessionEpoch = &group, &member, 1
	at := kmsg.NewShareAcknowledgeRequestTopic()
	at.TopicID = bogus
	at.Partitions = []kmsg.ShareAcknowledgeRequestTopicPartition{{Partition: 0, AcknowledgementBatches: []kmsg.ShareAcknowledgeRequestTopicPartitionAcknowledgementBatch{{FirstOffset: 0, LastOffset: 0, AcknowledgeTypes: []int8{1}}}}}
	ack.Topics = append(ack.Topics, at)
	ar, err := ack.RequestWith(ctx, b)
	if err != nil {
		t.Fatalf("ShareAcknowledge: %v", err)
	}
	if len(ar.Topics) != 1 || ar.Topics[0].TopicID != bogus || len(ar.Topics[0].Partitions) != 1 || ar.Topics[0].Partitions[0].ErrorCode != kerr.UnknownTopicID.Code {
		t.Errorf("ShareAcknowledge of an unknown topic ID answered %+v, want UNKNOWN_TOPIC_ID for it", ar)
	}

	// The connection still serves.
	if _, err := kadm.NewClient(cl).ListTopics(ctx); err != nil {
		t.Fatalf("after the share requests: %v", err)
	}
}
