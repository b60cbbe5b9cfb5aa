package proxy

// ApiVersions (key 18), v0-v4 (kmsg's range).
//
// Ferry advertises the intersection of what it can parse (kmsg) and what
// every configured cluster supports, so a version a client picks keeps
// working after a switch to the other cluster. A version Ferry does not
// know is answered at v0 with UNSUPPORTED_VERSION and the supported
// ranges, as a broker does, so the client can retry with one it knows.
// From v3 the answer carries the feature levels every configured cluster
// finalizes, under an epoch of Ferry's own (features.go).

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func handleApiVersions(s *Server, _ *clientConn, req *request, _ kmsg.Request) (*reply, error) {
	resp := kmsg.NewPtrApiVersionsResponse()
	s.advertised().AppendTo(resp)
	s.appendFeatures(resp)
	return localReply(req, resp), nil
}

func apiVersionsUnsupported(s *Server, req *request) *reply {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.ErrorCode = kerr.UnsupportedVersion.Code
	s.advertised().Only(int16(kmsg.ApiVersions)).AppendTo(resp)
	req.hdr.Version = 0 // answered at v0, header v0
	return localReply(req, resp)
}
