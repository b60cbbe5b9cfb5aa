package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/failover"
	"github.com/ferry-gw/ferry/membership"
	"github.com/ferry-gw/ferry/mirror"
	"github.com/ferry-gw/ferry/routing"
)

// Fleet calls of automatic failover.
const (
	// callFailoverView asks a member for its view (failover.View).
	callFailoverView = "failover.view"
	// callFailoverPause tells a member that the pause was saved
	// (failoverPauseCall): it puts it in force at once rather than at
	// its next lease renewal.
	callFailoverPause = "failover.pause"
)

// failoverPauseCall is the body of callFailoverPause.
type failoverPauseCall struct {
	Generation uint32                 `json:"generation"`
	Paused     *routing.FailoverPause `json:"paused"`
}

// failoverRole is this member's part in automatic failover: the probes of
// both clusters, on clients of their own (a probe waiting on a dead
// cluster delays no switch's listing), and the runner.
type failoverRole struct {
	r *failover.Runner

	mu      sync.Mutex
	probers map[string]*kgo.Client
	closed  bool
	stop    context.CancelFunc // ends Run (set by runFailover)
	stopped string             // why it stopped while the member runs (retire), or ""
}

// newFailover builds the runner of cfg.Failover, on a member whose mirror
// and switcher are built.
func (n *node) newFailover(cfg *Config) *failoverRole {
	fr := &failoverRole{probers: map[string]*kgo.Client{}}
	fc := failover.Config{
		Policy: cfg.Failover.policy(),
		Self:   cfg.NodeID,
		Routes: n.routes.Current,
		Standby: func(active string) string {
			s, err := n.mirror.standbyOf(active)
			if err != nil {
				return ""
			}
			return s
		},
		Probe:      func(ctx context.Context, cluster string) error { return fr.probe(ctx, n.mirror, cluster) },
		Lag:        n.mirror.lag,
		LoadFrom:   n.store.LoadFrom,
		Switch:     n.switchover,
		Log:        n.log.Named("failover"),
		Registerer: n.reg,
	}
	if f := n.fleet; f != nil {
		fc.Members = func() []failover.Member {
			var out []failover.Member
			for _, m := range f.m.Members() {
				if m.State == membership.Left {
					continue
				}
				out = append(out, failover.Member{ID: m.NodeID, Alive: m.State == membership.Alive || m.State == membership.Suspect,
					Starting: m.Starting && !m.Self})
			}
			return out
		}
		fc.Views = func(ctx context.Context) []failover.View {
			answers, _, _ := f.callLive(ctx, callFailoverView, nil)
			out := make([]failover.View, 0, len(answers))
			for id, b := range answers {
				var v failover.View
				if err := json.Unmarshal(b, &v); err != nil || v.Member != id {
					continue
				}
				out = append(out, v)
			}
			return out
		}
		f.m.Handle(callFailoverView, func(context.Context, int32, []byte) ([]byte, error) {
			return json.Marshal(fr.r.View())
		})
		f.m.Handle(callFailoverPause, func(_ context.Context, _ int32, body []byte) ([]byte, error) {
			var c failoverPauseCall
			if err := json.Unmarshal(body, &c); err != nil {
				return nil, err
			}
			n.routes.SetFailoverPause(c.Generation, c.Paused)
			return nil, nil
		})
	}
	fr.r = failover.New(fc)
	return fr
}

// probe asks the cluster for its brokers (a Metadata request naming no
// topic): what every client asks first.
func (fr *failoverRole) probe(ctx context.Context, r *mirrorRunner, cluster string) error {
	fr.mu.Lock()
	if fr.closed {
		fr.mu.Unlock()
		return mirror.ErrClosed
	}
	cl := fr.probers[cluster]
	if cl == nil {
		var err error
		if cl, err = r.client(cluster, kgo.ClientID("ferry-failover"), kgo.RequestRetries(0)); err != nil {
			fr.mu.Unlock()
			return err
		}
		fr.probers[cluster] = cl
	}
	fr.mu.Unlock()
	req := kmsg.NewPtrMetadataRequest()
	// An empty list, not none: no topics listed asks for every topic
	// (v1+), each partition of each, twice a second on each cluster.
	req.Topics = []kmsg.MetadataRequestTopic{}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	if len(resp.Brokers) == 0 {
		return fmt.Errorf("cluster %s lists no broker", cluster)
	}
	return nil
}

// retire stops automatic failover for good when cluster is retired (one
// cluster is left: nothing to fail over to), and says so in its status.
func (fr *failoverRole) retire(cluster string) {
	fr.mu.Lock()
	fr.stopped = fmt.Sprintf("cluster %q retired: one cluster left, nothing to fail over to", cluster)
	fr.mu.Unlock()
	fr.close()
}

// status is the runner's, unless retire stopped it: then disabled, with
// the reason and without the last decision, which no longer stands.
func (fr *failoverRole) status() failover.Status {
	st := fr.r.Status()
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.stopped != "" {
		st.Enabled, st.Stopped = false, fr.stopped
		st.Verdict, st.ActInSeconds = nil, nil
	}
	return st
}

func (fr *failoverRole) close() {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fr.closed = true
	if fr.stop != nil {
		fr.stop()
	}
	for _, cl := range fr.probers {
		cl.Close()
	}
	fr.probers = nil
}

// lag is the running mirror's lag: records summed over the partitions this
// member mirrors, seconds the largest; false while no mirror runs or a
// partition's source end is not known yet.
func (r *mirrorRunner) lag() (records int64, seconds float64, ok bool) {
	c := r.cur.Load()
	if c == nil {
		return 0, 0, false
	}
	for _, st := range c.m.Status() {
		if st.SourceEnd < 0 {
			return 0, 0, false
		}
		records += st.LagRecords
		seconds = max(seconds, st.LagTime.Seconds())
	}
	return records, seconds, true
}

// failoverPause saves the pause (nil: the resume) in the routing state and
// puts it in force on every live member; one that misses the call takes
// it at its next lease renewal, a restarted one from the saved state.
func (n *node) failoverPause(ctx context.Context, p *routing.FailoverPause) (routing.State, error) {
	st, err := n.switcher.SetFailoverPause(ctx, p)
	if err != nil || n.fleet == nil {
		return st, err
	}
	body, err := json.Marshal(failoverPauseCall{Generation: st.Generation, Paused: p})
	if err != nil {
		return st, err
	}
	_, failed, unreached := n.fleet.callLive(ctx, callFailoverPause, body)
	for id, err := range failed {
		n.log.Warn("a member did not take the failover pause at once; it will at its next lease renewal", zap.Int32("member", id), zap.Error(err))
	}
	for _, id := range unreached {
		n.log.Warn("a member was not reached with the failover pause; it will take it at its next lease renewal", zap.Int32("member", id))
	}
	return st, nil
}

// runFailover runs the runner until the node closes.
func (n *node) runFailover() {
	if n.failover == nil {
		return
	}
	if n.fleet != nil {
		n.fleet.m.SetStarting(false) // the others may now take it for the one deciding
	}
	fr := n.failover
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.closed {
		return
	}
	ctx, stop := context.WithCancel(n.storeCtx)
	fr.stop = stop
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.log.Info("automatic failover on", zap.Duration("after", n.cfg.Failover.After), zap.Duration("min_interval", n.cfg.Failover.MinInterval))
		fr.r.Run(ctx)
	}()
}
