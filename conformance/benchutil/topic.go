package benchutil

import (
	"context"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// CreateTopic creates a benchmark's topic on the cluster at bootstrap:
// partitions, replicated 3 times. Every produce run writes a few GB, three
// times over: without a bound the runs of one benchmark fill tens of GB of
// disk, so a partition keeps 1 GiB, far more than a consume run reads of
// it, and deleted segments go at once, not a minute later.
func CreateTopic(ctx context.Context, bootstrap, topic string, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bootstrap, ",")...))
	if err != nil {
		return err
	}
	defer cl.Close()
	configs := map[string]*string{"retention.bytes": kadm.StringPtr("1073741824"), "segment.bytes": kadm.StringPtr("268435456"),
		"file.delete.delay.ms": kadm.StringPtr("1000")}
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(partitions), 3, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// EndOffsets returns the end offset of every partition of topic.
func EndOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, nil
}
