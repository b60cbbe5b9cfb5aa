package errorresp

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// populate gives v's fields values: two elements in every slice, strings
// and integers that differ from element to element, non-nil pointers.
func populate(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Pointer:
		if v.Type().Elem().Kind() == reflect.String {
			s := fmt.Sprintf("p%d", *n)
			v.Set(reflect.ValueOf(&s))
		} else if v.Type().Elem().Kind() == reflect.Struct {
			v.Set(reflect.New(v.Type().Elem()))
			populate(v.Elem(), n)
		}
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n % 100))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			v.Index(i).SetUint(uint64(*n + i))
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes([]byte{byte(*n)})
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			populate(v.Index(i), n)
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() && v.Type().Field(i).Name != "UnknownTags" {
				populate(v.Field(i), n)
			}
		}
	}
}

// TestForMatchesReflection: for every request kmsg knows, at every
// version, empty and populated, with and without a message, the generated
// answer is the reflection implementation's.
func TestForMatchesReflection(t *testing.T) {
	checked := 0
	for k := int16(0); k < 1024; k++ {
		if kmsg.RequestForKey(k) == nil {
			continue
		}
		for v := int16(0); v <= kmsg.RequestForKey(k).MaxVersion(); v++ {
			for _, full := range []bool{false, true} {
				for _, msg := range []string{"", "refused"} {
					kr := kmsg.RequestForKey(k)
					if full {
						n := 0
						populate(reflect.ValueOf(kr).Elem(), &n)
					}
					kr.SetVersion(v)
					got, want := For(kr, 15, msg), oracle(kr, 15, msg)
					if got == nil {
						t.Fatalf("%s: For does not know it (run go generate ./protocol/errorresp)", kmsg.NameForKey(k))
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%s v%d (populated %v, message %q):\n got %+v\nwant %+v", kmsg.NameForKey(k), v, full, msg, got, want)
					}
					checked++
				}
			}
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d answers checked", checked)
	}
}

// TestForCarriesTheError spells out one answer.
func TestForCarriesTheError(t *testing.T) {
	r := &kmsg.DeleteRecordsRequest{Topics: []kmsg.DeleteRecordsRequestTopic{{
		Topic: "t", Partitions: []kmsg.DeleteRecordsRequestTopicPartition{{Partition: 3, Offset: 10}},
	}}}
	resp := For(r, 7, "gone").(*kmsg.DeleteRecordsResponse)
	if len(resp.Topics) != 1 || resp.Topics[0].Topic != "t" || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("answer %+v", resp)
	}
	p := resp.Topics[0].Partitions[0]
	if p.Partition != 3 || p.ErrorCode != 7 || p.LowWatermark != -1 {
		t.Fatalf("partition %+v", p)
	}
	g := For(&kmsg.DeleteGroupsRequest{Groups: []string{"g"}}, 7, "gone").(*kmsg.DeleteGroupsResponse)
	if len(g.Groups) != 1 || g.Groups[0].Group != "g" || g.Groups[0].ErrorCode != 7 {
		t.Fatalf("groups %+v", g.Groups)
	}
}
