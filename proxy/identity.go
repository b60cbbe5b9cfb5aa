package proxy

import (
	"context"
	"reflect"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferry-gw/ferry/protocol/kfields"
	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

// The coordinator and admin APIs carry topic IDs, producer IDs and leader
// epochs in many shapes. Rather than one hand-written walk per message
// (easy to miss a field as Kafka adds versions), they are rewritten by
// field name over the decoded kmsg structs (package kfields). Produce and
// Fetch, the hot paths, are rewritten by hand.

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
func (s *Server) translate(ctx context.Context, u *upstream.Cluster, gen uint32, msg any, dir direction) bool {
	changed := false
	kfields.Walk(msg, func(name string, f reflect.Value) {
		switch {
		case name == "TopicID" && f.Type() == kfields.UUID:
			id := f.Interface().([16]byte)
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
				f.Set(reflect.ValueOf(to))
				changed = true
			}
		case gen == 0:
			// Epochs and producer IDs are identity under generation 0.
		case name == "ProducerID" && f.Kind() == reflect.Int64:
			v := f.Int()
			if dir == toPhysical {
				// Another generation's ID names another producer
				// here: never forwarded (otherGeneration answers
				// the requests that carry one before this).
				if phys, ok := routing.PhysicalPID(gen, v); ok {
					v = phys
				} else {
					v = -1
				}
			} else {
				v = routing.VirtualPID(gen, v)
			}
			changed = changed || v != f.Int()
			f.SetInt(v)
		case (name == "LeaderEpoch" || name == "CurrentLeaderEpoch") && f.Kind() == reflect.Int32:
			v := int32(f.Int())
			if dir == toPhysical {
				// A committed offset's leader epoch of another
				// generation becomes unknown (no truncation check)
				// rather than a physical epoch of the other cluster.
				if phys, ok := routing.PhysicalEpoch(gen, v); ok {
					v = phys
				} else {
					v = -1
				}
			} else {
				v = routing.VirtualEpoch(gen, v)
			}
			changed = changed || int64(v) != f.Int()
			f.SetInt(int64(v))
		}
	})
	return changed
}

// coordinatorMoved reports whether an answer says the coordinator moved,
// anywhere in it (top level or per group).
func coordinatorMoved(msg any) bool {
	moved := false
	kfields.ErrorCodes(msg, func(code int16) {
		moved = moved || code == kerr.NotCoordinator.Code || code == kerr.CoordinatorNotAvailable.Code
	})
	return moved
}
