package protocol

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// VersionRange is an inclusive range of versions of one API key.
type VersionRange struct{ Min, Max int16 }

// Versions maps API keys to the versions supported.
type Versions map[int16]VersionRange

// KmsgVersions is every key and version kmsg can parse.
func KmsgVersions() Versions {
	vs := make(Versions)
	for k := int16(0); k <= kmsg.MaxKey; k++ {
		if r := kmsg.RequestForKey(k); r != nil {
			vs[k] = VersionRange{0, r.MaxVersion()}
		}
	}
	return vs
}

// VersionsFromResponse reads what a broker advertises.
func VersionsFromResponse(resp *kmsg.ApiVersionsResponse) Versions {
	vs := make(Versions, len(resp.ApiKeys))
	for _, k := range resp.ApiKeys {
		vs[k.ApiKey] = VersionRange{k.MinVersion, k.MaxVersion}
	}
	return vs
}

// Intersect keeps the keys present in every input, each with the versions
// every input supports. Minimums are kept as the inputs state them, so the
// old versions that Kafka 4.x still advertises for old clients (Produce v0
// for librdkafka's feature detection, Metadata v0-3) stay advertised.
func Intersect(sets ...Versions) Versions {
	if len(sets) == 0 {
		return Versions{}
	}
	out := make(Versions)
	for k, r := range sets[0] {
		ok := true
		for _, s := range sets[1:] {
			o, has := s[k]
			if !has {
				ok = false
				break
			}
			r.Min = max(r.Min, o.Min)
			r.Max = min(r.Max, o.Max)
		}
		if ok && r.Min <= r.Max {
			out[k] = r
		}
	}
	return out
}

// Only keeps the listed keys.
func (vs Versions) Only(keys ...int16) Versions {
	out := make(Versions, len(keys))
	for _, k := range keys {
		if r, ok := vs[k]; ok {
			out[k] = r
		}
	}
	return out
}

// Supports reports whether version of key is in the set.
func (vs Versions) Supports(key, version int16) bool {
	r, ok := vs[key]
	return ok && version >= r.Min && version <= r.Max
}

// Keys returns the keys in order.
func (vs Versions) Keys() []int16 {
	ks := make([]int16, 0, len(vs))
	for k := range vs {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// AppendTo fills an ApiVersions response's key list.
func (vs Versions) AppendTo(resp *kmsg.ApiVersionsResponse) {
	for _, k := range vs.Keys() {
		r := vs[k]
		resp.ApiKeys = append(resp.ApiKeys, kmsg.ApiVersionsResponseApiKey{ApiKey: k, MinVersion: r.Min, MaxVersion: r.Max})
	}
}

// Missing lists, as "Name vMin-vMax", the versions in vs that other does
// not support.
func (vs Versions) Missing(other Versions) []string {
	var out []string
	for _, k := range vs.Keys() {
		r := vs[k]
		o, ok := other[k]
		if ok && o.Min <= r.Min && o.Max >= r.Max {
			continue
		}
		out = append(out, fmt.Sprintf("%s v%d-%d", kmsg.NameForKey(k), r.Min, r.Max))
	}
	return out
}

// APIName names key as metrics' api label and reports do: kmsg's name,
// key_N for a key kmsg does not name, unknown outside kmsg's range (so a
// client cannot grow the label set).
func APIName(key int16) string {
	if key < 0 || key > kmsg.MaxKey {
		return "unknown"
	}
	if name := kmsg.NameForKey(key); name != "Unknown" {
		return name
	}
	return "key_" + strconv.Itoa(int(key))
}
