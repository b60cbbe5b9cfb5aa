//go:build faults

package proxy

import (
	"os"
	"strconv"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// In a member built for fault injection (go build -tags faults),
// FERRY_FAULT_STREAMS_COMMITS=N refuses the first N EndTxn(commit) of Kafka
// Streams producers (streamsProducer) as Ferry refuses the commit of a
// transaction a switch aborted, without sending them: the test of Streams'
// recovery from that answer (conformance TestStreamsCommitRefused) cannot
// otherwise time a switch between a transaction's offsets and its commit.
// The transaction stays open on the cluster until the producer Streams
// makes next initialises its transactional ID, which aborts it, as a
// switch's drain would have.
var streamsCommitFaults = func() *atomic.Int64 {
	var n atomic.Int64
	if v, err := strconv.Atoi(os.Getenv("FERRY_FAULT_STREAMS_COMMITS")); err == nil {
		n.Store(int64(v))
	}
	return &n
}()

// faultRefusedCommit reports whether kr is a commit the fault refuses.
func faultRefusedCommit(req *request, kr kmsg.Request) bool {
	end, ok := kr.(*kmsg.EndTxnRequest)
	if !ok || !end.Commit || !streamsProducer(req.hdr.ClientID) {
		return false
	}
	return streamsCommitFaults.Add(-1) >= 0
}
