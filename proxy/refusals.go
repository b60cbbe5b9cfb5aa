package proxy

// Refusals: every request or frame Ferry does not serve is counted in
// ferry_refusals_total{api,reason} and logged through a sampler, so that a
// stream of bad connections is visible in the metrics and cheap in the logs.
// Those that close the connection log one sampled line where they are made;
// the connection's close then logs at debug only.

import (
	"errors"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Refusal reasons, the reason label of ferry_refusals_total.
const (
	reasonBadFrame           = "bad_frame"                 // oversized or malformed frame or header: closed
	reasonUnknownKey         = "unknown_key"               // an API key Ferry does not serve: closed
	reasonUnsupportedVersion = "unsupported_version"       // a served key at a version Ferry does not advertise: closed (ApiVersions: answered)
	reasonMalformedBody      = "malformed_body"            // a body that does not decode: closed
	reasonSASL               = "sasl"                      // SaslHandshake: answered; SaslAuthenticate: closed
	reasonPolicy             = "policy"                    // refused by the request policy: answered
	reasonInternalTopic      = "internal_topic"            // named one of Ferry's own topics: answered (internal_topics.go)
	reasonInternalTxnID      = "internal_transactional_id" // named the transactional ID of Ferry's routing state writes: answered (internal_topics.go)
	reasonUnknownTopicID     = "unknown_topic_id"          // a topic ID Ferry did not issue: answered (topic_refusals.go)
	reasonKafkaInternalTopic = "kafka_internal_topic"      // deletes or changes of one of Kafka's internal topics: answered (topic_refusals.go)
	reasonUpstream           = "upstream"                  // answered in the broker's place (also ferry_upstream_failures_total)
)

// refusal is an error that refuses a client's request or frame: already
// counted, and logged (sampled) where it is made.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// refuse counts a refusal of a request of key that closes the connection
// and returns the error that closes it.
func (s *Server) refuse(key int16, reason string, err error) error {
	s.metrics.refused(key, reason)
	return &refusal{reason: reason, err: err}
}

// refuseFrame counts and logs a frame or header that cannot be read, and
// returns the error that closes the connection.
func (c *clientConn) refuseFrame(msg string, err error) error {
	c.s.metrics.badFrames.Inc()
	err = c.s.refuse(-1, reasonBadFrame, err)
	c.logRefusal(zapcore.WarnLevel, reasonBadFrame, msg, zap.Error(err))
	return err
}

// logRefusal writes one line about a refusal for reason, unless the
// sampler has written one for that reason within its interval; the line
// says how many it suppressed before it.
func (c *clientConn) logRefusal(lvl zapcore.Level, reason, msg string, fields ...zap.Field) {
	if !c.log.Core().Enabled(lvl) {
		return
	}
	suppressed, ok := c.s.refusalLogs.Allow(reason)
	if !ok {
		return
	}
	fields = append(fields, zap.String("reason", reason))
	if suppressed > 0 {
		fields = append(fields, zap.Int("suppressed", suppressed))
	}
	if ce := c.logger().Check(lvl, msg); ce != nil {
		ce.Write(fields...)
	}
}

// refusalReason is the reason of a refusal error, "" for any other error.
func refusalReason(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.reason
	}
	return ""
}
