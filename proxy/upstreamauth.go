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
	"strings"
	"sync"
	"time"

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

// UpstreamAuthFailure is the last failed authentication of one identity
// towards one cluster, until a connection of that identity authenticates.
type UpstreamAuthFailure struct {
	Cluster string `json:"cluster"`
	// Principal is the mapped client principal, "" for Ferry's own
	// (service) identity.
	Principal string    `json:"principal,omitempty"`
	Broker    int32     `json:"broker"`
	At        time.Time `json:"at"`
	Error     string    `json:"error"`
}

// upstreamAuthFailures are an upstream's current failures, by principal.
type upstreamAuthFailures struct {
	mu    sync.Mutex
	fails map[string]UpstreamAuthFailure
}

// note records the outcome of a dial of principal's identity: a failure,
// or nil, which clears it.
func (f *upstreamAuthFailures) note(cluster, principal string, broker int32, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fails, principal)
		return
	}
	if f.fails == nil {
		f.fails = map[string]UpstreamAuthFailure{}
	}
	f.fails[principal] = UpstreamAuthFailure{Cluster: cluster, Principal: principal, Broker: broker, At: time.Now().UTC(), Error: err.Error()}
}

func (f *upstreamAuthFailures) list() []UpstreamAuthFailure {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]UpstreamAuthFailure, 0, len(f.fails))
	for _, e := range f.fails {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b UpstreamAuthFailure) int { return strings.Compare(a.Principal, b.Principal) })
	return out
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
