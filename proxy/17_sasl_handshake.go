package proxy

// SaslHandshake (key 17), v0-v1.
//
// Without SASL on the listeners (WithClientSASL), a client configured for
// SASL is answered UNSUPPORTED_SASL_MECHANISM with an empty mechanism
// list, so it can say why it cannot connect ("the server enables no
// mechanisms"), and the connection stays open. The key is advertised in
// ApiVersions although Ferry never authenticates then: franz-go and
// librdkafka send the handshake only to a broker that advertises it, and
// otherwise write raw SASL tokens, which Ferry could only close as a bad
// frame (Java clients send it regardless). SaslAuthenticate is not
// advertised; sent anyway, it closes the connection with a logged reason
// (dispatch.go).
//
// With SASL on, the mechanism's tokens travel in SaslAuthenticate requests
// (36_sasl_authenticate.go), which every client of the last years uses
// with handshake v1 when the broker advertises SaslAuthenticate (Java,
// librdkafka, franz-go, kafkajs). v0 stays advertised, because librdkafka
// up to 2.0 checks that the range starts at 0 before it authenticates at
// all; but v0's raw tokens, outside Kafka's framing, are not read: a v0
// handshake is answered UNSUPPORTED_VERSION and the connection closed. A mechanism Ferry does not offer is answered
// UNSUPPORTED_SASL_MECHANISM with the offered list, and the connection
// stays open for a handshake with another mechanism: a Kafka broker
// closes it, but franz-go, configured with several mechanisms, retries
// the next one on the same connection, and nothing is gained by closing
// (the connection still reaches no cluster). A handshake after one that
// chose a mechanism is answered ILLEGAL_SASL_STATE and closes the
// connection.

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/protocol"
)

// saslHandshakeVersions is what Ferry answers; it needs nothing upstream.
var saslHandshakeVersions = protocol.VersionRange{Min: 0, Max: 1}

// withSASL adds SaslHandshake, and with SASL on SaslAuthenticate, to what
// Ferry advertises.
func (s *Server) withSASL(vs protocol.Versions) protocol.Versions {
	vs[int16(kmsg.SASLHandshake)] = saslHandshakeVersions
	if s.auth != nil {
		vs[int16(kmsg.SASLAuthenticate)] = saslAuthenticateVersions
	}
	return vs
}

func handleSASLHandshake(s *Server, c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	in := kr.(*kmsg.SASLHandshakeRequest)
	resp := kmsg.NewPtrSASLHandshakeResponse()
	if s.auth == nil {
		s.metrics.refused(req.hdr.Key, reasonSASL)
		c.logRefusal(zapcore.InfoLevel, reasonSASL, "refused SASL handshake: Ferry's listeners offer no SASL; configure the client without SASL",
			zap.String("mechanism", in.Mechanism))
		resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
		resp.SupportedMechanisms = []string{}
		return localReply(req, resp), nil
	}
	resp.SupportedMechanisms = s.auth.Config().Mechanisms
	switch {
	case req.hdr.Version == 0:
		s.authMetrics.Failed("", "illegal_state")
		resp.ErrorCode = kerr.UnsupportedVersion.Code
		c.logRefusal(zapcore.InfoLevel, "auth_failed", "SaslHandshake v0 (raw SASL tokens) is not supported; closing the connection: use a client that sends SaslAuthenticate (Kafka 1.0 and later)",
			zap.String("mechanism", in.Mechanism))
		c.auth.closeAfter = fmt.Errorf("%w: SaslHandshake v0 (raw SASL tokens) is not supported", errAuthFailed)
	case c.auth.done || c.auth.mechanism != "":
		s.authMetrics.Failed(c.auth.mechanism, "illegal_state")
		resp.ErrorCode = kerr.IllegalSaslState.Code
		if !c.auth.done {
			c.auth.closeAfter = fmt.Errorf("%w: a second SaslHandshake", errAuthFailed)
		}
	case !s.auth.Offers(in.Mechanism):
		s.authMetrics.Failed("", "unsupported_mechanism")
		resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
		c.logRefusal(zapcore.InfoLevel, "auth_failed", "client asked for a SASL mechanism Ferry does not offer",
			zap.String("mechanism", in.Mechanism), zap.Strings("offered", s.auth.Config().Mechanisms))
	default:
		c.auth.mechanism = in.Mechanism
	}
	return localReply(req, resp), nil
}
