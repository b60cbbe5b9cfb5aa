package errorresp

// The reflection implementation this package's generated code replaced,
// kept as the test's oracle: TestForMatchesReflection checks that both
// answer every request kmsg knows, at every version, alike.

import (
	"reflect"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func oracle(kr kmsg.Request, code int16, msg string) kmsg.Response {
	resp := kr.ResponseKind()
	resp.SetVersion(kr.GetVersion())
	rv, qv := reflect.ValueOf(resp).Elem(), reflect.ValueOf(kr).Elem()
	// A Fetch's top-level error code speaks of its session, not of the
	// partitions: keep it 0 and refuse each partition.
	if kr.Key() != int16(kmsg.Fetch) {
		fillError(rv, code, msg)
	}
	pairs := mirroredSlices[kr.Key()]
	if pairs == nil {
		pairs = sameNamedSlices(rv, qv)
	}
	for _, p := range pairs {
		dst := rv.FieldByName(p.resp)
		for _, from := range p.req {
			mirror(dst, qv.FieldByName(from), code, msg)
		}
	}
	return resp
}

// slicePair names an answer's slice of per-key results and the request's
// slices of keys it answers.
type slicePair struct {
	resp string
	req  []string
}

// mirroredSlices are the APIs whose answer names its per-key slice
// differently from the request; the others answer slice X with slice X.
var mirroredSlices = map[int16][]slicePair{
	int16(kmsg.FindCoordinator):              {{"Coordinators", []string{"CoordinatorKeys"}}},
	int16(kmsg.DescribeTransactions):         {{"TransactionStates", []string{"TransactionalIDs"}}},
	int16(kmsg.DeleteTopics):                 {{"Topics", []string{"TopicNames", "Topics"}}},
	int16(kmsg.CreateACLs):                   {{"Results", []string{"Creations"}}},
	int16(kmsg.DeleteACLs):                   {{"Results", []string{"Filters"}}},
	int16(kmsg.AlterUserSCRAMCredentials):    {{"Results", []string{"Deletions", "Upsertions"}}},
	int16(kmsg.DescribeUserSCRAMCredentials): {{"Results", []string{"Users"}}},
	int16(kmsg.UpdateFeatures):               {{"Results", []string{"FeatureUpdates"}}},
	int16(kmsg.ShareGroupDescribe):           {{"Groups", []string{"GroupIDs"}}},
}

// sameNamedSlices pairs every slice of the answer with the request's slice
// of the same name.
func sameNamedSlices(rv, qv reflect.Value) []slicePair {
	var out []slicePair
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Type().Field(i)
		if f.Type.Kind() != reflect.Slice || f.Name == "UnknownTags" {
			continue
		}
		if q := qv.FieldByName(f.Name); q.IsValid() && q.Kind() == reflect.Slice {
			out = append(out, slicePair{f.Name, []string{f.Name}})
		}
	}
	return out
}

// mirror appends to dst (a slice of answer elements) one element per
// element of src (the request's slice), keys copied, errors set, and
// nested slices of the same name mirrored in turn.
func mirror(dst, src reflect.Value, code int16, msg string) {
	if !src.IsValid() || src.Kind() != reflect.Slice || dst.Kind() != reflect.Slice {
		return
	}
	et := dst.Type().Elem()
	if et.Kind() != reflect.Struct {
		return
	}
	for i := 0; i < src.Len(); i++ {
		e := reflect.New(et)
		if d, ok := e.Interface().(interface{ Default() }); ok {
			d.Default()
		}
		ev := e.Elem()
		s := src.Index(i)
		if s.Kind() == reflect.Struct {
			copyKeys(ev, s)
			for j := 0; j < ev.NumField(); j++ {
				f := ev.Type().Field(j)
				if f.Type.Kind() == reflect.Slice && f.Name != "UnknownTags" {
					mirror(ev.Field(j), s.FieldByName(f.Name), code, msg)
				}
			}
		} else {
			setScalarKey(ev, s)
		}
		for j := 0; j < ev.NumField(); j++ {
			if f := ev.Field(j); f.Kind() == reflect.Int64 && f.Int() == 0 && unknownOffsets[ev.Type().Field(j).Name] {
				f.SetInt(-1)
			}
		}
		fillError(ev, code, msg)
		dst.Set(reflect.Append(dst, ev))
	}
}

// keyInts are the integer fields that identify what a request names (the
// rest, like a produce's acks or a fetch's offsets, are not echoed).
var keyInts = map[string]bool{"Partition": true, "ResourceType": true, "PatternType": true}

// copyKeys copies the identifying fields of a request element into an
// answer element: names (string or *string either side), IDs, and the
// integers in keyInts.
func copyKeys(dst, src reflect.Value) {
	for i := 0; i < dst.NumField(); i++ {
		name := dst.Type().Field(i).Name
		if name == "ErrorMessage" {
			continue
		}
		s := src.FieldByName(name)
		if !s.IsValid() {
			continue
		}
		d := dst.Field(i)
		switch {
		case d.Type() == s.Type() && (d.Kind() == reflect.String || d.Type() == reflect.TypeFor[*string]() || d.Type() == reflect.TypeFor[[16]byte]()):
			d.Set(s)
		case d.Type() == s.Type() && (d.Kind() == reflect.Int32 || d.Kind() == reflect.Int8) && keyInts[name]:
			d.Set(s)
		default:
			setString(d, s)
		}
	}
	// SCRAM credentials: the request names a user Name, the answer User.
	if u, n := dst.FieldByName("User"), src.FieldByName("Name"); u.IsValid() && n.IsValid() && u.Kind() == reflect.String && n.Kind() == reflect.String {
		u.SetString(n.String())
	}
}

// unknownOffsets are the answer fields whose "unknown" is -1, not 0.
var unknownOffsets = map[string]bool{
	"BaseOffset": true, "LogAppendTime": true, "LogStartOffset": true, "HighWatermark": true,
	"LastStableOffset": true, "Offset": true, "Timestamp": true, "EndOffset": true, "LowWatermark": true,
}

// setString sets d from s where one is a string and the other a *string.
func setString(d, s reflect.Value) {
	if !d.IsValid() || !s.IsValid() {
		return
	}
	switch {
	case d.Kind() == reflect.String && s.Type() == reflect.TypeFor[*string]():
		if !s.IsNil() {
			d.SetString(s.Elem().String())
		}
	case d.Type() == reflect.TypeFor[*string]() && s.Kind() == reflect.String:
		v := s.String()
		d.Set(reflect.ValueOf(&v))
	}
}

// setScalarKey sets the first field of an answer element that can hold a
// request's bare key: a group or transactional ID (string), a partition
// (int32).
func setScalarKey(ev, s reflect.Value) {
	for i := 0; i < ev.NumField(); i++ {
		f := ev.Type().Field(i)
		if f.Name == "ErrorMessage" || f.Name == "ErrorCode" {
			continue
		}
		d := ev.Field(i)
		switch {
		case s.Kind() == reflect.String && (d.Kind() == reflect.String || d.Type() == reflect.TypeFor[*string]()):
			if d.Kind() == reflect.String {
				d.SetString(s.String())
			} else {
				setString(d, s)
			}
			return
		case s.Kind() == reflect.Int32 && d.Kind() == reflect.Int32 && keyInts[f.Name]:
			d.SetInt(s.Int())
			return
		}
	}
}

// fillError sets a struct's ErrorCode and ErrorMessage, where it has them.
func fillError(v reflect.Value, code int16, msg string) {
	if f := v.FieldByName("ErrorCode"); f.IsValid() && f.Kind() == reflect.Int16 {
		f.SetInt(int64(code))
	}
	if f := v.FieldByName("ErrorMessage"); f.IsValid() && f.Type() == reflect.TypeFor[*string]() && msg != "" {
		m := msg
		f.Set(reflect.ValueOf(&m))
	}
}
