package proxy

// The state of authentication an operator sees (AuthStatus), and what a
// client and an operator learn of an upstream authentication that
// failed: a cluster refusing the credentials Ferry connects with (its
// service identity's, or a mapped principal's). The client is answered its
// API's retriable code and a short message; the broker's address, the
// upstream user and the broker's own message go to the log (upconn.go) and
// to /status (Server.AuthStatus), where the operator who can fix them looks.

import (
	"slices"

	"github.com/ferry-gw/ferry/clientauth"
)

// upstreamAuthMessage is what a client is told of a failed upstream
// authentication.
const upstreamAuthMessage = "the cluster refused the credentials Ferry connects with for this client; Ferry's log and /status say more"

// clientErrorText is err as a client may read it: an upstream
// authentication failure without its details.
func clientErrorText(err error) string {
	if authFailed(err) {
		return upstreamAuthMessage
	}
	return err.Error()
}

// AuthStatus is the state of authentication that /status reports.
type AuthStatus struct {
	// OAuthKeys is OAUTHBEARER's key set, nil without OAUTHBEARER.
	OAuthKeys *clientauth.OAuthKeysStatus `json:"oauth_keys,omitempty"`
	// UpstreamFailures are the identities a cluster refuses now: Ferry's
	// own, or a mapped principal's.
	UpstreamFailures []UpstreamAuthFailure `json:"upstream_failures,omitempty"`
}

// AuthStatus returns the state of authentication: what /status shows.
func (s *Server) AuthStatus() AuthStatus {
	var st AuthStatus
	if s.auth != nil {
		st.OAuthKeys = s.auth.OAuthStatus()
	}
	names := make([]string, 0, len(s.ups))
	for name := range s.ups {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		st.UpstreamFailures = append(st.UpstreamFailures, s.ups[name].authFails.list()...)
	}
	return st
}

// AuthReady is nil when client authentication can succeed, else why not:
// OAUTHBEARER's keys not fetched yet. /readyz reports it.
func (s *Server) AuthReady() error {
	if s.auth == nil {
		return nil
	}
	return s.auth.Ready()
}
