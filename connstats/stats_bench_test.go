package connstats

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// The accounting alone, per request: what the reader and writer add for
// one Produce request and its answer, and the error-code walk of a
// decoded one-partition answer.
func BenchmarkConnectionStatsPerRequest(b *testing.B) {
	st := new(Stats)
	resp := kmsg.NewPtrProduceResponse()
	resp.Topics = []kmsg.ProduceResponseTopic{{Topic: "t", Partitions: []kmsg.ProduceResponseTopicPartition{{Partition: 0}}}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		st.Request(0, 200)
		st.CountResponse(resp)
		st.Answer(80, 300*time.Microsecond)
	}
}
