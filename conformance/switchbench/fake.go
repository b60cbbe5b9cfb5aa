package main

// -fake: the scale mode against two kfake clusters (franz-go's in-process
// fake Kafka) instead of real brokers. The member still runs as its own
// process, so its memory and CPU are its own; the clusters run in this
// one. What it measures is the member's per-partition cost — its metadata,
// its Metadata answers, each mirrored partition's writer parked and
// watched, each switch step's lists — at shapes this machine's brokers
// cannot hold (100,000 partitions). A broker's own time (a log append, a
// transaction coordinator's write) is kfake's, which keeps everything in
// memory: switch times here are the member's share, not a deployment's.

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// cluster is what the bench uses of a cluster: where it listens, and
// closing it.
type cluster interface {
	Addrs() []string
	Bootstrap() string
	Close() error
}

// fakeCluster is a kfake cluster as a cluster.
type fakeCluster struct{ *kfake.Cluster }

func (c fakeCluster) Addrs() []string   { return c.ListenAddrs() }
func (c fakeCluster) Bootstrap() string { return strings.Join(c.ListenAddrs(), ",") }
func (c fakeCluster) Close() error      { c.Cluster.Close(); return nil }

// startFakeClusters starts one 1-broker kfake cluster per name.
func startFakeClusters(names ...string) (map[string]cluster, error) {
	cs := make(map[string]cluster, len(names))
	for _, name := range names {
		kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.ClusterID("switchbench-"+name))
		if err != nil {
			closeClusters(cs)
			return nil, err
		}
		cs[name] = fakeCluster{kf}
	}
	return cs, nil
}

func realClusters(real map[string]*kafkatest.Cluster) map[string]cluster {
	cs := make(map[string]cluster, len(real))
	for name, c := range real {
		cs[name] = c
	}
	return cs
}

func closeClusters(cs map[string]cluster) {
	for _, c := range cs {
		c.Close()
	}
}
