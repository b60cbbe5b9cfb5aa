package proxy

// How a client's identity reaches the clusters. By default every pooled
// connection authenticates as Ferry (Cluster.Security): the brokers' ACLs
// see Ferry. A cluster may map client principals to their own credentials
// (Cluster.Principals): a client authenticated as a mapped principal checks
// out connections of that principal's pools, opened with its credentials, so
// the brokers authorize each application as itself.
//
// Identities are numbered once, at New: 0 is the service identity, 1..n
// the principals any cluster maps, in order. A client connection looks its
// number up once, when it authenticates (setPrincipal); a checkout then takes
// the pool of (broker, number) from the map that held the pool of broker
// alone before, so the hot path costs no more lookups than it did.
//
// What goes on the mapped identity: every request a client sends that
// Ferry forwards on a pooled connection (Produce, Fetch, ListOffsets, the
// group and transaction APIs, the admin APIs). What stays on the service
// identity: Ferry's own requests on its control client (metadata,
// coordinator lookups, the fan-out of ListGroups and the like, the
// cluster's authorized operations), the mirror and the routing store.
//
// A principal no cluster maps goes on the service identity, or, with
// WithRefuseUnmapped, fails its authentication: SaslAuthenticate answers
// SASL_AUTHENTICATION_FAILED naming the principal, and a listener without
// SASL closes the connection after the TLS handshake. Every client family
// reports a failed authentication as fatal and with its message; an
// authorization error per request would leave Metadata (answered on the
// service identity) working and the client retrying.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/clientauth"
	"github.com/ferry-gw/ferry/protocol/clusterauth"
	"github.com/ferry-gw/ferry/upstream"
)

// identities numbers the principals mapped by any cluster.
type identities struct {
	index map[string]int32 // principal → 1..n
	names []string         // by number; names[0] is "" (the service identity)
}

func newIdentities(clusters []upstream.Config) identities {
	var names []string
	for _, cl := range clusters {
		for p := range cl.Principals {
			if !slices.Contains(names, p) {
				names = append(names, p)
			}
		}
	}
	slices.Sort(names)
	id := identities{index: make(map[string]int32, len(names)), names: append([]string{""}, names...)}
	for i, p := range names {
		id.index[p] = int32(i + 1)
	}
	return id
}

// securities lays out a cluster's credentials by identity number: [0] is
// the service identity, [i] the credentials of principal i (nil when the
// cluster does not map it: its requests go on the service identity).
func (id identities) securities(cl upstream.Config) []*clusterauth.Security {
	out := make([]*clusterauth.Security, len(id.names))
	out[0] = cl.Security
	for p, sec := range cl.Principals {
		out[id.index[p]] = sec
	}
	return out
}

// identity is the number of the identity a client of principal p uses.
func (s *Server) identity(p string) int32 { return s.idents.index[p] }

// refusesUnmapped reports whether a client authenticated as p is refused:
// WithRefuseUnmapped is on and no cluster maps p.
func (s *Server) refusesUnmapped(p string) bool {
	return s.cfg.refuseUnmapped && s.identity(p) == 0
}

// unmappedFailure is the authentication failure of an unmapped principal.
func unmappedFailure(principal string) *clientauth.Failure {
	return &clientauth.Failure{Reason: "unmapped_principal", User: principal,
		Msg: fmt.Sprintf("principal %s has no credentials towards the clusters (unmapped principals are refused)", principal)}
}

// PrincipalFailure is a mapped principal that could not authenticate.
type PrincipalFailure struct {
	Principal string
	Err       error
}

func (f PrincipalFailure) String() string { return f.Principal + ": " + f.Err.Error() }

// principalCheckTimeout bounds one principal's check; principalCheckers
// is how many run at once.
const (
	principalCheckTimeout = 10 * time.Second
	principalCheckers     = 4
)

// CheckPrincipals authenticates every principal cluster maps, one
// connection and SASL exchange each to one of its brokers, a few at once,
// each bounded in time, and returns those that failed, by principal. The
// switchover runs it against its target before it holds any write: a
// principal that cannot authenticate there would lose its access at the
// flip.
func (s *Server) CheckPrincipals(ctx context.Context, cluster string) ([]PrincipalFailure, error) {
	u := s.cluster(cluster)
	if u == nil {
		return nil, fmt.Errorf("cluster %q is not configured", cluster)
	}
	addrs := u.BrokerAddrs()
	var (
		mu    sync.Mutex
		fails []PrincipalFailure
		wg    sync.WaitGroup
		slots = make(chan struct{}, principalCheckers)
	)
	for i, sec := range u.Idents {
		if i == 0 || sec == nil {
			continue
		}
		name := s.idents.names[i]
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if err := sec.Check(ctx, principalCheckTimeout, addrs); err != nil {
				mu.Lock()
				fails = append(fails, PrincipalFailure{Principal: name, Err: err})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(fails, func(a, b PrincipalFailure) int {
		switch {
		case a.Principal < b.Principal:
			return -1
		case a.Principal > b.Principal:
			return 1
		}
		return 0
	})
	return fails, nil
}

// refuseUnmappedWithoutSASL closes, right after the TLS handshake, a
// connection that no SASL authentication will follow (the listener has
// none) whose principal, from its certificate or none, is refused.
func (c *clientConn) refuseUnmappedWithoutSASL() error {
	if c.s.auth != nil || !c.s.cfg.refuseUnmapped {
		return nil
	}
	p := c.principalName()
	if !c.s.refusesUnmapped(p) {
		return nil
	}
	c.s.authMetrics.Failed("TLS", "unmapped_principal")
	f := unmappedFailure(p)
	if p == "" {
		f.Msg = "a client without a certificate has no credentials towards the clusters (unmapped principals are refused)"
	}
	c.logRefusal(zapcore.InfoLevel, "auth_failed", "client refused: unmapped principal; closing the connection", zap.String("error", f.Msg))
	return fmt.Errorf("%w (TLS, unmapped_principal): %s", errAuthFailed, f.Msg)
}
