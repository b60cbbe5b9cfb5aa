package proxy

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A partition Ferry answers itself (an error, or a placeholder for a fetch
// still parked upstream) carries empty records, not null: librdkafka
// refuses a response with null records whole ("invalid MessageSetSize -1"),
// as it first did after a switchover answered FENCED_LEADER_EPOCH.
func TestOwnFetchAnswersHaveEmptyRecords(t *testing.T) {
	c := &clientConn{}
	for name, p := range map[string]kmsg.FetchResponseTopicPartition{
		"error":       fetchError(1, kerr.FencedLeaderEpoch.Code),
		"placeholder": c.fetchPlaceholder(tp{"t", 1}, 7),
	} {
		for _, v := range []int16{4, 11, 12, 16} {
			resp := kmsg.NewPtrFetchResponse()
			resp.Version = v
			topic := kmsg.NewFetchResponseTopic()
			topic.Topic = "t"
			topic.Partitions = []kmsg.FetchResponseTopicPartition{p}
			resp.Topics = []kmsg.FetchResponseTopic{topic}
			back := kmsg.NewPtrFetchResponse()
			back.Version = v
			if err := back.ReadFrom(resp.AppendTo(nil)); err != nil {
				t.Fatalf("%s v%d: %v", name, v, err)
			}
			if got := back.Topics[0].Partitions[0].RecordBatches; got == nil || len(got) != 0 {
				t.Errorf("%s v%d: records %v, want empty and not null", name, v, got)
			}
		}
	}
}
