package proxy

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferry-gw/ferry/protocol/kfields"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// The coordinator and admin APIs carry topic IDs, producer IDs and leader
// epochs in many shapes. Rather than one hand-written walk per message
// (easy to miss a field as Kafka adds versions), they are rewritten through
// the walks package kfields generates from kmsg's types;
// TestEveryIdentityFieldIsHandled fails when kmsg gains an identity field
// nobody has decided about.
// Produce and Fetch, the hot paths, are rewritten by hand.

// direction says which way identities are mapped.
type direction bool

const (
	toPhysical direction = true  // a client's request going upstream
	toVirtual  direction = false // a broker's answer going to the client
)

// translate maps every topic ID, producer ID and leader epoch in msg (a
// decoded kmsg request or response) and reports whether anything changed.
// Topic IDs Ferry cannot map are left as they are: a request's were taken
// out and answered UNKNOWN_TOPIC_ID before (topic_refusals.go), unless its
// topic went in between, which the broker answers the same; an answer's
// show the client an ID it does not know.
func (s *Server) translate(ctx context.Context, u *upstream.Cluster, gen uint32, msg kfields.Message, dir direction) bool {
	changed := false
	v := &kfields.Visitor{
		TopicID: func(f *[16]byte) {
			id := *f
			if id == ([16]byte{}) {
				return
			}
			var t *upstream.Topic
			if dir == toPhysical {
				t = u.TopicByVID(ctx, id)
			} else {
				t = u.TopicByID(ctx, id)
			}
			if t == nil {
				return
			}
			to := t.VID
			if dir == toPhysical {
				to = t.ID
			}
			if to != id {
				*f = to
				changed = true
			}
		},
	}
	if gen != 0 {
		// Epochs and producer IDs are identity under generation 0.
		// Going upstream, another generation's producer ID names
		// another producer here: never forwarded (otherGeneration
		// answers the requests that carry one before this); a committed
		// offset's leader epoch of another generation becomes unknown
		// (no truncation check) rather than a physical epoch of the
		// other cluster.
		v.ProducerID = func(f *int64) {
			to := byGeneration(*f, gen, dir, routing.PhysicalPID, routing.VirtualPID)
			changed = changed || to != *f
			*f = to
		}
		v.LeaderEpoch = func(f *int32) {
			to := byGeneration(*f, gen, dir, routing.PhysicalEpoch, routing.VirtualEpoch)
			changed = changed || to != *f
			*f = to
		}
	}
	kfields.Visit(msg, v)
	return changed
}

// byGeneration maps a producer ID or leader epoch under generation gen:
// to its physical value (-1, unknown, when it is of another generation)
// or to its virtual one.
func byGeneration[T int32 | int64](v T, gen uint32, dir direction, physical func(uint32, T) (T, bool), virtual func(uint32, T) T) T {
	if dir == toVirtual {
		return virtual(gen, v)
	}
	if p, ok := physical(gen, v); ok {
		return p
	}
	return -1
}

// coordinatorMoved reports whether an answer says the coordinator moved,
// anywhere in it (top level or per group).
func coordinatorMoved(msg kfields.Message) bool {
	moved := false
	kfields.ErrorCodes(msg, func(code int16) {
		moved = moved || code == kerr.NotCoordinator.Code || code == kerr.CoordinatorNotAvailable.Code
	})
	return moved
}
