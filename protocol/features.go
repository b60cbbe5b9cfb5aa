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
	out := Features{Supported: map[string]VersionRange{}, Finalized: map[string]int16{}}
	if len(sets) == 0 {
		return out
	}
	for name, r := range sets[0].Supported {
		ok := true
		for _, s := range sets[1:] {
			o, has := s.Supported[name]
			if !has {
				ok = false
				break
			}
			r.Min, r.Max = max(r.Min, o.Min), min(r.Max, o.Max)
		}
		if ok && r.Min <= r.Max {
			out.Supported[name] = r
		}
	}
	for name, level := range sets[0].Finalized {
		ok := true
		for _, s := range sets[1:] {
			o, has := s.Finalized[name]
			if !has {
				ok = false
				break
			}
			level = min(level, o)
		}
		if ok && level > 0 {
			out.Finalized[name] = level
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
