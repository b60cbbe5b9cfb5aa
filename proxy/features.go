package proxy

// Feature flags (KIP-584) in ApiVersions. Clients choose behaviour by the
// finalized levels: transaction.version 2 makes the Java and franz-go
// producers skip AddPartitionsToTxn and AddOffsetsToTxn (the brokers add
// partitions implicitly on Produce v12+ and TxnOffsetCommit v5+) and take
// a new epoch from every EndTxn v5; group.version 1 lets consumers use the
// KIP-848 protocol. A client that behaves by a level one cluster finalizes
// and the other does not would fail after a switch, so Ferry advertises
// the intersection over every configured cluster. While a cluster is not
// reached yet its levels are unknown: Ferry then finalizes no more than
// the routing state saved at the last switch (every cluster reached
// then; a restart after a forced failover from a dead cluster), else
// nothing: the clients' fallback (the behaviour before the feature) works
// on both.
//
// The epoch is Ferry's own, the Unix time in milliseconds when the
// advertised set last changed (at least one more than the last): the Java
// client keeps the answer with the highest epoch it has seen from any
// broker, so it must grow across changes and restarts, whichever member
// answers.

import (
	"maps"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/upstream"
)

// advertisedFeatures is the feature set Ferry advertises and what it was
// computed from.
type advertisedFeatures struct {
	mu      sync.RWMutex
	known   map[string]protocol.Features // by cluster, once reached
	current protocol.Features
	epoch   int64
}

// learnFeatures records the features of a cluster just reached (late:
// after Start) and recomputes what is advertised.
func (s *Server) learnFeatures(u *upstream.Cluster, late bool) {
	a := &s.features
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.known == nil {
		a.known = make(map[string]protocol.Features, len(s.clusters()))
	}
	a.known[u.Name] = u.Features
	s.advertiseFeatures(u.Name, late)
}

// forgetFeatures drops a retired cluster's features and recomputes what is
// advertised.
func (s *Server) forgetFeatures(name string) {
	a := &s.features
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.known, name)
	s.advertiseFeatures(name, true)
}

// advertiseFeatures recomputes what is advertised from what is known, a
// cluster having been reached or retired; a.mu is held.
func (s *Server) advertiseFeatures(cluster string, late bool) {
	a := &s.features
	var sets []protocol.Features
	for _, f := range a.known {
		sets = append(sets, f)
	}
	next := protocol.IntersectFeatures(sets...)
	missing := len(a.known) < len(s.clusters())
	if missing {
		// No more than the routing state saved, every cluster
		// reached then: the cluster not reached yet finalized them.
		saved := s.routes.Current().Features
		fin := map[string]int16{}
		for name, level := range next.Finalized {
			if l, ok := saved[name]; ok {
				fin[name] = min(level, l)
			}
		}
		next.Finalized = fin
	}
	if a.epoch != 0 && next.Equal(a.current) {
		return
	}
	a.current = next
	a.epoch = max(a.epoch+1, time.Now().UnixMilli())
	log := s.log.Debug
	if late { // a change while serving: clients learn new levels
		log = s.log.Info
	}
	log("advertising the feature levels every cluster reached finalizes",
		zap.String("cluster", cluster), zap.Bool("clusters_missing", missing),
		zap.Any("finalized", next.Finalized), zap.Int64("epoch", a.epoch))
}

// appendFeatures fills an ApiVersions response's features.
func (s *Server) appendFeatures(resp *kmsg.ApiVersionsResponse) {
	s.features.mu.RLock()
	defer s.features.mu.RUnlock()
	s.features.current.AppendTo(resp, s.features.epoch)
}

// SavedFeatures is the finalized levels Ferry advertises, in the form the
// routing state saves (routing.State.Features), or nil while a configured
// cluster has not been reached (SavedVersions says why).
func (s *Server) SavedFeatures() map[string]int16 {
	s.features.mu.RLock()
	defer s.features.mu.RUnlock()
	if len(s.features.known) < len(s.clusters()) {
		return nil
	}
	if out := maps.Clone(s.features.current.Finalized); out != nil {
		return out
	}
	return map[string]int16{} // none finalized: saved as such, not "keep the last"
}

// Features returns the features Ferry advertises and their epoch.
func (s *Server) Features() (protocol.Features, int64) {
	s.features.mu.RLock()
	defer s.features.mu.RUnlock()
	return s.features.current, s.features.epoch
}
