package proxy

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// Warming the cluster a switch goes to. When a switch starts (the phase
// leaves serving), the cluster it switches to gets a metadata refresh and
// has the coordinators of every group and transactional ID the old cluster
// has served looked up, in batches, while the writes are still held: at
// the flip every connection's first request finds them cached instead of
// asking the new cluster, each on its own reader, all at once.

// warmBatch is how many keys one FindCoordinator asks for (v4 takes many).
const warmBatch = 100

// warmLoop warms the target of every switch that starts, and notes when
// this member takes each generation (group_member.go), until the server
// closes.
func (s *Server) warmLoop() {
	var warmed *routing.Switch
	for {
		changed := s.routes.Changed()
		st := s.routes.Current()
		s.noteGeneration(st.Generation)
		if st.Phase != routing.PhaseServing && st.Last != nil && st.Last != warmed && st.Last.To != st.Active {
			warmed = st.Last
			if from, to := s.cluster(st.Active), s.cluster(st.Last.To); from != nil && to != nil && to.Started.Load() {
				s.warm(from, to)
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case <-changed:
		}
	}
}

// warm refreshes to's metadata and looks up on to the coordinators from
// has cached.
func (s *Server) warm(from, to *upstream.Cluster) {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := to.Refresh(ctx, true); err != nil {
		s.log.Info("warming the switch's target: metadata refresh failed", zap.String("cluster", to.Name), zap.Error(err))
	}
	byType := map[int8][]string{}
	keys := from.CoordinatorKeys()
	// The most recently used first: the 10 s may not cover them all.
	for _, k := range slices.Backward(keys) {
		byType[k.Type] = append(byType[k.Type], k.Key)
	}
	n := 0
	for typ, keys := range byType {
		for len(keys) > 0 {
			batch := keys[:min(warmBatch, len(keys))]
			keys = keys[len(batch):]
			if _, err := to.FindCoordinators(ctx, typ, batch); err != nil {
				s.log.Info("warming the switch's target: coordinator lookup failed", zap.String("cluster", to.Name), zap.Error(err))
				break
			}
			n += len(batch)
		}
	}
	s.log.Info("warmed the switch's target", zap.String("cluster", to.Name), zap.Int("coordinators", n), zap.Duration("took", time.Since(start)))
}
