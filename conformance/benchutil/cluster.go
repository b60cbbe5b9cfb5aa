package benchutil

import (
	"context"
	"errors"
	"sync"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

// StartCluster starts the Kafka cluster cfg describes and creates the
// benchmark's topic on it (CreateTopic). On failure it closes the cluster
// again; on success the caller defers CloseCluster.
func StartCluster(ctx context.Context, cfg kafkatest.Config, topic string, partitions int) (*kafkatest.Cluster, error) {
	c, err := kafkatest.New(cfg)
	if err != nil {
		return nil, err
	}
	err = ctx.Err()
	if err == nil {
		err = CreateTopic(ctx, c.Bootstrap(), topic, partitions)
	}
	if err != nil {
		CloseCluster(c)
		return nil, err
	}
	return c, nil
}

// CloseCluster stops a cluster StartCluster started, saying so: stopping
// three JVMs takes a while.
func CloseCluster(c *kafkatest.Cluster) {
	Step("closing the Kafka cluster")
	c.Close()
}

// StartClusters starts, side by side, one 1-broker cluster per name, named
// prefix+name: a benchmark's primary and standby, or source and target.
// On failure it closes those that started.
func StartClusters(prefix string, names ...string) (map[string]*kafkatest.Cluster, error) {
	return StartClustersWith(prefix, nil, names...)
}

// StartClustersWith is StartClusters, each cluster's configuration passed
// to adjust (when not nil) first.
func StartClustersWith(prefix string, adjust func(name string, c *kafkatest.Config), names ...string) (map[string]*kafkatest.Cluster, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		errs     []error
		clusters = make(map[string]*kafkatest.Cluster, len(names))
	)
	for _, name := range names {
		wg.Go(func() {
			cfg := kafkatest.Config{Brokers: 1, Name: prefix + name}
			if adjust != nil {
				adjust(name, &cfg)
			}
			c, err := kafkatest.New(cfg)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			clusters[name] = c
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		CloseClusters(clusters)
		return nil, err
	}
	return clusters, nil
}

// CloseClusters stops the clusters StartClusters started.
func CloseClusters(clusters map[string]*kafkatest.Cluster) {
	for _, c := range clusters {
		c.Close()
	}
}
