// Package upstream is Ferry's side towards the physical Kafka clusters.
// A Cluster is one of them: a franz-go client for Ferry's own control
// requests (metadata, coordinator lookups), the metadata snapshot routing
// reads, the coordinator cache, and a Pool per broker and identity of raw,
// pipelined connections (Conn) that carry client requests as bytes. A
// request sent on a Conn is a Pending answer, read whole or, for a large
// Fetch, Streamed to the client.
//
// The memory budget lives here too (Budget, ConnMem): every request frame
// and every answer read whole is charged to the client connection it is
// for, and the charge travels with the pooled buffer (FramePool), so that
// returning a buffer anywhere releases it.
package upstream
