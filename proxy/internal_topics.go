package proxy

// Ferry's own topics (WithInternalTopics): the routing state's compacted
// topic on every cluster (routing.DefaultStoreTopic). A member that starts
// obeys the highest generation it reads there, so a client that could write
// it could steer the next restart, and one that could delete it, or shorten
// its retention, could lose the state. Ferry treats these topics as Kafka
// treats a topic the client's principal may not describe: answers that
// list topics leave them out, and whatever names one is answered
// TOPIC_AUTHORIZATION_FAILED by Ferry and never forwarded.
//
//   - Metadata (03_metadata.go) lists none for all topics; one named, by
//     name or virtual ID, is not asked upstream, so auto-creation cannot
//     make it.
//   - Split requests (Produce, Fetch, ListOffsets, DeleteRecords,
//     OffsetForLeaderEpoch, DescribeProducers): its partitions are refused
//     where the request is split by leader (splitTopics, splitByLeader),
//     the other topics served.
//
// Admin requests naming them, and the admin answers listing topics, are
// not covered yet.

import (
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferry-gw/ferry/routing"
)

// internalTopics are Ferry's own topics, by name and by the virtual ID
// clients would know them by.
type internalTopics struct {
	names []string
	ids   [][16]byte
}

func newInternalTopics(clusterID string, names []string) internalTopics {
	it := internalTopics{names: slices.Clone(names)}
	for _, n := range names {
		it.ids = append(it.ids, routing.VirtualTopicID(clusterID, n))
	}
	return it
}

// has reports whether name is an internal topic: one string compare per
// internal topic (there is one), cheap enough for every topic of every
// Produce and Fetch.
func (it *internalTopics) has(name string) bool {
	for _, n := range it.names {
		if n == name {
			return true
		}
	}
	return false
}

func (it *internalTopics) hasID(id [16]byte) bool {
	return slices.Contains(it.ids, id)
}

// internalRefused counts and logs (sampled) a request that named an
// internal topic.
func (s *Server) internalRefused(c *clientConn, req *request) {
	s.metrics.refused(req.hdr.Key, reasonInternalTopic)
	c.logRefusal(zapcore.InfoLevel, reasonInternalTopic, "request naming Ferry's own topic refused",
		zap.String("api", apiLabel(req.hdr.Key)))
}
