package kafkatest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// pollInterval is how often readiness is polled.
const pollInterval = 250 * time.Millisecond

// waitReady polls every running node directly with a Metadata request until
// each lists every broker in want and names a controller. It fails early if
// a node in watch exits, and with the last poll error when ctx ends.
func (c *Cluster) waitReady(ctx context.Context, want []int32, watch []*node) error {
	clients := make(map[int32]*kgo.Client)
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()
	start := time.Now()
	var lastErr error
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		for _, n := range watch {
			if n.proc.exited() {
				return c.exitError(n)
			}
		}
		lastErr = c.pollOnce(ctx, clients, want)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v: %w", time.Since(start).Round(time.Millisecond), lastErr)
		case <-tick.C:
		}
	}
}

// pollOnce returns nil if every running node's metadata lists want and a
// controller.
func (c *Cluster) pollOnce(ctx context.Context, clients map[int32]*kgo.Client, want []int32) error {
	c.mu.Lock()
	var nodes []*node
	for _, n := range c.nodes {
		if n.running() {
			nodes = append(nodes, n)
		}
	}
	c.mu.Unlock()
	for _, n := range nodes {
		cl := clients[n.id]
		if cl == nil {
			var err error
			cl, err = kgo.NewClient(
				kgo.SeedBrokers(n.addr()),
				kgo.DialTimeout(2*time.Second),
				kgo.RequestRetries(0),
			)
			if err != nil {
				return err
			}
			clients[n.id] = cl
		}
		seeds := cl.SeedBrokers()
		if len(seeds) == 0 {
			return fmt.Errorf("node %d: no seed broker", n.id)
		}
		req := kmsg.NewPtrMetadataRequest()
		req.Topics = []kmsg.MetadataRequestTopic{} // no topics, not all
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		resp, err := seeds[0].Request(rctx, req)
		cancel()
		if err != nil {
			return fmt.Errorf("node %d (%s): metadata: %w", n.id, n.addr(), err)
		}
		md := resp.(*kmsg.MetadataResponse)
		var have []int32
		for _, b := range md.Brokers {
			have = append(have, b.NodeID)
		}
		for _, id := range want {
			if !slices.Contains(have, id) {
				return fmt.Errorf("node %d (%s): metadata lists brokers %v, want %v", n.id, n.addr(), have, want)
			}
		}
		if md.ControllerID < 0 {
			return fmt.Errorf("node %d (%s): metadata names no controller", n.id, n.addr())
		}
	}
	return nil
}
