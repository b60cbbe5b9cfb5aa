package proxy

import (
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// populate gives every slice of a request one element, recursively, with
// names "k0", "k1"... and partition 3, so that an answer that mirrors the
// request has something to mirror.
func populate(v reflect.Value, n *int) {
	for i := 0; i < v.NumField(); i++ {
		f, name := v.Field(i), v.Type().Field(i).Name
		switch {
		case name == "UnknownTags" || name == "Version":
		case f.Kind() == reflect.String:
			*n++
			f.SetString("k" + string(rune('0'+*n%10)))
		case f.Type() == reflect.TypeFor[*string]():
			*n++
			s := "k" + string(rune('0'+*n%10))
			f.Set(reflect.ValueOf(&s))
		case f.Kind() == reflect.Int32 && name == "Partition":
			f.SetInt(3)
		case f.Kind() == reflect.Slice:
			et := f.Type().Elem()
			e := reflect.New(et).Elem()
			switch et.Kind() {
			case reflect.Struct:
				populate(e, n)
			case reflect.String:
				e.SetString("g")
			case reflect.Int32:
				e.SetInt(3)
			case reflect.Uint8:
				continue // bytes, not a list of keys
			}
			f.Set(reflect.Append(f, e))
		}
	}
}

// errorCodes returns every ErrorCode in a response, wherever it lies.
func errorCodes(v any) []int16 {
	var out []int16
	walkFields(v, func(name string, f reflect.Value) {
		if name == "ErrorCode" && f.Kind() == reflect.Int16 {
			out = append(out, int16(f.Int()))
		}
	})
	return out
}

// TestErrorResponseEveryAPI: for every API Ferry forwards, at every version
// kmsg knows, the answer Ferry gives in a broker's place encodes, decodes
// as the client's library decodes it, and carries the error for what the
// request named, and no other code.
func TestErrorResponseEveryAPI(t *testing.T) {
	const code = 15 // COORDINATOR_NOT_AVAILABLE, any code will do
	for key, rt := range routes {
		if rt == routeLocal && key != int16(kmsg.FindCoordinator) {
			continue
		}
		proto := kmsg.RequestForKey(key)
		for v := int16(0); v <= proto.MaxVersion(); v++ {
			kr := kmsg.RequestForKey(key)
			kr.SetVersion(v)
			n := 0
			populate(reflect.ValueOf(kr).Elem(), &n)
			// Round-trip the request so that only what this version
			// carries is set, as when a client sends it.
			kr2 := kmsg.RequestForKey(key)
			kr2.SetVersion(v)
			if err := kr2.ReadFrom(kr.AppendTo(nil)); err != nil {
				t.Fatalf("%s v%d: request round trip: %v", kmsg.NameForKey(key), v, err)
			}
			resp := errorResponse(kr2, code, "broker gone")
			got := kr2.ResponseKind()
			got.SetVersion(v)
			if err := got.ReadFrom(resp.AppendTo(nil)); err != nil {
				t.Fatalf("%s v%d: answer does not decode: %v", kmsg.NameForKey(key), v, err)
			}
			// A top-level code the version does not carry decodes
			// as 0; every code carried is ours.
			carried := 0
			for _, c := range errorCodes(got) {
				switch c {
				case code:
					carried++
				case 0:
				default:
					t.Errorf("%s v%d: an error code is %d, not %d: %+v", kmsg.NameForKey(key), v, c, code, got)
				}
			}
			if carried == 0 && !noErrorField(key, v) {
				t.Errorf("%s v%d: the answer carries no error code: %+v", kmsg.NameForKey(key), v, got)
			}
		}
	}
}

// noErrorField lists the answers that have nowhere to put an error: a
// broker that cannot answer them closes the connection.
func noErrorField(key, version int16) bool {
	return key == int16(kmsg.DescribeLogDirs) && version < 3
}

// TestErrorResponseNamesWhatWasAsked checks, for the APIs clients depend on
// most, that the answer names exactly the keys the request named.
func TestErrorResponseNamesWhatWasAsked(t *testing.T) {
	nlf := kerr.NotLeaderForPartition.Code
	t.Run("Produce", func(t *testing.T) {
		req := kmsg.NewPtrProduceRequest()
		req.Version = 9
		req.Acks = -1
		req.Topics = []kmsg.ProduceRequestTopic{
			{Topic: "a", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0}, {Partition: 7}}},
			{Topic: "b", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 2}}},
		}
		resp := errorResponse(req, nlf, "").(*kmsg.ProduceResponse)
		var got []string
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				got = append(got, t.Topic+":"+string(rune('0'+p.Partition)))
			}
		}
		if want := []string{"a:0", "a:7", "b:2"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("partitions answered %v, want %v", got, want)
		}
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				if p.ErrorCode != nlf || p.BaseOffset != -1 {
					t.Fatalf("partition %d: code %d base offset %d", p.Partition, p.ErrorCode, p.BaseOffset)
				}
			}
		}
	})
	t.Run("Fetch keeps the session error at 0", func(t *testing.T) {
		req := kmsg.NewPtrFetchRequest()
		req.Version = 12
		req.Topics = []kmsg.FetchRequestTopic{{Topic: "a", Partitions: []kmsg.FetchRequestTopicPartition{{Partition: 4, FetchOffset: 99}}}}
		resp := errorResponse(req, nlf, "").(*kmsg.FetchResponse)
		if resp.ErrorCode != 0 {
			t.Fatalf("top-level error %d", resp.ErrorCode)
		}
		p := resp.Topics[0].Partitions[0]
		if resp.Topics[0].Topic != "a" || p.Partition != 4 || p.ErrorCode != nlf || p.HighWatermark != -1 {
			t.Fatalf("answer %+v", resp.Topics)
		}
	})
	t.Run("OffsetCommit", func(t *testing.T) {
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Version = 8
		req.Group = "g"
		req.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "a", Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 1, Offset: 50}}}}
		resp := errorResponse(req, 15, "").(*kmsg.OffsetCommitResponse)
		if len(resp.Topics) != 1 || resp.Topics[0].Topic != "a" || resp.Topics[0].Partitions[0].Partition != 1 || resp.Topics[0].Partitions[0].ErrorCode != 15 {
			t.Fatalf("answer %+v", resp.Topics)
		}
	})
	t.Run("DescribeGroups", func(t *testing.T) {
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Groups = []string{"x", "y"}
		resp := errorResponse(req, 15, "").(*kmsg.DescribeGroupsResponse)
		if len(resp.Groups) != 2 || resp.Groups[0].Group != "x" || resp.Groups[1].Group != "y" || resp.Groups[1].ErrorCode != 15 {
			t.Fatalf("answer %+v", resp.Groups)
		}
	})
	t.Run("AlterUserSCRAMCredentials", func(t *testing.T) {
		req := kmsg.NewPtrAlterUserSCRAMCredentialsRequest()
		req.Deletions = []kmsg.AlterUserSCRAMCredentialsRequestDeletion{{Name: "alice"}}
		req.Upsertions = []kmsg.AlterUserSCRAMCredentialsRequestUpsertion{{Name: "bob"}}
		resp := errorResponse(req, 31, "no").(*kmsg.AlterUserSCRAMCredentialsResponse)
		if len(resp.Results) != 2 || resp.Results[0].User != "alice" || resp.Results[1].User != "bob" || resp.Results[1].ErrorCode != 31 || *resp.Results[1].ErrorMessage != "no" {
			t.Fatalf("answer %+v", resp.Results)
		}
	})
	t.Run("DeleteTopics by name", func(t *testing.T) {
		req := kmsg.NewPtrDeleteTopicsRequest()
		req.Version = 5
		req.TopicNames = []string{"gone"}
		resp := errorResponse(req, 41, "").(*kmsg.DeleteTopicsResponse)
		if len(resp.Topics) != 1 || resp.Topics[0].Topic == nil || *resp.Topics[0].Topic != "gone" || resp.Topics[0].ErrorCode != 41 {
			t.Fatalf("answer %+v", resp.Topics)
		}
	})
	t.Run("InitProducerID without a transactional ID", func(t *testing.T) {
		req := kmsg.NewPtrInitProducerIDRequest()
		if code := upstreamErrorCode(req); code != kerr.CoordinatorLoadInProgress.Code {
			t.Fatalf("code %d", code)
		}
		resp := errorResponse(req, kerr.CoordinatorLoadInProgress.Code, "").(*kmsg.InitProducerIDResponse)
		if resp.ErrorCode != kerr.CoordinatorLoadInProgress.Code || resp.ProducerID != -1 {
			t.Fatalf("answer %+v", resp)
		}
	})
}
