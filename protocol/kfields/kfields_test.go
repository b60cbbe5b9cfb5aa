package kfields

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// visitorKinds is the rule the generated walk follows, restated: a field
// of this name and type goes to this Visitor function.
var visitorKinds = map[string]struct {
	typ     reflect.Type
	visitor string
}{
	"TopicID":            {reflect.TypeFor[[16]byte](), "TopicID"},
	"ProducerID":         {reflect.TypeFor[int64](), "ProducerID"},
	"LeaderEpoch":        {reflect.TypeFor[int32](), "LeaderEpoch"},
	"CurrentLeaderEpoch": {reflect.TypeFor[int32](), "LeaderEpoch"},
	"ErrorCode":          {reflect.TypeFor[int16](), "ErrorCode"},
}

// fill gives v one element in every slice and a value behind every
// pointer to a struct, and records the address of every field the rule
// names, by Visitor function.
func fill(v reflect.Value, want map[string]map[uintptr]string, path string) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.Type().Elem().Kind() == reflect.Struct {
			v.Set(reflect.New(v.Type().Elem()))
			fill(v.Elem(), want, path)
		}
	case reflect.Slice:
		if k := v.Type().Elem().Kind(); k == reflect.Struct || k == reflect.Pointer {
			v.Set(reflect.MakeSlice(v.Type(), 2, 2))
			for i := 0; i < 2; i++ {
				fill(v.Index(i), want, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			p := path + "." + f.Name
			if k, ok := visitorKinds[f.Name]; ok && f.Type == k.typ {
				want[k.visitor][v.Field(i).Addr().Pointer()] = p
				continue
			}
			fill(v.Field(i), want, p)
		}
	}
}

// TestVisitReachesEveryField checks the generated walk against the rule:
// for every request and response kmsg knows, with two elements in every
// slice, each function is given exactly the fields of its kind, once each.
func TestVisitReachesEveryField(t *testing.T) {
	var msgs []Message
	for k := int16(0); k < 1024; k++ {
		if r := kmsg.RequestForKey(k); r != nil {
			msgs = append(msgs, r, r.ResponseKind())
		}
	}
	if len(msgs) < 100 {
		t.Fatalf("only %d messages", len(msgs))
	}
	counted := 0
	for _, m := range msgs {
		want := map[string]map[uintptr]string{"TopicID": {}, "ProducerID": {}, "LeaderEpoch": {}, "ErrorCode": {}}
		fill(reflect.ValueOf(m).Elem(), want, fmt.Sprintf("%T", m))
		got := map[string]map[uintptr]int{"TopicID": {}, "ProducerID": {}, "LeaderEpoch": {}, "ErrorCode": {}}
		ptr := func(kind string) func(p uintptr) { return func(p uintptr) { got[kind][p]++ } }
		known := Visit(m, &Visitor{
			TopicID:     func(p *[16]byte) { ptr("TopicID")(reflect.ValueOf(p).Pointer()) },
			ProducerID:  func(p *int64) { ptr("ProducerID")(reflect.ValueOf(p).Pointer()) },
			LeaderEpoch: func(p *int32) { ptr("LeaderEpoch")(reflect.ValueOf(p).Pointer()) },
			ErrorCode:   func(p *int16) { ptr("ErrorCode")(reflect.ValueOf(p).Pointer()) },
		})
		if !known {
			t.Errorf("%T: Visit does not know it (run go generate ./protocol/kfields)", m)
			continue
		}
		for kind, fields := range want {
			for p, path := range fields {
				if got[kind][p] != 1 {
					t.Errorf("%s: given to %s %d times, want once", path, kind, got[kind][p])
				}
				counted++
			}
			for p := range got[kind] {
				if _, ok := fields[p]; !ok {
					t.Errorf("%T: %s given a field the rule does not name", m, kind)
				}
			}
		}
	}
	if counted < 500 {
		t.Fatalf("only %d fields checked", counted)
	}
}

// TestVisitSets checks that a visitor's writes land in the message.
func TestVisitSets(t *testing.T) {
	r := &kmsg.OffsetCommitRequest{Topics: []kmsg.OffsetCommitRequestTopic{{
		TopicID:    [16]byte{1},
		Partitions: []kmsg.OffsetCommitRequestTopicPartition{{LeaderEpoch: 7}},
	}}}
	Visit(r, &Visitor{
		TopicID:     func(id *[16]byte) { id[0] = 9 },
		LeaderEpoch: func(e *int32) { *e += 1 },
	})
	if r.Topics[0].TopicID[0] != 9 || r.Topics[0].Partitions[0].LeaderEpoch != 8 {
		t.Fatalf("not set: %+v", r.Topics[0])
	}
}

func TestErrorCodes(t *testing.T) {
	r := &kmsg.DeleteGroupsResponse{Groups: []kmsg.DeleteGroupsResponseGroup{{ErrorCode: 15}, {ErrorCode: 16}}}
	var got []int16
	ErrorCodes(r, func(c int16) { got = append(got, c) })
	if fmt.Sprint(got) != "[15 16]" {
		t.Fatalf("codes %v", got)
	}
}
