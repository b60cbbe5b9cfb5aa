package clientauth

import (
	"fmt"
	"time"
)

// PreAuthLimits bound a client connection until it has authenticated
// (SASLConfig.PreAuth). Zero values take the defaults.
type PreAuthLimits struct {
	// MaxReceiveSize is the largest frame read before authentication.
	MaxReceiveSize int
	// Timeout closes a connection not authenticated this long after it
	// was accepted.
	Timeout time.Duration
	// MaxPerIP bounds the connections from one source address that have
	// not authenticated yet.
	MaxPerIP int
}

// Defaults of PreAuthLimits.
const (
	// Kafka's sasl.server.max.receive.size: room for any SASL message,
	// an OAUTHBEARER token with many claims included.
	DefaultSASLMaxReceiveSize = 512 << 10
	// A SASL exchange is a few round trips of milliseconds; a client that
	// fetches its OAUTHBEARER token while it authenticates (franz-go
	// does) may wait seconds for its identity provider. 30 s is the
	// request.timeout.ms of Kafka's Java clients: one still not
	// authenticated by then has given up on the attempt.
	DefaultAuthenticationTimeout = 30 * time.Second
	// Connections authenticating at the same moment from one address:
	// a NAT in front of many clients starting together stays far below
	// it, each holding its unauthenticated connections for milliseconds.
	DefaultMaxUnauthenticatedPerIP = 64
	// minSASLMaxReceiveSize leaves room for a SCRAM message with a long
	// user name.
	minSASLMaxReceiveSize = 1 << 10
)

// Validate checks the limits; the errors name the keys of Ferry's
// configuration file.
func (l *PreAuthLimits) Validate() error {
	switch {
	case l.MaxReceiveSize != 0 && l.MaxReceiveSize < minSASLMaxReceiveSize:
		return fmt.Errorf("sasl.max_receive_size %d: must be at least %d bytes (0: the default, %d)", l.MaxReceiveSize, minSASLMaxReceiveSize, DefaultSASLMaxReceiveSize)
	case l.Timeout < 0:
		return fmt.Errorf("sasl.authentication_timeout %s: must be positive (0: the default, %s)", l.Timeout, DefaultAuthenticationTimeout)
	case l.MaxPerIP < 0:
		return fmt.Errorf("sasl.max_unauthenticated_per_ip %d: must be positive (0: the default, %d)", l.MaxPerIP, DefaultMaxUnauthenticatedPerIP)
	}
	return nil
}

// withDefaults fills in the zero values.
func (l PreAuthLimits) withDefaults() PreAuthLimits {
	if l.MaxReceiveSize == 0 {
		l.MaxReceiveSize = DefaultSASLMaxReceiveSize
	}
	if l.Timeout == 0 {
		l.Timeout = DefaultAuthenticationTimeout
	}
	if l.MaxPerIP == 0 {
		l.MaxPerIP = DefaultMaxUnauthenticatedPerIP
	}
	return l
}
