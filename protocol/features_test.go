package protocol

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func apiVersions(epoch int64, supported map[string]VersionRange, finalized map[string]int16) *kmsg.ApiVersionsResponse {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.FinalizedFeaturesEpoch = epoch
	for n, r := range supported {
		resp.SupportedFeatures = append(resp.SupportedFeatures, kmsg.ApiVersionsResponseSupportedFeature{Name: n, MinVersion: r.Min, MaxVersion: r.Max})
	}
	for n, l := range finalized {
		resp.FinalizedFeatures = append(resp.FinalizedFeatures, kmsg.ApiVersionsResponseFinalizedFeature{Name: n, MinVersionLevel: l, MaxVersionLevel: l})
	}
	return resp
}

// Two clusters' features: a client is told only what holds on both.
func TestIntersectFeatures(t *testing.T) {
	a := FeaturesFromResponse(apiVersions(10,
		map[string]VersionRange{"metadata.version": {7, 33}, "transaction.version": {0, 2}, "share.version": {0, 2}, "x": {3, 4}},
		map[string]int16{"metadata.version": 33, "transaction.version": 2, "share.version": 2}))
	b := FeaturesFromResponse(apiVersions(99,
		map[string]VersionRange{"metadata.version": {1, 25}, "transaction.version": {0, 2}, "x": {5, 6}},
		map[string]int16{"metadata.version": 25, "transaction.version": 1}))
	got := IntersectFeatures(a, b)
	wantSup := map[string]VersionRange{"metadata.version": {7, 25}, "transaction.version": {0, 2}} // x: no level both support
	wantFin := map[string]int16{"metadata.version": 25, "transaction.version": 1}                  // share.version: finalized on a only
	if !got.Equal(Features{wantSup, wantFin}) {
		t.Fatalf("intersection %+v, want supported %v finalized %v", got, wantSup, wantFin)
	}

	resp := kmsg.NewPtrApiVersionsResponse()
	got.AppendTo(resp, 1234)
	if resp.FinalizedFeaturesEpoch != 1234 || len(resp.FinalizedFeatures) != 2 || resp.FinalizedFeatures[0].Name != "metadata.version" ||
		resp.FinalizedFeatures[1].MaxVersionLevel != 1 || resp.FinalizedFeatures[1].MinVersionLevel != 1 || len(resp.SupportedFeatures) != 2 {
		t.Fatalf("response features %+v %+v epoch %d", resp.SupportedFeatures, resp.FinalizedFeatures, resp.FinalizedFeaturesEpoch)
	}

	// A broker stating no finalized epoch finalizes nothing, and a
	// response with nothing finalized states epoch -1.
	none := FeaturesFromResponse(apiVersions(-1, nil, map[string]int16{"transaction.version": 2}))
	if len(IntersectFeatures(a, none).Finalized) != 0 {
		t.Fatalf("finalized features from a broker at epoch -1")
	}
	resp = kmsg.NewPtrApiVersionsResponse()
	resp.FinalizedFeaturesEpoch = 5
	none.AppendTo(resp, 77)
	if resp.FinalizedFeaturesEpoch != -1 || len(resp.FinalizedFeatures) != 0 {
		t.Fatalf("nothing finalized answered epoch %d, %+v", resp.FinalizedFeaturesEpoch, resp.FinalizedFeatures)
	}
}
