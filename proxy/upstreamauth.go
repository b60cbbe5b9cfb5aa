package proxy

// The state of authentication an operator sees (/status), and what a
// client and an operator learn of an upstream authentication that
// failed: a cluster refusing the credentials Ferry connects with (its
// service identity's, or a mapped principal's). The client is answered its
// API's retriable code and a short message; the broker's address, the
// upstream user and the broker's own message go to the log (package upstream) and
// to /status (Server.UpstreamAuthFailures), where the operator who can fix them looks.

import (
	"slices"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/upstream"
)

// upstreamAuthMessage is what a client is told of a failed upstream
// authentication.
const upstreamAuthMessage = "the cluster refused the credentials Ferry connects with for this client; Ferry's log and /status say more"

// clientErrorText is err as a client may read it: an upstream
// authentication failure without its details.
func clientErrorText(err error) string {
	if upstream.AuthFailed(err) {
		return upstreamAuthMessage
	}
	return err.Error()
}

// OAuthKeys is the state of OAUTHBEARER's key set, nil without
// OAUTHBEARER: /status shows it.
func (s *Server) OAuthKeys() *clientauth.OAuthKeysStatus {
	if s.auth == nil {
		return nil
	}
	return s.auth.OAuthStatus()
}

// UpstreamAuthFailures are the identities a cluster refuses now, Ferry's
// own or a mapped principal's, by cluster: /status shows them.
func (s *Server) UpstreamAuthFailures() []upstream.AuthFailure {
	names := make([]string, 0, len(s.clusters()))
	for name := range s.clusters() {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []upstream.AuthFailure
	for _, name := range names {
		out = append(out, s.cluster(name).AuthFailures()...)
	}
	return out
}

// AuthReady is nil when client authentication can succeed, else why not:
// OAUTHBEARER's keys not fetched yet. /readyz reports it.
func (s *Server) AuthReady() error {
	if s.auth == nil {
		return nil
	}
	return s.auth.Ready()
}
