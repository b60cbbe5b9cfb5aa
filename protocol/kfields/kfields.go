// Package kfields hands the fields of decoded kmsg requests and responses
// that carry an identity (topic ID, producer ID, leader epoch) or an error
// code to typed visitors: how the APIs that carry them in many shapes are
// read and rewritten without a hand-written walk per message.
//
// The walk per message is generated from kmsg's types (visit_gen.go, by
// internal/kfieldsgen): after a franz-go upgrade, `go generate
// ./protocol/kfields` writes it again, and kfieldsgen's test fails until
// it has been. Fields are matched by name and type; a field kmsg renames
// stops being visited only through a regenerated file, whose diff shows it.
package kfields

//go:generate go run ./internal/kfieldsgen

// Message is a kmsg request or response.
type Message interface {
	Key() int16
	GetVersion() int16
}

// Visitor is given a pointer to every field of its kinds, to read or set;
// a nil function skips its kind.
type Visitor struct {
	// TopicID fields ([16]byte).
	TopicID func(*[16]byte)
	// ProducerID fields (int64).
	ProducerID func(*int64)
	// LeaderEpoch and CurrentLeaderEpoch fields (int32).
	LeaderEpoch func(*int32)
	// ErrorCode fields (int16), top-level and nested.
	ErrorCode func(*int16)
}

// ErrorCodes calls f with every ErrorCode field of msg, top-level and
// nested.
func ErrorCodes(msg Message, f func(int16)) {
	Visit(msg, &Visitor{ErrorCode: func(c *int16) { f(*c) }})
}
