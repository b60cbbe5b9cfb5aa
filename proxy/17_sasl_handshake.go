package proxy

// SaslHandshake (key 17), v0-v1.
//
// Ferry's listeners offer no SASL. A client configured for SASL is answered
// UNSUPPORTED_SASL_MECHANISM with an empty mechanism list, so it can say
// why it cannot connect ("the server enables no mechanisms"), and the
// connection stays open. The key is advertised in ApiVersions although
// Ferry never authenticates: franz-go and librdkafka send the handshake
// only to a broker that advertises it, and otherwise write raw SASL tokens,
// which Ferry could only close as a bad frame (Java clients send it
// regardless). SaslAuthenticate is not advertised; sent anyway, it closes
// the connection with a logged reason (dispatch.go).

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/protocol"
)

// saslHandshakeVersions is what Ferry answers; it needs nothing upstream.
var saslHandshakeVersions = protocol.VersionRange{Min: 0, Max: 1}

// withSASLHandshake adds SaslHandshake to what Ferry advertises.
func withSASLHandshake(vs protocol.Versions) protocol.Versions {
	vs[int16(kmsg.SASLHandshake)] = saslHandshakeVersions
	return vs
}

func handleSASLHandshake(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.SASLHandshakeRequest)
	s.metrics.refused(req.hdr.Key, reasonSASL)
	c.logRefusal(zapcore.InfoLevel, reasonSASL, "refused SASL handshake: Ferry's listeners offer no SASL; configure the client without SASL",
		zap.String("mechanism", in.Mechanism))
	resp := kmsg.NewPtrSASLHandshakeResponse()
	resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
	resp.SupportedMechanisms = []string{}
	return localReply(req, resp), nil
}
