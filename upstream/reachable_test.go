package upstream

import (
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestBrokersFrom: the broker a request prefers goes first, the others
// follow in ID order, and a broker the metadata no longer lists is still
// tried first.
func TestBrokersFrom(t *testing.T) {
	u := &Cluster{}
	u.Meta.Store(&Snapshot{Brokers: map[int32]string{3: "c", 1: "a", 2: "b"}})
	for _, tc := range []struct {
		first int32
		want  []int32
	}{
		{1, []int32{1, 2, 3}},
		{2, []int32{2, 1, 3}},
		{3, []int32{3, 1, 2}},
		{9, []int32{9, 1, 2, 3}},
	} {
		if got := u.BrokersFrom(tc.first); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("brokersFrom(%d) = %v, want %v", tc.first, got, tc.want)
		}
	}
}

// TestSnapshotLeads: a broker leads while a partition names it and the
// metadata lists it; once the cluster moves its partitions, or drops it,
// it does not.
func TestSnapshotLeads(t *testing.T) {
	u := &Cluster{ClusterID: "c"}
	u.Meta.Store(&Snapshot{Brokers: map[int32]string{}})
	topic := "t"
	md := func(brokers []int32, leaders ...int32) *kmsg.MetadataResponse {
		r := kmsg.NewPtrMetadataResponse()
		for _, b := range brokers {
			r.Brokers = append(r.Brokers, kmsg.MetadataResponseBroker{NodeID: b, Host: "h", Port: 1})
		}
		rt := kmsg.MetadataResponseTopic{Topic: &topic}
		for p, l := range leaders {
			rt.Partitions = append(rt.Partitions, kmsg.MetadataResponseTopicPartition{Partition: int32(p), Leader: l})
		}
		r.Topics = append(r.Topics, rt)
		return r
	}
	s := u.Install(md([]int32{1, 2}, 1, 2), true)
	if !s.Leads(1) || !s.Leads(2) {
		t.Fatal("brokers 1 and 2 lead a partition each")
	}
	if s = u.Install(md([]int32{1, 2}, 2, 2), true); s.Leads(1) {
		t.Fatal("broker 1 leads nothing once its partition moved")
	}
	if s = u.Install(md([]int32{2}, 1, 2), true); s.Leads(1) {
		t.Fatal("broker 1 is no longer listed")
	}
}
