package proxy

import (
	"reflect"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestKeysSubsetFollowsCoordinatorKeys: for every request that can name
// several coordinator keys, at every version, a subset names exactly the
// keys coordinatorKeys listed at the indexes asked for, in order.
func TestKeysSubsetFollowsCoordinatorKeys(t *testing.T) {
	three := map[kmsg.Key]func(v int16) kmsg.Request{
		kmsg.DescribeGroups: func(int16) kmsg.Request {
			return &kmsg.DescribeGroupsRequest{Groups: []string{"a", "b", "c"}}
		},
		kmsg.DeleteGroups: func(int16) kmsg.Request {
			return &kmsg.DeleteGroupsRequest{Groups: []string{"a", "b", "c"}}
		},
		kmsg.ConsumerGroupDescribe: func(int16) kmsg.Request {
			return &kmsg.ConsumerGroupDescribeRequest{Groups: []string{"a", "b", "c"}}
		},
		kmsg.DescribeTransactions: func(int16) kmsg.Request {
			return &kmsg.DescribeTransactionsRequest{TransactionalIDs: []string{"a", "b", "c"}}
		},
		kmsg.OffsetFetch: func(int16) kmsg.Request {
			return &kmsg.OffsetFetchRequest{Groups: []kmsg.OffsetFetchRequestGroup{{Group: "a"}, {Group: "b"}, {Group: "c"}}}
		},
		kmsg.AddPartitionsToTxn: func(int16) kmsg.Request {
			return &kmsg.AddPartitionsToTxnRequest{Transactions: []kmsg.AddPartitionsToTxnRequestTransaction{
				{TransactionalID: "a"}, {TransactionalID: "b"}, {TransactionalID: "c"}}}
		},
		kmsg.StreamsGroupDescribe: func(int16) kmsg.Request {
			return &kmsg.StreamsGroupDescribeRequest{Groups: []string{"a", "b", "c"}}
		},
		kmsg.ShareGroupDescribe: func(int16) kmsg.Request {
			return &kmsg.ShareGroupDescribeRequest{GroupIDs: []string{"a", "b", "c"}}
		},
		kmsg.DescribeShareGroupOffsets: func(int16) kmsg.Request {
			return &kmsg.DescribeShareGroupOffsetsRequest{Groups: []kmsg.DescribeShareGroupOffsetsRequestGroup{{GroupID: "a"}, {GroupID: "b"}, {GroupID: "c"}}}
		},
	}
	for key, mk := range three {
		r := mk(0)
		v := r.MaxVersion()
		r.SetVersion(v)
		_, keys := coordinatorKeys(int16(key), v, r)
		if !slices.Equal(keys, []string{"a", "b", "c"}) {
			t.Fatalf("%s: coordinatorKeys %v", kmsg.NameForKey(int16(key)), keys)
		}
		sub, ok := keysSubset(r, []int{2, 0})
		if !ok {
			t.Fatalf("%s: keysSubset refused", kmsg.NameForKey(int16(key)))
		}
		if _, got := coordinatorKeys(int16(key), v, sub); !slices.Equal(got, []string{"a", "c"}) {
			t.Errorf("%s: subset names %v, want [a c]", kmsg.NameForKey(int16(key)), got)
		}
		if _, got := coordinatorKeys(int16(key), v, r); !slices.Equal(got, keys) {
			t.Errorf("%s: the original changed to %v", kmsg.NameForKey(int16(key)), got)
		}
	}
	// Every request coordinatorKeys can find several keys in is covered.
	multi := 0
	for key := range routes {
		r := kmsg.RequestForKey(key)
		if r == nil || (routes[key] != routeGroup && routes[key] != routeTxn) {
			continue
		}
		fillOne(reflect.ValueOf(r).Elem(), 3)
		r.SetVersion(r.MaxVersion())
		if _, keys := coordinatorKeys(key, r.MaxVersion(), r); len(keys) > 1 {
			multi++
			if _, ok := three[kmsg.Key(key)]; !ok {
				t.Errorf("%s names %d keys and keysSubset is not tested on it", kmsg.NameForKey(key), len(keys))
			}
			if _, ok := keysSubset(r, []int{0}); !ok {
				t.Errorf("%s names %d keys and keysSubset refuses it", kmsg.NameForKey(key), len(keys))
			}
		}
	}
	if multi != len(three) {
		t.Errorf("%d requests name several keys, %d tested", multi, len(three))
	}
}

// TestMergeKeyAnswers: the parts' answers are appended and the larger
// throttle kept, for every request keysSubset splits.
func TestMergeKeyAnswers(t *testing.T) {
	for _, key := range []kmsg.Key{kmsg.DescribeGroups, kmsg.DeleteGroups, kmsg.ConsumerGroupDescribe,
		kmsg.DescribeTransactions, kmsg.OffsetFetch, kmsg.AddPartitionsToTxn, kmsg.ShareGroupDescribe, kmsg.DescribeShareGroupOffsets, kmsg.StreamsGroupDescribe} {
		into, from := kmsg.RequestForKey(int16(key)).ResponseKind(), kmsg.RequestForKey(int16(key)).ResponseKind()
		fillOne(reflect.ValueOf(into).Elem(), 1)
		fillOne(reflect.ValueOf(from).Elem(), 2)
		into.(kmsg.SetThrottleResponse).SetThrottle(5)
		from.(kmsg.SetThrottleResponse).SetThrottle(9)
		mergeKeyAnswers(into, from)
		name := kmsg.NameForKey(int16(key))
		if th, _ := into.(kmsg.ThrottleResponse).Throttle(); th != 9 {
			t.Errorf("%s: throttle %d, want 9", name, th)
		}
		n := 0
		iv := reflect.ValueOf(into).Elem()
		for i := 0; i < iv.NumField(); i++ {
			if f := iv.Field(i); f.Kind() == reflect.Slice && iv.Type().Field(i).IsExported() && f.Len() == 3 {
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s: no answer slice holds both parts' answers", name)
		}
		from.(kmsg.SetThrottleResponse).SetThrottle(1)
		mergeKeyAnswers(into, from)
		if th, _ := into.(kmsg.ThrottleResponse).Throttle(); th != 9 {
			t.Errorf("%s: throttle %d after a smaller one, want 9", name, th)
		}
	}
}

// TestAppendAnswersEveryRefusingAPI: for every API whose items Ferry may
// refuse, every per-item slice of Ferry's answer is appended to the
// broker's.
func TestAppendAnswersEveryRefusingAPI(t *testing.T) {
	keys := map[int16]bool{}
	for _, set := range []map[int16]bool{namedTopicKeys, topicIDKeys, kafkaInternalKeys, txnIDKeys} {
		for k := range set {
			keys[k] = true
		}
	}
	for key := range keys {
		name := kmsg.NameForKey(key)
		resp, add := kmsg.RequestForKey(key).ResponseKind(), kmsg.RequestForKey(key).ResponseKind()
		fillOne(reflect.ValueOf(resp).Elem(), 1)
		fillOne(reflect.ValueOf(add).Elem(), 2)
		if !appendAnswers(resp, add) {
			t.Errorf("%s: appendAnswers does not know it", name)
			continue
		}
		rv := reflect.ValueOf(resp).Elem()
		for i := 0; i < rv.NumField(); i++ {
			f, sf := rv.Field(i), rv.Type().Field(i)
			if sf.IsExported() && f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Struct && f.Len() != 3 {
				t.Errorf("%s.%s: %d answers after the append, want 3", name, sf.Name, f.Len())
			}
		}
	}
}

// fillOne gives every top-level slice of structs or strings in v n
// elements, the strings named by letter.
func fillOne(v reflect.Value, n int) {
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if !v.Type().Field(i).IsExported() || f.Kind() != reflect.Slice {
			continue
		}
		switch f.Type().Elem().Kind() {
		case reflect.Struct:
			f.Set(reflect.MakeSlice(f.Type(), n, n))
			for j := 0; j < n; j++ {
				for k := 0; k < f.Index(j).NumField(); k++ {
					if kf := f.Index(j).Field(k); kf.Kind() == reflect.String {
						kf.SetString(string(rune('a' + j)))
					}
				}
			}
		case reflect.String:
			s := reflect.MakeSlice(f.Type(), n, n)
			for j := 0; j < n; j++ {
				s.Index(j).SetString(string(rune('a' + j)))
			}
			f.Set(s)
		}
	}
}
