// Package protocol is Ferry's view of the Kafka wire: size-prefixed frames,
// request and response headers, the ApiVersions intersection and a zero-copy
// view of RecordBatch headers. It knows kmsg and nothing of Ferry.
package protocol
