// Package errorresp builds the answer a Kafka broker gives when it refuses
// a request as a whole: everything the request names (topics and
// partitions, groups, transactional IDs, resources, ACL filters, quota
// entities, users) carries the error, with the request's keys copied into
// the answer's elements and everything else at kmsg's defaults (offsets
// -1 and the like). Ferry answers this way in a broker's place when the
// broker cannot be reached, and when it refuses a request itself.
//
// The code per request is generated from kmsg's types (answer_gen.go, by
// internal/errorrespgen): after a franz-go upgrade, `go generate
// ./protocol/errorresp` writes it again, and errorrespgen's test fails
// until it has been.
package errorresp

import "github.com/twmb/franz-go/pkg/kmsg"

//go:generate go run ./internal/errorrespgen

// For is the answer refusing kr as a whole with code and, when not empty,
// msg; nil for a request kmsg gained after answer_gen.go was written.
func For(kr kmsg.Request, code int16, msg string) kmsg.Response {
	var m *string
	if msg != "" {
		m = &msg
	}
	return answer(kr, code, m)
}
