package protocol

import (
	"maps"
	"sort"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Features are a cluster's feature flags (KIP-584) as ApiVersions v3+
// states them: the levels of each feature its brokers support, and the
// level finalized for the cluster. Clients choose behaviour by the
// finalized levels (transaction.version 2 turns on KIP-890's implicit
// AddPartitionsToTxn, for one).
type Features struct {
	Supported map[string]VersionRange
	// Finalized holds each finalized feature's max level. Brokers list
	// no feature at level 0, and neither does this.
	Finalized map[string]int16
}

// FeaturesFromResponse reads what a broker advertises. A finalized
// features epoch of -1 means the broker states none.
func FeaturesFromResponse(resp *kmsg.ApiVersionsResponse) Features {
	f := Features{Supported: map[string]VersionRange{}, Finalized: map[string]int16{}}
	for _, s := range resp.SupportedFeatures {
		f.Supported[s.Name] = VersionRange{s.MinVersion, s.MaxVersion}
	}
	if resp.FinalizedFeaturesEpoch >= 0 {
		for _, ff := range resp.FinalizedFeatures {
			if ff.MaxVersionLevel > 0 {
				f.Finalized[ff.Name] = ff.MaxVersionLevel
			}
		}
	}
	return f
}

// IntersectFeatures keeps what holds on every input: a feature supported
// by all, with the levels all support (max of the minimums, min of the
// maximums); a feature finalized on all, at the lowest level finalized.
// A client that behaves by the result behaves in a way each cluster
// accepts, whichever one its requests reach.
func IntersectFeatures(sets ...Features) Features {
	return Features{
		Supported: intersect(sets, func(f Features) map[string]VersionRange { return f.Supported },
			func(r, o VersionRange) VersionRange {
				r.Min, r.Max = max(r.Min, o.Min), min(r.Max, o.Max)
				return r
			},
			func(r VersionRange) bool { return r.Min <= r.Max }),
		Finalized: intersect(sets, func(f Features) map[string]int16 { return f.Finalized },
			func(level, o int16) int16 { return min(level, o) },
			func(level int16) bool { return level > 0 }),
	}
}

// intersect is the names every set's map (of) holds, each with its
// values folded together by merge, kept where keep says the result holds.
func intersect[V any](sets []Features, of func(Features) map[string]V, merge func(acc, v V) V, keep func(V) bool) map[string]V {
	out := map[string]V{}
	if len(sets) == 0 {
		return out
	}
	for name, acc := range of(sets[0]) {
		ok := true
		for _, s := range sets[1:] {
			v, has := of(s)[name]
			if !has {
				ok = false
				break
			}
			acc = merge(acc, v)
		}
		if ok && keep(acc) {
			out[name] = acc
		}
	}
	return out
}

// Equal reports whether f and o state the same features.
func (f Features) Equal(o Features) bool {
	return maps.Equal(f.Supported, o.Supported) && maps.Equal(f.Finalized, o.Finalized)
}

// AppendTo fills an ApiVersions response's features, in name order, with
// the finalized features under epoch (-1, and none listed, when nothing
// is finalized). Only v3+ carries them; kmsg leaves them out below.
func (f Features) AppendTo(resp *kmsg.ApiVersionsResponse, epoch int64) {
	for _, name := range sortedKeys(f.Supported) {
		r := f.Supported[name]
		s := kmsg.NewApiVersionsResponseSupportedFeature()
		s.Name, s.MinVersion, s.MaxVersion = name, r.Min, r.Max
		resp.SupportedFeatures = append(resp.SupportedFeatures, s)
	}
	resp.FinalizedFeaturesEpoch = -1
	if len(f.Finalized) == 0 {
		return
	}
	resp.FinalizedFeaturesEpoch = epoch
	for _, name := range sortedKeys(f.Finalized) {
		ff := kmsg.NewApiVersionsResponseFinalizedFeature()
		// Brokers state the level as both bounds (the minimum is
		// deprecated, KIP-778).
		ff.Name, ff.MinVersionLevel, ff.MaxVersionLevel = name, f.Finalized[name], f.Finalized[name]
		resp.FinalizedFeatures = append(resp.FinalizedFeatures, ff)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
